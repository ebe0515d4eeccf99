"""trainwatch.fp8: the emulated casts against a brute-force nearest-value
search (a sample of float32 bit patterns here; every one of the 2^32 in
tests/bench/fp8_cast_bench.py), the formats' constants, and delayed scaling."""

import math

import numpy as np
import pytest
import torch

from trainwatch import fp8

FORMATS = sorted(fp8.FORMATS)


def sample_patterns(seed=0, n=1 << 18):
    """Random float32 bit patterns, plus every pattern within a few ulps of
    each format's values and midpoints (where rounding decides), zeros,
    subnormals, infinities and NaNs."""
    rng = np.random.default_rng(seed)
    parts = [rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32)]
    near = []
    for name in FORMATS:
        table = fp8.decode_table(name).astype(np.float64)
        vals = np.unique(np.abs(table[np.isfinite(table)]))
        f = fp8.FORMATS[name]
        vals = np.append(vals, f.max + 2.0 ** (f.emax - f.man_bits))
        mids = (vals[1:] + vals[:-1]) / 2
        for v in np.concatenate([vals, mids]).astype(np.float32):
            b = int(np.array([v], np.float32).view(np.uint32)[0])
            near.extend(b + d for d in range(-3, 4))
    near = np.array(near, dtype=np.int64) % (1 << 32)
    parts += [near.astype(np.uint32), (near | (1 << 31)).astype(np.uint32),
              np.arange(0, 1 << 12, dtype=np.uint32),                 # subnormals
              np.arange(0x7F7FF000, 0x7F801000, dtype=np.uint32),     # max..inf..NaN
              np.arange(0xFF7FF000, 0xFF801000, dtype=np.uint32)]
    return np.concatenate(parts).view(np.float32)


@pytest.mark.parametrize("saturate", [True, False])
@pytest.mark.parametrize("name", FORMATS)
def test_cast_matches_the_brute_force_reference(name, saturate):
    x = sample_patterns()
    fast = fp8.encode(x, name, saturate)
    ref = fp8.reference_encode(x, name, saturate)
    bad = np.nonzero(fast != ref)[0]
    assert bad.size == 0, (f"{bad.size} of {x.size} differ, e.g. x={x[bad[:3]]} "
                           f"fast={fast[bad[:3]]} ref={ref[bad[:3]]}")


def test_format_constants():
    expect = {"E4M3": (448.0, 2.0 ** -9), "E5M2": (57344.0, 2.0 ** -16),
              "E4M3_FNUZ": (240.0, 2.0 ** -10), "E5M2_FNUZ": (57344.0, 2.0 ** -17)}
    for name, (mx, sub) in expect.items():
        f = fp8.FORMATS[name]
        assert f.max == mx and f.min_subnormal == sub, name
        table = fp8.decode_table(name)
        assert np.nanmax(table[np.isfinite(table)]) == mx
        assert np.count_nonzero(np.isnan(table)) == {"E4M3": 2, "E5M2": 6}.get(name, 1)
    # The wire's Fp8Format values.
    assert [fp8.FORMATS[n].code for n in ("E4M3", "E5M2", "E4M3_FNUZ", "E5M2_FNUZ")] == [1, 2, 3, 4]


def test_rounding_ties_subnormals_and_overflow():
    c = lambda v, n, s=True: fp8.cast(np.array(v, np.float32), n, saturate=s).tolist()
    # E4M3: 464 is the tie between 448 (even) and the next step (480, odd).
    assert c([448, 464, 465], "E4M3") == [448, 448, 448]
    assert math.isnan(c([465], "E4M3", False)[0]) and c([464], "E4M3", False) == [448]
    # E5M2: 61440 ties to the next step (65536, even): overflow, inf.
    assert c([61439, 61440], "E5M2", False) == [57344, math.inf]
    # Subnormals: half the smallest one ties to 0 (even), above it rounds up.
    assert c([2 ** -10, 2 ** -10 * 1.01, 3 * 2 ** -11], "E4M3") == [0, 2 ** -9, 2 ** -9]
    # FNUZ: no negative zero, NaN is 0x80.
    assert fp8.encode(np.array([-0.0, -1e-9], np.float32), "E4M3_FNUZ").tolist() == [0, 0]
    assert fp8.encode(np.array([-0.0], np.float32), "E4M3").tolist() == [0x80]
    assert fp8.encode(np.array([np.nan], np.float32), "E4M3_FNUZ").tolist() == [0x80]
    assert c([np.inf, -np.inf], "E4M3") == [448, -448]


def test_tensor_stats_overflow_and_underflow_shares():
    x = np.array([1.0, 2.0, 500.0, 1e-6, 0.0], np.float32)
    s = fp8.tensor_stats(x, 1.0, "E4M3")
    assert s["amax"] == 500.0 and s["format"] == "E4M3"
    assert s["overflow_fraction"] == pytest.approx(1 / 5)       # 500 > 464
    assert s["underflow_fraction"] == pytest.approx(1 / 4)      # 1e-6 of the 4 non-zero


def test_delayed_scaling_follows_the_recipe():
    r = fp8.DelayedScaling("E4M3", amax_history_len=4, margin=1)
    assert r.scale == 1.0  # before any amax
    amaxes = [2.0, 8.0, 1.0, 1.0, 1.0, 1.0]
    for a in amaxes:
        _, stats = r.quantize(np.array([a, -a / 2], np.float32))
        assert stats["amax"] == a
    # The last scale: max of the last 4 amaxes (1.0), margin 1.
    assert r.scale == pytest.approx(448 / 1.0 / 2)
    r2 = fp8.DelayedScaling("E4M3_FNUZ", amax_history_len=8, fmt_max=448)
    r2.quantize(np.array([3.0], np.float32))
    assert r2.scale == pytest.approx(448 / 3)   # the wrong max, as configured
    most = fp8.DelayedScaling("E5M2", amax_history_len=8, amax_compute_algo="most_recent")
    for a in (4.0, 1.0):
        most.quantize(np.array([a], np.float32))
    assert most.scale == pytest.approx(57344 / 1.0)


def test_emulated_linear_is_a_straight_through_quantizer():
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 4)
    wrapped = fp8.emulate_fp8(torch.nn.Sequential(lin))
    x = torch.randn(16, 8, requires_grad=True)
    y = lin(x)
    y.sum().backward()
    assert x.grad is not None and lin.weight.grad is not None
    stats = wrapped["0"].stats
    assert set(stats) == {"0:input", "0:weight"}
    assert stats["0:input"]["amax"] == pytest.approx(float(x.abs().max()))
    hook = fp8.FP8StatsHook(wrapped, every=5)
    assert hook.collect(3) is None and set(hook.collect(5)) == {"0:input", "0:weight"}
