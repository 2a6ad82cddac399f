"""Bad arguments raise TypeError or ValueError naming the function and what was expected."""

import pytest
import torch

from sexpgpu.exact import (
    Accumulator,
    DetLinear,
    implementations,
    det_all_reduce,
    det_combine,
    det_finalize,
    det_gemm,
    det_gemm_partial,
    det_sum,
)


@pytest.mark.parametrize(
    "x, w, error, words",
    [
        (torch.ones(2, 3, dtype=torch.float16), torch.ones(2, 3, dtype=torch.float16), TypeError, "float16"),
        (torch.ones(2, 3, dtype=torch.float64), torch.ones(2, 3, dtype=torch.float64), TypeError, "torch.float32"),
        (torch.ones(2, 3, dtype=torch.int32), torch.ones(2, 3, dtype=torch.int32), TypeError, "int32"),
        (torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bfloat16), TypeError, "must be the same"),
        (torch.ones(2, 3), torch.ones(2, 4), ValueError, "their K differ"),
        (torch.ones(2, 3), torch.ones(3), ValueError, "(N, K)"),
        (torch.ones(2, 3, 1), torch.ones(2, 3), ValueError, "(M, K)"),
        ([[1.0]], torch.ones(1, 1), TypeError, "torch.Tensor"),
        (torch.ones(2, 3), torch.ones(2, 3, device="meta"), ValueError, "same device"),
    ],
)
@pytest.mark.parametrize("fn", [det_gemm, det_gemm_partial])
def test_gemm_rejects_mismatched_operands(fn, x, w, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")) as raised:
        fn(x, w)
    assert fn.__name__ in str(raised.value)


def test_a_device_without_an_implementation_is_named():
    with pytest.raises(ValueError, match="no implementation runs on meta"):
        det_gemm(torch.ones(1, 1, device="meta"), torch.ones(1, 1, device="meta"))


def test_combine_rejects_other_shapes_devices_and_non_accumulators():
    a = det_gemm_partial(torch.ones(2, 3), torch.ones(4, 3))
    b = det_gemm_partial(torch.ones(3, 3), torch.ones(4, 3))
    with pytest.raises(ValueError, match="shape"):
        det_combine([a, b])
    with pytest.raises(ValueError, match="empty"):
        det_combine([])
    with pytest.raises(TypeError, match="list of Accumulators"):
        det_combine(a)
    with pytest.raises(TypeError, match="expected an Accumulator"):
        det_combine([a, torch.ones(2, 4)])
    moved = Accumulator(a.digits.to("meta"))
    with pytest.raises(ValueError, match="meta"):
        det_combine([a, moved])


def test_finalize_rejects_tensors_and_other_dtypes():
    with pytest.raises(TypeError, match="det_finalize: expected an Accumulator"):
        det_finalize(torch.ones(2))
    acc = det_gemm_partial(torch.ones(2, 3), torch.ones(4, 3))
    with pytest.raises(TypeError, match="float16"):
        det_finalize(acc, torch.float16)


def test_accumulator_rejects_malformed_planes():
    with pytest.raises(TypeError, match="int64"):
        Accumulator(torch.zeros(21, 2))
    with pytest.raises(ValueError, match="21 planes"):
        Accumulator(torch.zeros(5, 2, dtype=torch.int64))


def test_sum_rejects_bad_dims():
    with pytest.raises(ValueError, match="out of range"):
        det_sum(torch.ones(2, 3), 2)
    with pytest.raises(ValueError, match="0-d"):
        det_sum(torch.tensor(1.0), 0)
    with pytest.raises(TypeError, match="dim must be an int"):
        det_sum(torch.ones(2, 3), (0, 1))


def test_all_reduce_needs_an_initialised_group():
    acc = det_gemm_partial(torch.ones(2, 3), torch.ones(4, 3))
    with pytest.raises(RuntimeError, match="not initialised"):
        det_all_reduce(acc)


def test_det_linear_rejects_wrong_inputs():
    layer = DetLinear(3, 2)
    with pytest.raises(ValueError, match="last dimension 3"):
        layer(torch.ones(4, 5))
    with pytest.raises(TypeError, match="bfloat16"):
        layer(torch.ones(4, 3, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="float64"):
        DetLinear(3, 2, dtype=torch.float64)


def test_unknown_backend_lists_the_known_ones():
    with pytest.raises(ValueError, match="bins, fp64, int8, sliced, triton"):
        with implementations.forced("tensorcore"):
            pass
