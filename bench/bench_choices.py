"""What the machine's choices cost and buy on one GPU (determinism.md, "What a run chooses").

    python bench/bench_choices.py [--steps N] [--models char-lm,gpt-50m] [--micro-batch quarter|file]

For char-lm and bench/gpt-50m.sexp, each with :microbatches 4 (by default each microbatch a
quarter of the file's :batch, so a step sees the file's batch), in one process:

- the step time unstacked (degree 1) and stacked at degrees 2 and 4, as ratios to unstacked;
- the cost of measuring: what the first step of a run without a remembered choice spends
  timing candidates through the CUDA probe (every stacking degree, every float32 product's
  implementations, the flops and bandwidth), in seconds and in steps;
- --deterministic (stacking 1, ordinary products, 9 flops a byte) against the default,
  whose choices this script makes from those measurements by the spec's rules (the fastest
  degree, a product implementation only when at least 1% faster than ordinary, the
  measured flops a byte), as a ratio of step times: the goal is within 5%.

It runs before plan/choices.py makes these decisions in a run, so it applies the rules itself.
A model that fails (out of memory, say) is reported and the next one runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

MODELS = {"char-lm": ROOT / "examples" / "char-lm.sexp", "gpt-50m": ROOT / "bench" / "gpt-50m.sexp"}
MICROBATCHES = 4
DEGREES = (1, 2, 4)
PRODUCT_GAIN = 0.01  # keep ordinary unless another implementation is at least this much faster


def experiment_of(path: Path, micro_batch: str):
    import re

    from sexpgpu.lang.forms import parse_experiment, select_run
    from sexpgpu.lang.reader import read_text

    text = path.read_text()
    batch = int(re.search(r":batch (\d+)", text).group(1))
    per_micro = max(1, batch // MICROBATCHES) if micro_batch == "quarter" else batch
    text = re.sub(r":batch \d+", f":batch {per_micro} :microbatches {MICROBATCHES}", text, count=1)
    return select_run(parse_experiment(read_text(text, str(path)), str(path), ""), None), per_micro


class Run:
    """A run's program on a CUDA backend with a given policy, stepped by the run loop."""

    def __init__(self, experiment, policy=None):
        from sexpgpu.backends.cuda.backend import CudaBackend
        from sexpgpu.run.setup import build_run

        self.experiment = experiment
        self.built = build_run(experiment, "cuda")
        if policy is not None:
            self.built.backend = CudaBackend(policy=policy)
            self.built.feeder.backend = self.built.backend
        self.backend = self.built.backend
        self.state = self.built.initial_state()

    def step_seconds(self, degree: int, steps: int, warmup: int) -> float:
        from sexpgpu.run.choosing import stacked_training
        from sexpgpu.run.loop import Stacking, Trainer

        stacking = Stacking(stacked_training(self.built.program, degree), degree)
        trainer = Trainer(self.experiment.run, self.built.program, self.backend, self.built.feeder, stacking)
        for _ in range(warmup):
            trainer.step(self.state)
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            trainer.step(self.state)  # returns the step's loss: it waits for the GPU
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    def microbatch_inputs(self) -> dict:
        import numpy as np

        values = {f"param/{path}": value for path, value in self.state.params.items()}
        values.update(self.built.feeder.train_batch(self.state.step + 1, 0))
        values.update({"step": np.int32(self.state.step + 1), "microbatch": np.int32(0)})
        return values


def measure(run: Run) -> dict:
    """What a first step measures, with its cost: {degree: s}, {shape: {implementation: s}}, throughput."""
    from sexpgpu.backends.cuda.probe import CudaProbe
    from sexpgpu.graph.stacking import stack_training, stacking_blockers

    probe = CudaProbe(run.backend)
    training = run.built.program.training
    start = time.perf_counter()
    degrees = DEGREES if not stacking_blockers(run.built.program) else (1,)
    fits = [degree for degree in degrees if probe.training_peak_bytes(training, degree) <= probe.free_memory_bytes()]
    inputs = run.microbatch_inputs()
    step_times = {degree: probe.time_training_step(training, degree, inputs) for degree in fits}
    shapes = {}
    for degree in fits:
        for graph in (stack_training(training, degree).micro, training.update):
            shapes.update(dict.fromkeys(probe.product_shapes(graph)))
    products = {shape: {name: probe.time_product(shape, name) for name in probe.product_implementations(shape)}
                for shape in shapes}
    throughput = probe.measure_throughput()
    return {"seconds": time.perf_counter() - start, "degrees": step_times, "products": products,
            "throughput": throughput, "fits": fits}


def chosen_policy(measured: dict):
    from sexpgpu.backends.cuda.fusion import FusionPolicy

    products = {}
    for shape, timings in measured["products"].items():
        best = min(timings, key=timings.get)
        if best != "ordinary" and timings[best] <= (1 - PRODUCT_GAIN) * timings["ordinary"]:
            products[shape.key()] = best
    return FusionPolicy("on", measured["throughput"].flops_per_byte, products)


def bench_model(name: str, path: Path, options) -> None:
    experiment, per_micro = experiment_of(path, options.micro_batch)
    print(f"\n{name}: :batch {per_micro} :microbatches {MICROBATCHES}")
    deterministic = Run(experiment)
    times = {}
    for degree in DEGREES:
        try:
            times[degree] = deterministic.step_seconds(degree, options.steps, options.warmup)
        except Exception as error:  # noqa: BLE001 - a degree that does not fit or stack is reported
            print(f"  stacking {degree}: {type(error).__name__}: {str(error).splitlines()[0]}")
    for degree, seconds in times.items():
        ratio = times[1] / seconds if 1 in times else float("nan")
        print(f"  stacking {degree}: {seconds * 1e3:8.2f} ms a step   unstacked/stacked {ratio:5.2f}")
    measured = measure(deterministic)
    step = times.get(1, float("nan"))
    print(f"  measuring at the first step: {measured['seconds']:.2f} s = {measured['seconds'] / step:.1f} unstacked steps "
          f"({len(measured['fits'])} degrees fit, {len(measured['products'])} product shapes)")
    for degree, seconds in measured["degrees"].items():
        print(f"    probe: stacking {degree}: {seconds * 1e3:.2f} ms of microbatch calls")
    for shape, timings in measured["products"].items():
        line = ", ".join(f"{implementation} {seconds * 1e6:.0f} us" for implementation, seconds in timings.items())
        print(f"    probe: {shape.key()}: {line}")
    rates = measured["throughput"]
    print(f"    probe: {rates.flops_per_second / 1e12:.1f} Tflop/s f32, {rates.bytes_per_second / 1e12:.2f} TB/s copy: "
          f"recompute budget {rates.flops_per_byte:.2f} flops a byte")
    policy = chosen_policy(measured)
    degree = min(measured["degrees"], key=measured["degrees"].get)
    chosen = Run(experiment, policy).step_seconds(degree, options.steps, options.warmup)
    print(f"  default (stacking {degree}, {len(policy.products)} products not ordinary, {policy.budget:.2f} flops a byte): "
          f"{chosen * 1e3:.2f} ms a step")
    print(f"  --deterministic (stacking 1, ordinary, 9.00): {step * 1e3:.2f} ms a step   deterministic/default "
          f"{step / chosen:5.2f} (goal at most 1.05)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--micro-batch", choices=("quarter", "file"), default="quarter",
                        help="each microbatch a quarter of the file's :batch (a step sees the file's batch), or all of it")
    options = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("bench_choices: no CUDA GPU here; it times the CUDA backend's choices and needs one")
        return
    print(f"bench_choices on {torch.cuda.get_device_name()}: {options.steps} timed steps after {options.warmup}")
    for name in options.models.split(","):
        try:
            bench_model(name, MODELS[name], options)
        except Exception:  # noqa: BLE001 - one model's failure must not hide the other's figures
            print(f"{name}: failed")
            traceback.print_exc()


if __name__ == "__main__":
    main()
