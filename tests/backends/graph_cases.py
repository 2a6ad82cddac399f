"""A small transformer training step through every stage, for tests that need a real graph."""

from __future__ import annotations

import numpy as np

from sexpgpu.graph import compile_program
from sexpgpu.lang.forms import parse_experiment, select_run
from sexpgpu.lang.reader import read_text

TRANSFORMER = """
(defgraph block (x) :width 16 :heads 2
  (let a (add x (attention (layernorm x :as ln1) :heads heads :as attn)))
  (add a (linear (gelu (linear (layernorm a :as ln2) :out 32 :as up)) :out width :as down)))

(defgraph lm (x) :vocab 11 :width 16
  (let h0 (add (embedding x :vocab vocab :dim width :as embed) (param positions (8 width) :init (normal :std 0.02))))
  (let h (repeat 2 block (dropout h0 :p 0.1 :salt (:step :microbatch)) :as block :width width))
  (linear (layernorm h :as final) :out vocab :as head))

(defrun lm :seed 5 :data (text pydoc :context 8) :model (lm x) :loss (cross-entropy y)
  :optimizer (adamw :lr 0.01 :clip 1.0) :batch 3 :microbatches 2 :steps 2)
"""


def transformer_program():
    experiment = select_run(parse_experiment(read_text(TRANSFORMER, "lm.sexp"), "lm.sexp", ""), None)
    return experiment, compile_program(experiment)


def small_transformer_step(interpreter) -> dict:
    """Two microbatches, their gradients summed in order, and one AdamW update."""
    _, program = transformer_program()
    rng = np.random.default_rng(0)
    params = {path: (rng.standard_normal(spec.shape) * 0.3).astype(np.float32) for path, spec in program.params.items()}
    training = program.training
    grads = None
    outputs = {}
    for microbatch in range(2):
        tokens = rng.integers(0, 11, (3, 9)).astype(np.int32)
        feed = {f"param/{path}": value for path, value in params.items()}
        feed.update({"field/x": tokens[:, :-1], "field/y": tokens[:, 1:], "step": 1, "microbatch": microbatch})
        result = interpreter.run(training.micro, {name: feed[name] for name in training.micro.inputs})
        outputs[f"loss{microbatch}"] = result["loss"]
        step_grads = {name: value for name, value in result.items() if name.startswith("grad/")}
        grads = step_grads if grads is None else {name: grads[name] + step_grads[name] for name in grads}
    feed = {f"param/{path}": value for path, value in params.items()}
    feed.update(grads)
    feed.update({name: np.zeros(shape, np.float32) for name, shape in training.state_shapes().items()})
    feed.update({"step": 1, "lr": np.float32(0.01)})
    outputs.update(interpreter.run(training.update, feed))
    return outputs
