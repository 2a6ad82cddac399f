"""Draws against their documented transforms of the Philox words (numerics_reference)."""

import math

import numpy as np
import pytest

from numerics_reference import philox_reference
from sexpgpu import numerics as nx
from sexpgpu.numerics import cpu
from sexpgpu.numerics.portable import draws

KEY = nx.stream_key(20261129, "encoder/block0/w")


def words(b, key=KEY, attempt=0):
    """The Philox block b: counter (b mod 2^32, b >> 32, attempt, 0)."""
    return philox_reference((b & 0xFFFFFFFF, b >> 32, attempt, 0), key.words)


def word(i, key=KEY):
    """Element i's word for uniform and bernoulli draws: word i mod 4 of block i div 4."""
    return words(i // 4, key)[i % 4]


def reference_normal(i, key=KEY, attempt=0):
    """Element i of a normal draw: the cosine (even i) or sine (odd i) Box-Muller normal of
    block i div 2, computed with libm in float64."""
    w0, w1, w2, _ = words(i // 2, key, attempt)
    u1 = (((w0 << 21) | (w1 >> 11)) + 1) * 2.0**-53
    angle = 2 * math.pi * w2 * 2.0**-32
    return math.sqrt(-2.0 * math.log(u1)) * (math.sin(angle) if i % 2 else math.cos(angle))


def ulp32(x):
    return float(np.spacing(np.float32(abs(x))))


def test_uniform_is_the_top_24_bits():
    got = nx.uniform(KEY, 1000)
    assert got.dtype == np.float32 and got.shape == (1000,)
    assert [float(v) for v in got] == [(word(i) >> 8) * 2.0**-24 for i in range(1000)]


def test_uniform_range_rounds_once_and_stays_inside():
    got = nx.uniform(KEY, 2000, low=-0.5, high=3.25)
    want = [np.float32(-0.5 + 3.75 * ((word(i) >> 8) * 2.0**-24)) for i in range(2000)]
    assert np.array_equal(got, np.array(want, np.float32))
    edge = nx.uniform(KEY, 20000, low=1.0, high=2.0)  # 1 + u rounds up to 2 when u is 1 - 2^-24
    assert edge.min() >= 1.0 and edge.max() < 2.0
    odd = nx.uniform(KEY, 1000, low=0.1, high=0.3)
    assert odd.min() >= 0.1 and odd.max() < 0.3


def test_normal_is_box_muller_of_words_0_to_2():
    got = nx.normal(KEY, 3001)
    for i, v in enumerate(got):
        assert abs(float(v) - reference_normal(i)) <= ulp32(reference_normal(i))
    scaled = nx.normal(KEY, 3000, mean=2.0, std=0.5)
    blocks = np.arange(1500, dtype=np.uint32)
    with np.errstate(over="ignore"):
        z0, z1 = draws.normal_pair(blocks, blocks * np.uint32(0), 0, np.uint32(KEY.k0), np.uint32(KEY.k1))
    z = np.stack((z0, z1), axis=-1).reshape(-1)
    assert np.array_equal(scaled, (2.0 + 0.5 * z).astype(np.float32))


def test_truncated_normal_takes_the_first_attempt_inside_the_bound():
    got = nx.truncated_normal(KEY, 4000, bound=1.0)
    assert np.all(np.abs(got) <= 1.0)
    redrawn = 0
    for i, v in enumerate(got):
        attempt = 0
        while abs(reference_normal(i, attempt=attempt)) > 1.0:
            attempt += 1
        redrawn += attempt > 0
        assert abs(float(v) - reference_normal(i, attempt=attempt)) <= ulp32(reference_normal(i, attempt=attempt))
    assert 1000 < redrawn < 1600  # P(|z| > 1) = 0.317


def test_bernoulli_compares_word_0_with_round_p_2_32():
    got = nx.bernoulli(KEY, 2000, 0.3)
    threshold = round(0.3 * 2**32)
    assert got.dtype == np.bool_
    assert got.tolist() == [word(i) < threshold for i in range(2000)]
    assert nx.bernoulli(KEY, 100, 1.0).all() and not nx.bernoulli(KEY, 100, 0.0).any()


def u64(i):
    """Element i's 64 bits for randint: words 0, 1 (even i) or 2, 3 (odd i) of block i div 2."""
    w = words(i // 2)
    return (w[0] << 32) | w[1] if i % 2 == 0 else (w[2] << 32) | w[3]


def test_randint_is_the_high_part_of_u64_times_the_span():
    got = nx.randint(KEY, 2001, -7, 10)
    want = [-7 + (u64(i) * 17 >> 64) for i in range(2001)]
    assert got.dtype == np.int32 and got.tolist() == want
    full = nx.randint(KEY, 1000, -(2**31), 2**31)
    assert full.tolist() == [-(2**31) + (u64(i) >> 32) for i in range(1000)]


def test_element_index_is_the_c_order_flat_index():
    flat = nx.normal(KEY, 60)
    assert np.array_equal(nx.normal(KEY, (3, 4, 5)), flat.reshape(3, 4, 5))
    assert np.array_equal(nx.normal(KEY, 100)[:60], flat)
    assert nx.normal(KEY, ()).shape == () and nx.normal(KEY, (0, 3)).shape == (0, 3)


def test_blocks_beyond_2_32_use_counter_word_1():
    start = 4 * (2**32 + 5)
    got = cpu.draw(draws.uniform_f32, 4, 6, np.uint32, KEY.words, 0.0, 1.0, 0, 0x3F7FFFFF,
                   start=start)
    want = [(word(start + j) >> 8) * 2.0**-24 for j in range(6)]
    assert got.view(np.float32).tolist() == want


def test_moments_are_those_of_the_distributions():
    z = nx.normal(nx.fold_in(KEY, 1), 10**6)
    assert abs(z.mean()) < 0.005 and abs(z.std() - 1) < 0.005
    assert abs(np.mean(z**4) - 3) < 0.05
    u = nx.uniform(nx.fold_in(KEY, 2), 10**6)
    assert abs(u.mean() - 0.5) < 0.002 and u.min() >= 0 and u.max() < 1
    t = nx.truncated_normal(nx.fold_in(KEY, 3), 10**5)
    assert np.abs(t).max() <= 2 and abs(t.std() - 0.8796) < 0.01  # std of N(0,1) cut at 2
    counts = np.bincount(nx.randint(nx.fold_in(KEY, 4), 10**6, 0, 10), minlength=10)
    assert np.all(np.abs(counts - 10**5) < 1500)


def test_torch_device_cpu_gives_the_same_bits():
    torch = pytest.importorskip("torch")
    for fn, args in ((nx.uniform, ()), (nx.normal, ()), (nx.truncated_normal, ()),
                     (nx.bernoulli, (0.25,)), (nx.randint, (3, 9))):
        t = fn(KEY, (4, 5), *args, device="cpu")
        assert isinstance(t, torch.Tensor) and t.device.type == "cpu"
        assert np.array_equal(t.numpy(), fn(KEY, (4, 5), *args))


def test_draw_by_name_is_the_named_draw_and_checks_as_it_does():
    for name, params in nx.DRAW_PARAMETERS.items():
        values = {"p": 0.25, "low": 3, "high": 9} if name in ("bernoulli", "randint") else {}
        given = {parameter: values[parameter] for parameter in params if parameter in values}
        assert np.array_equal(nx.draw(name, KEY, (4, 5), **given), getattr(nx, name)(KEY, (4, 5), **given))
    with pytest.raises(ValueError, match="std must not be negative"):
        nx.draw_spec("normal", std=-1.0)
    with pytest.raises(ValueError, match="did you mean 'uniform'"):
        nx.draw("unifrom", KEY, 3)


def test_device_draws_take_cpu_tensors_only_under_the_interpreter(monkeypatch):
    """Without TRITON_INTERPRET a CPU tensor would reach a compiled kernel: refused."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    spec = nx.draw_spec("uniform")
    args = torch.tensor([nx.draw_args(KEY, spec)])
    with pytest.raises(ValueError, match="CUDA tensors"):
        nx.draw_into(spec, torch.empty(4), args)
    with pytest.raises(TypeError, match="torch tensors"):
        nx.fold_keys(args, [3], np.empty((1, 6), dtype=np.int64))


@pytest.mark.parametrize("call, error", [
    (lambda: nx.uniform((1, 2), 3), TypeError),
    (lambda: nx.uniform(KEY, (2, -1)), TypeError),
    (lambda: nx.uniform(KEY, (2.0,)), TypeError),
    (lambda: nx.uniform(KEY, 3, low=1.0, high=1.0), ValueError),
    (lambda: nx.uniform(KEY, 3, high=float("inf")), ValueError),
    (lambda: nx.normal(KEY, 3, std=-1.0), ValueError),
    (lambda: nx.normal(KEY, 3, mean=float("nan")), ValueError),
    (lambda: nx.truncated_normal(KEY, 3, bound=0.01), ValueError),
    (lambda: nx.bernoulli(KEY, 3, 1.5), ValueError),
    (lambda: nx.randint(KEY, 3, 0, 2**31 + 1), ValueError),
    (lambda: nx.randint(KEY, 3, 0.0, 4), TypeError),
    (lambda: nx.normal(KEY, 3, device=0), TypeError),
    (lambda: nx.normal(KEY, 3, device="meta"), ValueError),
])
def test_bad_arguments_are_refused(call, error):
    with pytest.raises(error):
        call()
