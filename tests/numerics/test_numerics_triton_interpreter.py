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
    return np.concatenate([random, moderate.view(np.uint32), cases, cases | np.uint32(1 << 31),
                           special]).view(np.float32)


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_kernel_matches_numpy(name):
    x = inputs(name)
    got = cuda.unary(UNARY[name].__name__, torch.from_numpy(x.copy())).numpy()
    assert np.array_equal(got.view(np.uint32), cpu.unary(UNARY[name], x).view(np.uint32))


def test_pow_kernel_matches_numpy():
    x, y = inputs("exp"), inputs("log")[: len(inputs("exp"))]
    got = cuda.binary(pow.pow_f32.__name__, torch.from_numpy(x.copy()), torch.from_numpy(y.copy()))
    assert np.array_equal(got.numpy().view(np.uint32), cpu.binary(pow.pow_f32, x, y).view(np.uint32))


def test_philox_kernel_matches_numpy():
    rng = np.random.default_rng(9)
    counters = rng.integers(0, 2**32, (700, 4), dtype=np.uint64).astype(np.uint32)
    keys = rng.integers(0, 2**32, (700, 2), dtype=np.uint64).astype(np.uint32)
    got = cuda.philox(torch.from_numpy(counters.view(np.int32)), torch.from_numpy(keys.view(np.int32)))
    assert np.array_equal(got.numpy().view(np.uint32), cpu.philox4x32(counters, keys))


def _kernel_draw(kernel, shape, dtype, args):
    return cuda.draw(kernel, shape, dtype, torch.device("cpu"), list(KEY.words) + args)


def _bits(value):
    return int(np.float64(value).view(np.int64))


@pytest.mark.parametrize("shape", [(1000,), (3, 333), (1,)])
def test_draw_kernels_match_numpy(shape):
    n = math.prod(shape)
    low, high = -0.25, 1.5
    caps = [int(np.float32(low).view(np.uint32)), int(np.nextafter(np.float32(high), 0).view(np.uint32))]
    got = _kernel_draw("uniform_kernel", shape, torch.float32, [_bits(low), _bits(high)] + caps)
    assert np.array_equal(got.numpy(), nx.uniform(KEY, shape, low, high))
    got = _kernel_draw("normal_kernel", shape, torch.float32, [_bits(0.5), _bits(2.0)])
    assert np.array_equal(got.numpy(), nx.normal(KEY, shape, 0.5, 2.0))
    got = _kernel_draw("truncated_normal_kernel", shape, torch.float32,
                       [_bits(0.0), _bits(1.0), _bits(1.5)])
    assert np.array_equal(got.numpy(), nx.truncated_normal(KEY, shape, bound=1.5))
    got = _kernel_draw("bernoulli_kernel", shape, torch.uint8, [round(0.7 * 2**32)])
    assert np.array_equal(got.numpy().astype(bool), nx.bernoulli(KEY, shape, 0.7))
    got = _kernel_draw("randint_kernel", shape, torch.int32, [-5, 1000])
    assert np.array_equal(got.numpy(), nx.randint(KEY, shape, -5, 995))
    assert n == got.numel()
