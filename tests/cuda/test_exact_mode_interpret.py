"""`:arithmetic exact` on the CUDA backend's lowering (backends/cuda/exact.py), run on the CPU by
Triton's interpreter, against the CPU interpreter: the same bits, not a tolerance.

Every op that sums, and those around the sums (maxima, pools, gathers, attention's
composition), with its gradient; the gradient region's accumulators; and steps of the three
examples through the run loop (tiny-adam stacked on the CUDA side, so the two backends also
group the microbatches differently), each step's loss, gradient norm and parameter digest
and the final parameters and optimizer state. tests/cuda/test_exact_mode_gpu.py repeats the
runs on the device, through the command line.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if torch.cuda.is_available():  # pragma: no cover - a GPU machine runs tests/cuda/test_exact_mode_gpu.py instead
    pytest.skip("a GPU is present: the GPU tests check exact runs there", allow_module_level=True)
pytest.importorskip("triton")

from op_cases import CASES, case_graph, case_id  # noqa: E402
from sexpgpu.backends.cpu import Interpreter  # noqa: E402
from sexpgpu.backends.cuda.backend import CudaBackend  # noqa: E402
from sexpgpu.backends.cuda.exact import EXACT  # noqa: E402
from sexpgpu.backends.exact_sums import PendingSum, accumulated, rounded_once  # noqa: E402
from sexpgpu.errors import SexpgpuError  # noqa: E402
from sexpgpu.exact import Accumulator, det_finalize  # noqa: E402
from sexpgpu.graph.core.emit import Emitter  # noqa: E402
from sexpgpu.graph.passes.exact_region import exact_graph  # noqa: E402
from sexpgpu.lang.forms import parse_experiment, select_run  # noqa: E402
from sexpgpu.lang.reader import read_text  # noqa: E402
from sexpgpu.run.choosing import stacked_training  # noqa: E402
from sexpgpu.run.loop import Stacking, Trainer  # noqa: E402
from sexpgpu.run.setup import build_run  # noqa: E402

pytestmark = pytest.mark.usefixtures("interpreted")  # tests/cuda/conftest.py

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CPU = Interpreter()
# each example cut to a few seconds a step under Triton's interpreter
RUNS = {
    "tiny-adam": ("tiny-adam.sexp", {":batch 64": ":batch 8 :microbatches 2 :arithmetic exact",
                                     ":passes ((eval :every 50 :batches 4))": ":passes ((eval :every 2 :batches 1))"}),
    "char-lm": ("char-lm.sexp", {":context 64 :width 64 :heads 4 :ff 256 :layers 2": ":context 4 :width 8 :heads 2 :ff 8 :layers 1",
                                 ":width 64 :heads 4 :ff 256": ":width 8 :heads 2 :ff 8",
                                 "(text pydoc :context 64)": "(text pydoc :context 4)",
                                 ":batch 16": ":batch 2 :arithmetic exact"}),
    "cnn": ("cnn.sexp", {":size 12": ":size 6", ":width 8 :wide 16": ":width 2 :wide 3", ":kernel 6": ":kernel 3",
                         ":batch 32": ":batch 2 :microbatches 2 :arithmetic exact"}),
}


class HostDigests(CudaBackend):
    """The exact CUDA backend with the step digest's fingerprints taken on the host: the device
    kernel gives the CPU's bits (test_fingerprint_interpret.py), and Triton's interpreter
    takes seconds for each."""

    def fingerprints(self, values: list) -> list[int]:
        return CPU.fingerprints([self.to_host(value) for value in values])


@pytest.fixture(scope="module")
def cuda():
    return HostDigests(device="cpu")


def bits(value) -> bytes:
    return np.ascontiguousarray(value).tobytes()


def assert_same_bits(backend, want: dict, got: dict) -> None:
    """Every output's bits; a gradient's sum both rounded by its fast path and as digits."""
    for name, value in want.items():
        found = got[name]
        if isinstance(value, Accumulator):
            assert bits(rounded_once(found)) == bits(det_finalize(value)), name
            assert torch.equal(accumulated(found).digits, value.digits), name
            continue
        assert bits(backend.to_host(found).astype(value.dtype)) == bits(value), name


# the ops whose exact lowering is not the float one's (elementwise ops lower alike in both)
@pytest.mark.parametrize("case", [case for case in CASES if case[0] in EXACT], ids=case_id)
def test_an_op_and_its_gradient_have_the_interpreters_bits(cuda, case):
    graph, values = exact_case(case)
    assert_same_bits(cuda, CPU.run(graph, values), cuda.run(graph, values))


def region_graph():
    """A parameter used twice and one that is not used: its gradients go through every node
    a gradient region holds (a product, a sum, an add, a transpose, a zero constant)."""
    e = Emitter()
    x, w, b, unused = e.input("x", "f32", (5, 3)), e.input("w", "f32", (3, 4)), e.input("b", "f32", (4,)), \
        e.input("u", "f32", (2,))
    y = e("add", e("matmul", x, w), b)
    g = e.input("g", "f32", (5, 4))
    grad_w = e("add", e("matmul", e("transpose", x, perm=(1, 0)), g),
               e("transpose", e("matmul", e("transpose", g, perm=(1, 0)), x), perm=(1, 0)))
    zero = e("const", value=0.0, dtype="f32", shape=(2,))
    outputs = {"y": y, "grad/w": grad_w, "grad/b": e("sum", g, axes=(0,)), "grad/u": zero}
    rng = np.random.default_rng(3)
    values = {name: (rng.standard_normal(node.shape) * 2.0 ** rng.integers(-20, 20, node.shape)).astype(np.float32)
              for name, node in {"x": x, "w": w, "b": b, "u": unused, "g": g}.items()}
    return exact_graph(e.graph({"x": x, "w": w, "b": b, "u": unused, "g": g}, outputs)), values


def exact_case(*args, **options):
    """op_cases' graph of a case as an exact run computes it, and its values."""
    graph, values = case_graph(*args, **options)
    return exact_graph(graph), values


def test_the_gradient_region_returns_the_interpreters_sums(cuda):
    graph, values = region_graph()
    want, got = CPU.run(graph, values), cuda.run(graph, values)
    # an add forms its sums' digits; a sum over the batch alone stays pending
    assert isinstance(got["grad/w"], Accumulator) and isinstance(got["grad/u"], Accumulator)
    assert isinstance(got["grad/b"], PendingSum)
    assert_same_bits(cuda, want, got)


def test_a_pending_sum_is_formed_before_its_graph_runs_again(cuda):
    graph, values = region_graph()
    first = cuda.run(graph, values)["grad/b"]
    cuda.run(graph, {**values, "g": values["g"] * np.float32(-3)})  # the same memory, other values
    assert torch.equal(accumulated(first).digits, CPU.run(graph, values)["grad/b"].digits)


def test_a_pending_sum_over_the_graphs_own_buffers_is_fixed_and_signed_by_its_origin(cuda):
    """A sum pending over its operands as they lie (float32 buffers, no copy) is `fixed`: over a
    captured graph's buffers it reads the same memory every call, so the backend gives it an
    origin, and the gradients' rounding is captured (captured_sums.py) only for a set of sums
    that all have one and no formed digits."""
    from sexpgpu.backends.cuda.captured_sums import signature

    graph, values = region_graph()
    pending = cuda.run(graph, values)["grad/b"]
    assert isinstance(pending, PendingSum) and pending.fixed and pending.origin is None  # an eager call
    assert signature({"grad/b": pending}) is None
    pending.origin = ("graph", "grad/b")
    first = signature({"grad/b": pending})
    assert first == (("grad/b", ("graph", "grad/b")),)
    assert signature({"grad/b": pending, "grad/w": Accumulator(torch.zeros((21, 4, 3), dtype=torch.int64))}) is None
    moved = pending.moved(lambda acc: acc, lambda tensor: tensor.T)
    assert moved.fixed and moved.origin is None
    again = cuda.run(graph, values)["grad/b"]  # the next run forms the sums the last one left held
    again.origin = ("graph", "grad/b")
    assert signature({"grad/b": again}) == first
    assert signature({"grad/b": pending}) is None  # digits formed: the rounding reads them, not the operands


def test_an_id_out_of_range_is_the_interpreters_error(cuda):
    graph, values = exact_case(("scatter_add", [("i32", (6,), "labels:4"), ("f32", (6, 3), "normal")], {"rows": 4}),
                               differentiate=False)
    values["x0"] = np.array([0, 1, 2, 3, 4, 0], np.int32)
    for backend in (CPU, cuda):
        with pytest.raises(SexpgpuError) as refused:
            backend.run(graph, values)
        assert refused.value.code == "E-INDEX-001" and "embedding id 4 is outside 0..3" in refused.value.message


def test_a_bf16_attention_op_is_refused_as_by_the_interpreter(cuda):
    graph, values = exact_case(("attention_core", [("bf16", (2, 4, 3), "normal")] * 3, {"scale": 0.5, "causal": True}),
                               differentiate=False)
    for backend in (CPU, cuda):
        with pytest.raises(SexpgpuError) as refused:
            backend.run(graph, values)
        assert refused.value.code == "E-EXACT-003" and "attention_core" in refused.value.message


def experiment(name: str):
    file, edits = RUNS[name]
    text = (EXAMPLES / file).read_text().replace('"data/', f'"{EXAMPLES}/data/')
    for old, new in edits.items():
        assert old in text, old
        text = text.replace(old, new)
    return select_run(parse_experiment(read_text(text, file), str(EXAMPLES / file), ""), None)


def steps_on(chosen, backend, steps: int, degree: int = 1) -> tuple:
    """(step and pass records, final parameters and optimizer state as bytes) on `backend`."""
    built = build_run(chosen, "cpu")
    built.backend = built.feeder.backend = backend
    trainer = Trainer(chosen.run, built.program, backend, built.feeder,
                      Stacking(stacked_training(built.program, degree), degree))
    state = built.initial_state()
    records = []
    for _ in range(steps):
        records.append(trainer.step(state))
        records += [trainer.evaluate(state, spec, built.pass_name(spec)) for spec in chosen.run.passes
                    if state.step % spec.every == 0]
    return records, {name: bits(backend.to_host(value)) for name, value in {**state.params, **state.optimizer}.items()}


@pytest.mark.parametrize("name, steps, degree", [("tiny-adam", 2, 2), ("char-lm", 1, 1), ("cnn", 1, 1)])
def test_an_examples_steps_have_the_interpreters_bits(cuda, name, steps, degree):
    chosen = experiment(name)
    assert steps_on(chosen, cuda, steps, degree) == steps_on(chosen, Interpreter(), steps)


def exact_file(tmp_path: Path, name: str, more: dict) -> Path:
    file, edits = RUNS[name]
    text = (EXAMPLES / file).read_text().replace('"data/', f'"{EXAMPLES}/data/')
    for old, new in {**edits, **more}.items():
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / file
    path.write_text(text)
    return path


def on_the_cuda_backend(device, gpu=None):
    """select_backend's answer for --device cuda, with the CUDA backend on CPU tensors."""
    backend = HostDigests(device="cpu")
    return backend, {"kind": "cuda", **backend.facts()}


def run_files(run_dir: Path) -> tuple:
    """(metrics.jsonl, the last checkpoint's tensors, the recorded stacking) of a run directory."""
    import json

    last = max(run_dir.glob("step-*"), key=lambda path: int(path.name.split("-")[1]))
    tensors = {name: (last / name).read_bytes() for name in ("model.safetensors", "optimizer.safetensors")}
    stacking = json.loads((last / "experiment.json").read_text())["choices"]["stacking"]
    return (run_dir / "metrics.jsonl").read_bytes(), tensors, stacking


def test_an_exact_run_stacks_on_the_cuda_backend_with_the_cpu_runs_bytes(tmp_path, monkeypatch, capsys):
    """tiny-adam's two microbatches: one by one on the CPU interpreter; in one call on the CUDA
    backend, which stacks an exact run's microbatches (plan/choices.py's exact_stacking); and one
    by one there too, its stacking held at 1. metrics.jsonl and the last checkpoint (model and
    optimizer) are the same bytes in all three."""
    import sexpgpu.run.choosing as choosing
    import sexpgpu.run.setup as setup
    from sexpgpu.cli.main import main

    path = exact_file(tmp_path, "tiny-adam", {":steps 200": ":steps 2", ":checkpoint 100": ":checkpoint 2"})
    assert main(["run", str(path), "--device", "cpu", "--run-dir", str(tmp_path / "cpu")]) == 0
    with monkeypatch.context() as patched:
        patched.setattr(setup, "select_backend", on_the_cuda_backend)
        assert main(["run", str(path), "--run-dir", str(tmp_path / "stacked")]) == 0
        assert "stacking 2: a step's microbatches in one call" in capsys.readouterr().out
        patched.setattr(choosing, "exact_stacking", lambda microbatches, stackable: 1)
        assert main(["run", str(path), "--run-dir", str(tmp_path / "unstacked")]) == 0
    cpu, stacked, unstacked = (run_files(tmp_path / name) for name in ("cpu", "stacked", "unstacked"))
    assert (cpu[2], stacked[2], unstacked[2]) == (1, 2, 1)
    assert cpu[:2] == stacked[:2] == unstacked[:2]


def test_the_benchmark_refuses_an_unknown_model_and_a_machine_without_a_gpu(tmp_path, capsys):
    import sys

    from sexpgpu.cli.main import main

    sys.path.insert(0, str(EXAMPLES.parent / "bench"))
    import bench_exact_mode

    for argv, said in ((["--model", "gpt-1b"], "invalid choice: 'gpt-1b'"), ([], "this benchmark runs on a GPU")):
        with pytest.raises(SystemExit) as stopped:
            bench_exact_mode.main(argv)
        assert stopped.value.code == 2 and said in capsys.readouterr().err
    # the smaller model compiles with exact gradients (E-EXACT-002 would stop it here)
    text = bench_exact_mode.MODELS["gpt-small"].read_text().replace(":batch 16", ":batch 16 :arithmetic exact")
    (tmp_path / "gpt-small.sexp").write_text(text)
    assert main(["check", str(tmp_path / "gpt-small.sexp")]) == 0


def test_a_product_is_written_into_its_buffer_unless_the_buffer_meets_an_operand():
    """exact_ops.rounded_product with out: the queued path writes the rounded product straight
    into a contiguous float32 buffer apart from the operands (no copy after), with the bits
    it returns without out; a buffer overlapping an operand is left alone."""
    from sexpgpu.backends import exact_ops
    from sexpgpu.exact import implementations

    generator = torch.Generator().manual_seed(4)
    a, b = torch.randn((2, 5, 7), generator=generator), torch.randn((7, 3), generator=generator)
    batched = torch.randn((2, 7, 3), generator=generator)
    with implementations.device_paths():
        for right in (b, batched):
            expected = exact_ops.rounded_product(a, right, (2, 5, 3), "f32")
            out = torch.full((2, 5, 3), 7.0)
            found = exact_ops.rounded_product(a, right, (2, 5, 3), "f32", out=out)
            assert found.data_ptr() == out.data_ptr() and torch.equal(out, expected)
        arena = torch.zeros(200)
        left = arena[:70].view(2, 5, 7)
        left.copy_(a)
        overlapping = arena[60:90].view(2, 5, 3)  # meets the left operand's last elements
        found = exact_ops.rounded_product(left, b, (2, 5, 3), "f32", out=overlapping)
        assert found.data_ptr() != overlapping.data_ptr() and torch.equal(left, a)
        assert torch.equal(found, exact_ops.rounded_product(a, b, (2, 5, 3), "f32"))
        assert exact_ops.rounded_product(a, b, (2, 5, 3), "bf16", out=torch.empty(2, 5, 3)).dtype == torch.bfloat16
    out = torch.empty(2, 5, 3)  # the CPU's own path (no queued path) leaves it alone
    assert exact_ops.rounded_product(a, b, (2, 5, 3), "f32", out=out).data_ptr() != out.data_ptr()


@pytest.mark.parametrize("axes, keep", [((2,), True), ((-1,), False), ((1, 2), False), ((0,), True), ((0, 2), False)])
def test_one_pass_maxima_have_the_interpreters_bits(axes, keep):
    """backends/cuda/exact_maxima.py against cpu/folds.reduce_max, bit for bit: rows of ordinary
    values, of zeros of both signs, of -0 alone, of negative values and -0, with a NaN, of -inf;
    trailing axes take the one-pass kernel, others exact_ops.maxima."""
    from sexpgpu.backends.cpu.folds import reduce_max
    from sexpgpu.backends.cuda import exact_maxima

    generator = torch.Generator().manual_seed(12)
    x = torch.randn((3, 6, 150), generator=generator)
    x[0, 1] = -0.0
    x[0, 2] = torch.where(torch.arange(150) % 2 == 0, -0.0, 0.0)
    x[0, 3] = -x[0, 3].abs()
    x[0, 3, 7] = -0.0
    x[1, 0, 9] = float("nan")
    x[1, 1] = float("-inf")
    x[2, 4, 149] = 1e30
    found = exact_maxima.maxima(x, axes, keep)
    expected = torch.from_numpy(np.asarray(reduce_max(x.numpy(), tuple(a % 3 for a in axes), keep)))
    assert found.shape == expected.shape
    assert torch.equal(found.view(torch.int32), expected.view(torch.int32))


def test_one_pass_maxima_leave_strided_rows_to_the_two_pass_rule():
    from sexpgpu.backends.cuda import exact_maxima

    x = torch.randn((40, 8)).T  # rows a column apart: not viewable as contiguous rows
    assert exact_maxima._rows(x, 40) is None
    assert torch.equal(exact_maxima.maxima(x, (1,)), x.amax(1))


def test_the_gradients_rounding_is_captured_at_the_second_call_of_one_signature(monkeypatch):
    """captured_sums.CapturedSums's bookkeeping (the capture itself needs a GPU, so a stand-in
    records it here): the first rounding of a signature is eager, the second captures and
    replays, later ones replay, each giving copies; sums with no origin are always eager, and
    a rounding refused at capture stays eager."""
    from sexpgpu.backends.cuda import captured_sums

    replays, captures = [], []

    class Recorded:
        def replay(self):
            replays.append(1)

    def captured(self, total):
        captures.append(sorted(total))
        return Recorded(), {name: value.rounded() for name, value in total.items()}

    monkeypatch.setattr(captured_sums.CapturedSums, "_captured", captured)
    sums = captured_sums.CapturedSums("cpu")

    def total(origin="graph"):
        value = PendingSum(lambda: None, lambda: torch.arange(3.0), fixed=True)
        value.origin = origin
        return {"grad/b": value}

    assert torch.equal(sums.rounded(total())["grad/b"], torch.arange(3.0)) and not captures
    second = sums.rounded(total())
    assert captures == [["grad/b"]] and len(replays) == 1 and sums.is_captured()
    third = sums.rounded(total())
    assert len(replays) == 2 and torch.equal(third["grad/b"], second["grad/b"])
    assert third["grad/b"].data_ptr() != second["grad/b"].data_ptr()  # copies of the graph's results
    sums.rounded(total(origin=None))
    sums.rounded(total(origin=None))
    assert len(captures) == 1 and len(replays) == 2
    monkeypatch.setattr(captured_sums.CapturedSums, "_captured", lambda self, total: captured_sums.EAGER)
    sums.release()
    assert not sums.is_captured()
    for _ in range(3):
        assert torch.equal(sums.rounded(total())["grad/b"], torch.arange(3.0))
    assert len(replays) == 2 and not sums.is_captured()
