"""The CUDA code path, run by Triton's interpreter on CPU tensors: the same kernels and
jitted functions that the GPU compiles, checked bit for bit against the numpy path.

This is CI's check of the GPU code's logic; test_numerics_gpu.py runs the compiled kernels.
"""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from sexpgpu import numerics as nx  # noqa: E402
from sexpgpu.numerics import cpu, cuda  # noqa: E402
from sexpgpu.numerics.portable import hardcases  # noqa: E402
from sexpgpu.numerics.portable import erf, exp, log, pow, roots, trig  # noqa: E402

UNARY = {"exp": exp.exp_f32, "expm1": exp.expm1_f32, "log": log.log_f32,
         "log1p": log.log1p_f32, "tanh": exp.tanh_f32, "sigmoid": exp.sigmoid_f32,
         "erf": erf.erf_f32, "cos": trig.cos_f32, "sin": trig.sin_f32, "rsqrt": roots.rsqrt_f32}
KEY = nx.stream_key(1, "interpreter")
# the interpreter evaluates every lane in numpy, NaN and infinite ones included
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert cuda.interpreting()


def inputs(name, n=1500):
    rng = np.random.default_rng(len(name))
    random = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    moderate = (rng.uniform(-4, 4, n) * 2.0 ** rng.integers(-6, 6, n)).astype(np.float32)
    cases = np.array(sorted(hardcases.HARD_CASES[name]), dtype=np.uint32)
    special = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 1, 0x807FFFFF,
                        0x7F7FFFFF, 0x3F800000, 0xBF800000], dtype=np.uint32)
    # the edges and middles of erf's pieces (the top 12 bits of |x|), and beyond them
    tops = np.arange(0x3EE, 0x40A, dtype=np.uint32) << 20
    pieces = np.concatenate([tops, tops - 1, tops | 0x80000])
    return np.concatenate([random, moderate.view(np.uint32), cases, cases | np.uint32(1 << 31),
                           special, pieces, pieces | np.uint32(1 << 31)]).view(np.float32)


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_kernel_matches_numpy(name):
    x = inputs(name)
    got = cuda.unary(UNARY[name].__name__, torch.from_numpy(x.copy())).numpy()
    assert np.array_equal(got.view(np.uint32), cpu.elementwise(UNARY[name], x).view(np.uint32))


def test_pow_kernel_matches_numpy():
    x, y = inputs("exp"), inputs("log")[: len(inputs("exp"))]
    got = cuda.binary(pow.pow_f32.__name__, torch.from_numpy(x.copy()), torch.from_numpy(y.copy()))
    assert np.array_equal(got.numpy().view(np.uint32), cpu.elementwise(pow.pow_f32, x, y).view(np.uint32))


def test_philox_kernel_matches_numpy():
    rng = np.random.default_rng(9)
    counters = rng.integers(0, 2**32, (700, 4), dtype=np.uint64).astype(np.uint32)
    keys = rng.integers(0, 2**32, (700, 2), dtype=np.uint64).astype(np.uint32)
    got = cuda.philox(torch.from_numpy(counters.view(np.int32)), torch.from_numpy(keys.view(np.int32)))
    assert np.array_equal(got.numpy().view(np.uint32), cpu.philox4x32(counters, keys))


def _kernel_draw(kernel, shape, dtype, args):
    """The kernel's draw under KEY with the args words given here, not the spec's."""
    spec = nx.DrawSpec(kernel, None, 0, dtype, (), tuple(args))
    return cuda.draw(spec, shape, torch.device("cpu"), KEY.words)


def _bits(value):
    return int(np.float64(value).view(np.int64))


@pytest.mark.parametrize("shape", [(1000,), (3, 333), (1,)])
def test_draw_kernels_match_numpy(shape):
    n = math.prod(shape)
    low, high = -0.25, 1.5
    caps = [int(np.float32(low).view(np.uint32)), int(np.nextafter(np.float32(high), 0).view(np.uint32))]
    got = _kernel_draw("uniform_kernel", shape, np.float32, [_bits(low), _bits(high)] + caps)
    assert np.array_equal(got.numpy(), nx.uniform(KEY, shape, low, high))
    got = _kernel_draw("normal_kernel", shape, np.float32, [_bits(0.5), _bits(2.0)])
    assert np.array_equal(got.numpy(), nx.normal(KEY, shape, 0.5, 2.0))
    got = _kernel_draw("truncated_normal_kernel", shape, np.float32,
                       [_bits(0.0), _bits(1.0), _bits(1.5)])
    assert np.array_equal(got.numpy(), nx.truncated_normal(KEY, shape, bound=1.5))
    got = _kernel_draw("bernoulli_kernel", shape, np.bool_, [round(0.7 * 2**32)])
    assert np.array_equal(got.numpy(), nx.bernoulli(KEY, shape, 0.7))
    got = _kernel_draw("randint_kernel", shape, np.int32, [-5, 1000])
    assert np.array_equal(got.numpy(), nx.randint(KEY, shape, -5, 995))
    assert n == got.numel()


# --- draws a CUDA graph captures: keys folded on the device (device_draws.py) ----------------

DRAWS = [("uniform", {"low": -0.25, "high": 1.5}), ("normal", {"mean": 0.5, "std": 2.0}),
         ("truncated_normal", {"bound": 1.5}), ("bernoulli", {"p": 0.7}),
         ("randint", {"low": -5, "high": 995})]
TORCH_DTYPES = {np.float32: torch.float32, np.bool_: torch.bool, np.int32: torch.int32}


def _template(spec, key=KEY):
    return torch.tensor([nx.draw_args(key, spec)], dtype=torch.int64)


def _salt(value, dtype=torch.int32):
    return torch.tensor(value, dtype=dtype)


def _folded(key, values):
    for value in values:
        key = nx.fold_in(key, int(value))
    return key


@pytest.mark.parametrize("name, params", DRAWS, ids=[name for name, _ in DRAWS])
def test_draw_into_under_keys_folded_on_the_device_gives_the_numpy_bits(name, params):
    """fold_in on the device, of salts of either width and sign (int64 beyond 32 bits), then
    the draw: 0-d, odd and multi-block shapes, the same bits as the numpy draw."""
    spec = nx.draw_spec(name, **params)
    for values, dtype in (((), torch.int32), ((-3,), torch.int32), ((7, 2**40 + 5), torch.int64)):
        args = torch.empty_like(_template(spec))
        nx.fold_keys(_template(spec), [_salt(v, dtype) for v in values], args)
        for shape in ((), (7,), (3, 335)):
            out = torch.empty(shape, dtype=TORCH_DTYPES[spec.dtype])
            nx.draw_into(spec, out, args)
            assert np.array_equal(out.numpy(), nx.draw(name, _folded(KEY, values), shape, **params)), (values, shape)


@pytest.mark.parametrize("name, params", DRAWS, ids=[name for name, _ in DRAWS])
def test_rows_under_their_own_keys_and_repeated_copies(name, params):
    """Per-row salts (a strided vector between scalar salts, int32 extremes) give row r the
    draw of fold_in(key, value[r]); copies repeat one draw, as a stacked draw does."""
    spec = nx.draw_spec(name, **params)
    values = torch.tensor([[4, 0], [-1, 0], [2**31 - 1, 0], [-(2**31), 0], [9, 0]], dtype=torch.int32)[:, 0]
    rows = torch.empty((5, len(nx.draw_args(KEY, spec))), dtype=torch.int64)
    nx.fold_keys(_template(spec), [_salt(3), values, _salt(8)], rows)
    out = torch.empty((5, 3, 3), dtype=TORCH_DTYPES[spec.dtype])
    nx.draw_into(spec, out, rows, rows=5)
    for r in range(5):
        want = nx.draw(name, _folded(KEY, (3, values[r], 8)), (3, 3), **params)
        assert np.array_equal(out[r].numpy(), want), r
    repeated = torch.empty((3 * 5, 3), dtype=TORCH_DTYPES[spec.dtype])
    nx.draw_into(spec, repeated, _template(spec), copies=3)
    assert np.array_equal(repeated.numpy(), np.concatenate([nx.draw(name, KEY, (5, 3), **params)] * 3))


def test_more_salts_than_one_launch_folds_are_folded_in_order():
    spec = nx.draw_spec("normal")
    values = [_salt(v) for v in range(5)] + [torch.tensor([11, 12], dtype=torch.int32), _salt(-99, torch.int64)]
    args = torch.empty((2, 4), dtype=torch.int64)
    nx.fold_keys(_template(spec), values, args)
    out = torch.empty((2, 5))
    nx.draw_into(spec, out, args, rows=2)
    for r in range(2):
        key = _folded(KEY, list(range(5)) + [11 + r, -99])
        assert np.array_equal(out[r].numpy(), nx.normal(key, 5))


def test_device_draws_refuse_what_they_cannot_draw():
    spec = nx.draw_spec("uniform")
    args = _template(spec)
    with pytest.raises(ValueError, match="float32"):
        nx.draw_into(spec, torch.empty(4, dtype=torch.int32), args)
    with pytest.raises(ValueError, match="rows"):
        nx.draw_into(spec, torch.empty(5), args, copies=2)
    with pytest.raises(ValueError, match=r"shape \(2, 6\)"):
        nx.draw_into(spec, torch.empty(4), args, rows=2)
    with pytest.raises(ValueError, match="int32 or int64"):
        nx.fold_keys(args, [torch.tensor(1.0)], torch.empty_like(args))
    with pytest.raises(ValueError, match=r"\(\) or \(1,\)"):
        nx.fold_keys(args, [torch.tensor([1, 2], dtype=torch.int32)], torch.empty_like(args))
    with pytest.raises(ValueError, match="did you mean 'normal'"):
        nx.draw_spec("normall")
    with pytest.raises(TypeError, match="DrawSpec"):
        nx.draw_args(KEY, "uniform")
