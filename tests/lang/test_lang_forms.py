"""Valid experiment files: every default filled in, references resolved, runs selected."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from sexpgpu.errors import Location, SexpgpuError
from sexpgpu.lang.experiment import CheckpointSpec, InitSpec, OptimizerSpec, PassSpec, ScheduleSpec
from sexpgpu.lang.forms import load_experiment, parse_experiment, select_run
from sexpgpu.lang.initializers import read_initializer
from sexpgpu.lang.reader import read_text
from sexpgpu.lang.salts import read_salt

MLP = """(defgraph mlp (x) :hidden 32 :classes 3 :bias true :scale 0.5 :note "n"
  (let h (relu (linear x :out hidden :as fc1)))
  (linear h :out classes :as head))
"""

MINIMAL = """(defrun tiny
  :seed 1
  :data (text pydoc :context 8)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (sgd :lr 0.1)
  :batch 4
  :steps 10)
"""


def write(tmp_path: Path, text: str, name: str = "exp.sexp") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def load_text(tmp_path: Path, text: str, selection: str | None = None):
    return load_experiment(write(tmp_path, text), selection)


def run_with(tmp_path, **keywords):
    """MINIMAL with keywords replaced or added, e.g. optimizer='(adam :lr 1)'."""
    lines = [line for line in MINIMAL.splitlines()[1:] if line.split()[0][1:] not in keywords]
    lines[-1] = lines[-1].rstrip(")")
    lines += [f"  :{key} {value}" for key, value in keywords.items()]
    return load_text(tmp_path, MLP + "(defrun tiny\n" + "\n".join(lines) + ")\n").run


def test_defaults_are_filled(tmp_path):
    run = load_text(tmp_path, MLP + MINIMAL).run
    assert (run.name, run.seed, run.batch, run.steps, run.microbatches) == ("tiny", 1, 4, 10, 1)
    assert run.schedule.kind == "constant" and run.passes == () and run.checkpoint is None
    assert run.optimizer.kind == "sgd" and run.optimizer.lr == 0.1 and run.optimizer.clip == math.inf
    assert run.data.kind == "text" and run.data.corpus == "pydoc" and run.data.context == 8
    assert run.loss.kind == "cross-entropy" and run.loss.fields == ("y",) and run.loss.graph is None
    assert run.model.name == "mlp" and run.model.args == ("x",)
    assert run.model.options == {"hidden": 32, "classes": 3, "bias": True, "scale": 0.5, "note": "n"}


def test_call_options_override_defaults_in_definition_order(tmp_path):
    run = run_with(tmp_path, model='(mlp x :note "m" :classes 5 :bias false :scale 2)')
    assert list(run.model.options.items()) == [("hidden", 32), ("classes", 5), ("bias", False), ("scale", 2.0),
                                               ("note", "m")]
    assert isinstance(run.model.options["scale"], float)


@pytest.mark.parametrize("text, expected", [
    ("(sgd :lr 1)", dict(kind="sgd", lr=1.0)),
    ("(momentum :lr 0.1)", dict(kind="momentum", lr=0.1, momentum=0.9, nesterov=False)),
    ("(momentum :lr 0.1 :momentum 0 :nesterov true :clip 2)",
     dict(kind="momentum", lr=0.1, momentum=0.0, nesterov=True, clip=2.0)),
    ("(adam :lr 1e-3)", dict(kind="adam", lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, clip=math.inf)),
    ("(adam :lr 1e-3 :beta1 0 :beta2 0.95 :eps 1e-6 :clip inf)",
     dict(kind="adam", lr=1e-3, beta1=0.0, beta2=0.95, eps=1e-6, clip=math.inf)),
    ("(adamw :lr 3e-4)", dict(kind="adamw", lr=3e-4, weight_decay=0.01, beta1=0.9, beta2=0.999)),
    ("(adamw :lr 3e-4 :weight-decay 0 :clip 1.0)", dict(kind="adamw", lr=3e-4, weight_decay=0.0, clip=1.0)),
])
def test_optimizers(tmp_path, text, expected):
    optimizer = run_with(tmp_path, optimizer=text).optimizer
    assert isinstance(optimizer, OptimizerSpec)
    for name, value in expected.items():
        assert getattr(optimizer, name) == value, name


@pytest.mark.parametrize("text, expected", [
    ("constant", ScheduleSpec("constant")),
    ("(constant)", ScheduleSpec("constant")),
    ("(warmup :steps 3)", ScheduleSpec("warmup", warmup=3)),
    ("(cosine)", ScheduleSpec("cosine", warmup=0, min_lr=0.0)),
    ("(cosine :warmup 2 :min-lr 0.01)", ScheduleSpec("cosine", warmup=2, min_lr=0.01)),
])
def test_schedules(tmp_path, text, expected):
    schedule = run_with(tmp_path, schedule=text).schedule
    assert (schedule.kind, schedule.warmup, schedule.min_lr) == (expected.kind, expected.warmup, expected.min_lr)


def test_passes_and_checkpoints(tmp_path):
    run = run_with(tmp_path, passes='((eval :every 5) (eval :every 2 :batches 3 :name val '
                                     ':data (text pydoc :context 8)))',
                   checkpoint='(every 5 :keep 2 :to "s3://bucket/prefix")')
    first, second = run.passes
    assert (first.kind, first.every, first.batches, first.data, first.name) == ("eval", 5, 1, None, None)
    assert (second.every, second.batches, second.name, second.data.kind) == (2, 3, "val", "text")
    assert isinstance(first, PassSpec)
    assert run.checkpoint == CheckpointSpec(5, 2, "s3://bucket/prefix", run.checkpoint.loc)
    assert run_with(tmp_path, checkpoint="7").checkpoint.every == 7
    assert run_with(tmp_path, checkpoint="(every 3)").checkpoint.keep is None


def test_relative_paths_are_joined_to_the_files_folder(tmp_path):
    sub = tmp_path / "sub"
    sub.mkdir()
    text = MLP + MINIMAL.replace("(text pydoc :context 8)", '(records "data/points.npz" :shuffle true)')
    text = text.replace(":steps 10)", ':steps 10 :checkpoint (every 5 :to "ckpt"))')
    run = load_experiment(write(sub, text)).run
    assert run.data.path == os.path.join(str(sub), "data", "points.npz") and run.data.shuffle is True
    assert run.checkpoint.to == os.path.join(str(sub), "ckpt")
    absolute = str(tmp_path / "abs.npz")
    assert run_with(tmp_path, data=f'(records "{absolute}")').data.path == absolute


def test_loss_graph_takes_the_model_output_first(tmp_path):
    text = MLP + "(defgraph weighted (out y) :weight 2.0\n  (mul weight (cross-entropy out y)))\n"
    run = load_text(tmp_path, text + MINIMAL.replace("(cross-entropy y)", "(weighted y :weight 3)")).run
    assert run.loss.kind == "graph" and run.loss.fields == ("y",)
    assert run.loss.graph.name == "weighted" and run.loss.graph.options == {"weight": 3.0}


GENERATOR = """(defgenerator teacher :width 4
  (let w (normal (width 1)))
  (let x (normal (batch width) :salt (:step :trip)))
  (record :x x :y (matmul x w)))
"""


def test_generators(tmp_path):
    text = GENERATOR + MLP + MINIMAL.replace("(text pydoc :context 8)", "(generator teacher :width 6)")
    experiment = load_text(tmp_path, text.replace("(cross-entropy y)", "(mse y)"))
    teacher = experiment.graphs["teacher"]
    assert teacher.is_generator and teacher.kind == "defgenerator" and teacher.inputs == ()
    assert teacher.record_fields == ("x", "y") and teacher.options == {"width": 4}
    assert teacher.option_locs["width"].line == 1 and len(teacher.body) == 3
    data = experiment.run.data
    assert data.kind == "generator" and data.generator.name == "teacher" and data.generator.options == {"width": 6}


def test_graph_definition_keeps_its_body_as_located_syntax(tmp_path):
    path = write(tmp_path, MLP + MINIMAL)
    mlp = load_experiment(path).graphs["mlp"]
    assert mlp.inputs == ("x",) and mlp.loc == Location(path, 1, 1) and not mlp.is_generator
    assert [form.loc.line for form in mlp.body] == [2, 3]
    assert mlp.body[0].head == "let" and mlp.body[1].head == "linear"


def test_definitions_may_come_in_any_order(tmp_path):
    experiment = load_text(tmp_path, MINIMAL + MLP)
    assert experiment.run.model.name == "mlp"


def test_several_runs_and_selection(tmp_path):
    text = MLP + MINIMAL + MINIMAL.replace("defrun tiny", "defrun longer").replace(":steps 10", ":steps 99")
    path = write(tmp_path, text)
    assert load_experiment(path, "longer").run.steps == 99
    assert load_experiment(path, "tiny").run.steps == 10
    parsed = parse_experiment(read_text(text, path), path, "sha")
    assert list(parsed.runs) == ["tiny", "longer"] and parsed.selected is None
    assert select_run(parsed, "longer").selected == "longer"
    for selection, code in ((None, "E-SELECT-002"), ("short", "E-SELECT-001")):
        with pytest.raises(SexpgpuError) as caught:
            load_experiment(path, selection)
        assert caught.value.code == code and "tiny, longer" in caught.value.render()


def test_one_run_is_selected_without_naming_it(tmp_path):
    experiment = load_text(tmp_path, MLP + MINIMAL)
    assert experiment.selected == "tiny" and experiment.run is experiment.runs["tiny"]
    assert load_text(tmp_path, MLP + MINIMAL, "tiny").selected == "tiny"


def test_every_run_is_checked_not_only_the_selected_one(tmp_path):
    broken = MINIMAL.replace("defrun tiny", "defrun broken").replace(":steps 10", ":steps 0")
    with pytest.raises(SexpgpuError) as caught:
        load_text(tmp_path, MLP + MINIMAL + broken, "tiny")
    assert caught.value.code == "E-FORM-011"


def test_source_digest_and_path_objects(tmp_path):
    import hashlib

    path = write(tmp_path, MLP + MINIMAL)
    experiment = load_experiment(Path(path))
    assert experiment.path == path
    assert experiment.source_sha256 == hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_numbers_at_the_edges_of_their_ranges(tmp_path):
    assert run_with(tmp_path, seed=str(2**64 - 1)).seed == 2**64 - 1
    assert run_with(tmp_path, seed="0").seed == 0
    assert run_with(tmp_path, optimizer="(adam :lr 1 :beta1 0 :beta2 0.999999)").optimizer.beta2 == 0.999999


@pytest.mark.parametrize("text, kind, args", [
    ("zeros", "zeros", {}),
    ("(ones)", "ones", {}),
    ("(normal)", "normal", {"mean": 0.0, "std": 1.0}),
    ("(normal :std 0.02)", "normal", {"mean": 0.0, "std": 0.02}),
    ("(uniform :low -1 :high 1)", "uniform", {"low": -1.0, "high": 1.0}),
    ("(truncated-normal :std 0.5)", "truncated-normal", {"mean": 0.0, "std": 0.5, "bound": 2.0}),
    ("glorot-uniform", "glorot-uniform", {}),
    ("(glorot-normal)", "glorot-normal", {}),
    ("(he-uniform)", "he-uniform", {}),
    ("he-normal", "he-normal", {}),
    ("(small-init)", "small-init", {}),
])
def test_initializers(text, kind, args):
    spec = read_initializer(read_text(text, "t.sexp")[0])
    assert isinstance(spec, InitSpec) and spec.kind == kind and spec.args == args
    assert spec.loc == Location("t.sexp", 1, 1)


@pytest.mark.parametrize("text, parts", [
    (":step", ("step",)),
    (":microbatch", ("microbatch",)),
    ("(:step)", ("step",)),
    ("(field id)", ("field/id",)),
    ("(:step :trip (field id))", ("step", "trip", "field/id")),
])
def test_salts(text, parts):
    assert read_salt(read_text(text, "t.sexp")[0]) == parts


def test_bodies_may_use_every_documented_expression(tmp_path):
    text = """(defgraph block (x) :width 8 :heads 2
  (let a (attention (layernorm x :as ln1 :eps 1e-5) :heads heads :as attn :causal true))
  (let d (dropout a :p 0.1 :salt (:step :microbatch)))
  (let w (param scale (width) :init (truncated-normal :std 0.02) :dtype bf16))
  (let v (param pinned (width width) :load "w.safetensors" :tensor "model.w"))
  (let s (slice (concat d d :axis -1) :axis -1 :start 0 :stop width))
  (add (mul s (cast w f32)) (matmul (reshape s (-1 width)) (transpose v (1 0)))))
(defgraph net (x) :layers 2
  (let h (repeat layers block (embedding x :vocab 256 :dim 8 :as embed) :as block :width 8))
  (linear (sum (softmax h :axis -1) :axis (1) :keep false) :out 256 :as head :bias false
          :init (normal :std 0.02)))
"""
    run = load_text(tmp_path, text + MINIMAL.replace("(mlp x)", "(net x)")).run
    assert run.model.options == {"layers": 2}


def test_the_examples_pass_the_forms_stage():
    examples = Path(__file__).resolve().parents[2] / "examples"
    files = sorted(examples.glob("*.sexp"))
    if not files:
        pytest.skip("no examples in this checkout")
    for path in files:
        experiment = load_experiment(str(path))
        assert experiment.run.steps >= 1


def test_a_graph_may_have_options_named_like_op_keywords(tmp_path):
    text = """(defgraph noisy (x) :init 0.5 :salt 3 :p 2
  (mul x (add init (add salt p))))
(defgraph net (x)
  (noisy x :as n :init 0.25 :salt 4 :p 7))
"""
    run = load_text(tmp_path, text + MINIMAL.replace("(mlp x)", "(net x)")).run
    assert run.model.name == "net"


def test_a_warmup_may_outlast_a_shortened_run(tmp_path):
    run = run_with(tmp_path, schedule="(cosine :warmup 10)", steps="3")
    assert run.schedule.warmup == 10 and run.steps == 3
