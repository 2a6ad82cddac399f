"""bench/exact_calls.py's timing under Triton's interpreter: each outermost exact library call is
one group, labelled by its operands' shapes and strides, holding the Triton kernels it
launched; a call inside another adds nothing of its own. (The whole command runs in
tests/bench/test_bench_smoke.py, on the tiniest model: an interpreted gpt-tiny step is slow.)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import exact_calls  # noqa: E402

pytestmark = pytest.mark.usefixtures("interpreted")  # tests/cuda/conftest.py


@pytest.fixture
def on_device_paths():
    from sexpgpu.exact import implementations

    with implementations.device_paths():
        yield


def test_each_exact_call_is_a_group_with_its_kernels(on_device_paths, capsys, monkeypatch):
    import sexpgpu.exact as exact
    from sexpgpu.exact import residue_stage

    monkeypatch.setattr(residue_stage, "MIN_K", 1)  # the residue stage at this small shape too
    monkeypatch.setattr(residue_stage, "MIN_ROWS", 1)

    generator = torch.Generator().manual_seed(3)
    x, w = torch.randn(4, 40, generator=generator), torch.randn(5, 40, generator=generator)
    with exact_calls.timing() as times:
        exact.det_gemm(x, w, non_blocking=True)
        exact.det_gemm(x, w.T.contiguous().T, non_blocking=True)  # the same shape, transposed strides
        exact.det_sum(x, 1)
    labels = sorted(times.groups)
    assert labels == ["det_gemm((4, 40), (5, 40)) strides ((40, 1), (1, 5))",
                      "det_gemm((4, 40), (5, 40)) strides ((40, 1), (40, 1))",
                      "det_sum((4, 40)) strides ((40, 1))"]
    product = times.groups["det_gemm((4, 40), (5, 40)) strides ((40, 1), (40, 1))"]
    assert product.calls == 1 and product.seconds > 0
    assert {"_residues", "_residue_products", "_reconstruct", "_list_pending", "_pair_refine",
            "_exact_refine"} <= set(product.kernels)
    assert sum(product.kernels.values()) <= product.seconds
    assert "_row_sums" in times.groups["det_sum((4, 40)) strides ((40, 1))"].kernels
    exact_calls.report(times, rows=2)
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 3 and "ms in exact calls" in printed[0] and "_residue" in "".join(printed[1:])


def test_bad_arguments_exit_with_status_2(capsys):
    for argv, said in ((["--rows", "0"], "--rows must be at least 1"), (["--model", "gpt-1b"], "invalid choice")):
        with pytest.raises(SystemExit) as stopped:
            exact_calls.main(argv)
        assert stopped.value.code == 2 and said in capsys.readouterr().err

