"""trainwatch.fp8: emulated FP8 casts, delayed scaling, and the fp8 stats
trainwatch watches (docs/fp8.md).

    from trainwatch.fp8 import cast, DelayedScaling, FP8StatsHook

    q = cast(x, "E4M3")                       # bit-exact, numpy float32 in/out
    recipe = DelayedScaling("E4M3", amax_history_len=16, margin=0)
    y, stats = recipe.quantize(x)             # y = cast(x * scale) / scale
    tw.record(step, grad_norm=g, fp8={"l0.fc1:input": stats})

Formats (OCP FP8 and the "FNUZ" variants of AMD/Graphcore):

    name        bias  mantissa  max     min subnormal  inf  NaN           -0
    E4M3        7     3         448     2^-9           no   S.1111.111    yes
    E5M2        15    2         57344   2^-16          yes  S.11111.xx    yes
    E4M3_FNUZ   8     3         240     2^-10          no   0x80          no
    E5M2_FNUZ   16    2         57344   2^-17          no   0x80          no

cast() rounds to nearest, ties to even, with subnormals. A value beyond the
format's range saturates at +-max (saturate=True, Transformer Engine's
convention) or becomes NaN (Inf for E5M2, which has infinities)
with saturate=False. NaN stays NaN. It works on the float32 value: inputs
are converted to float32 first.

Debian's PyTorch 1.13 has no float8 dtypes, so the casts are emulated here in
numpy; tests/python/test_fp8.py checks them on a sample of float32 bit
patterns against a brute-force nearest-value search, and
tests/bench/fp8_cast_bench.py on every one of the 2^32.
"""

import math

import numpy as np

__all__ = ["FORMATS", "Format", "cast", "encode", "decode_table",
           "reference_encode", "tensor_stats", "DelayedScaling", "FP8StatsHook",
           "Fp8Linear", "emulate_fp8"]


class Format:
    """One FP8 format: exponent bias, mantissa bits, and its conventions."""

    def __init__(self, name, code, exp_bits, man_bits, bias, fnuz, ieee_inf):
        self.name = name
        self.code = code          # the wire's Fp8Format value
        self.exp_bits = exp_bits
        self.man_bits = man_bits
        self.bias = bias
        self.fnuz = fnuz          # no -0, no inf, NaN is 0x80
        self.ieee_inf = ieee_inf  # E5M2: the top exponent is inf/NaN
        self.emin = 1 - bias      # exponent of the smallest normal
        top = (1 << exp_bits) - 1
        if ieee_inf:
            emax, mmax = top - 1 - bias, (1 << man_bits) - 1
        elif fnuz:
            emax, mmax = top - bias, (1 << man_bits) - 1
        else:  # E4M3: S.1111.111 is NaN, S.1111.110 the max
            emax, mmax = top - bias, (1 << man_bits) - 2
        self.emax = emax
        self.max = (1 + mmax / (1 << man_bits)) * 2.0 ** emax
        self.min_subnormal = 2.0 ** (self.emin - man_bits)
        self.min_normal = 2.0 ** self.emin
        self.nan_code = 0x80 if fnuz else (0x7E if ieee_inf else 0x7F)

    def __repr__(self):
        return f"Format({self.name}, max={self.max:g})"


FORMATS = {f.name: f for f in (
    Format("E4M3", 1, 4, 3, 7, fnuz=False, ieee_inf=False),
    Format("E5M2", 2, 5, 2, 15, fnuz=False, ieee_inf=True),
    Format("E4M3_FNUZ", 3, 4, 3, 8, fnuz=True, ieee_inf=False),
    Format("E5M2_FNUZ", 4, 5, 2, 16, fnuz=True, ieee_inf=False),
)}


def _format(fmt):
    if isinstance(fmt, Format):
        return fmt
    try:
        return FORMATS[str(fmt).upper()]
    except KeyError:
        raise ValueError(f"unknown FP8 format {fmt!r}; one of {sorted(FORMATS)}") from None


# -- the cast ------------------------------------------------------------------


def encode(x, fmt, saturate=True):
    """The FP8 codes (uint8) of x (any float array, taken as float32).

    Integer arithmetic on the float32 bits: the magnitude's bits are shifted
    right by the bits the format drops, rounding to nearest with ties to
    even (add half minus one, plus the kept LSB); a carry moves into the
    exponent as it should. Below the format's smallest normal the
    significand (with its implicit 1) is shifted by the extra binades."""
    f = _format(fmt)
    x = np.ascontiguousarray(x, dtype=np.float32)
    bits = x.view(np.uint32)
    sign = (bits >> 31).astype(np.uint8)
    mag = bits & np.uint32(0x7FFFFFFF)
    e32 = mag >> np.uint32(23)           # float32 biased exponent
    drop = 23 - f.man_bits
    # Normal in the target (biased exponent >= 1, i.e. e32 >= lo): round
    # the exponent+mantissa bits, then rebias the exponent.
    lo = 127 - f.bias + 1
    code = mag >> np.uint32(drop)
    code &= np.uint32(1)
    code += mag
    code += np.uint32((1 << (drop - 1)) - 1)
    code >>= np.uint32(drop)
    code -= np.uint32(((127 - f.bias) << f.man_bits) & 0xFFFFFFFF)
    # Subnormal in the target: the significand with its implicit 1, shifted
    # by drop + (lo - e32) (at most 31: anything past 25 rounds to 0).
    small = e32 < np.uint32(lo)
    if small.any():
        e_s = e32[small]
        sig = (mag[small] & np.uint32(0x7FFFFF)) | np.uint32(1 << 23)
        shift = np.minimum(np.uint32(drop) + np.uint32(lo) - e_s, np.uint32(31))
        r = (sig >> shift) & np.uint32(1)
        r += sig
        r += (np.uint32(1) << (shift - np.uint32(1))) - np.uint32(1)
        r >>= shift
        r[e_s == 0] = 0                  # float32 zeros and subnormals
        code[small] = r
    max_mag = np.uint32(_max_code(f))
    over = (code > max_mag) | (e32 == np.uint32(255))   # beyond the max, or inf
    code = _signed(f, np.minimum(code, np.uint32(0x7F)).astype(np.uint8), sign)
    if over.any():
        code = np.where(over, _overflow_codes(f, sign, saturate), code)
        nan = (e32 == np.uint32(255)) & ((mag & np.uint32(0x7FFFFF)) != 0)
        code = np.where(nan, _nan_codes(f, sign), code)
    return code.astype(np.uint8, copy=False)


def _max_code(f):
    top = (1 << f.exp_bits) - 1
    if f.ieee_inf:
        return np.uint8(((top - 1) << f.man_bits) | ((1 << f.man_bits) - 1))
    if f.fnuz:
        return np.uint8((top << f.man_bits) | ((1 << f.man_bits) - 1))
    return np.uint8((top << f.man_bits) | ((1 << f.man_bits) - 2))


def _signed(f, magnitude, sign):
    """Codes with their sign bit (FNUZ formats have no negative zero). The
    encoding's conventions, shared by encode() and reference_encode(): they
    differ only in how they round."""
    if f.fnuz:
        return np.where(magnitude == 0, np.uint8(0), magnitude | (sign << 7)).astype(np.uint8)
    return (magnitude | (sign << 7)).astype(np.uint8)


def _overflow_codes(f, sign, saturate):
    """What a value past the format's range becomes: +-max (saturate), Inf
    (E5M2, which has infinities) or NaN."""
    if saturate:
        return (_max_code(f) | (sign << 7)).astype(np.uint8)
    if f.ieee_inf:
        return (0x7C | (sign << 7)).astype(np.uint8)
    return _nan_codes(f, sign)


def _nan_codes(f, sign):
    if f.fnuz:
        return np.full(np.shape(sign), 0x80, dtype=np.uint8)
    return (np.uint8(f.nan_code) | (sign << 7)).astype(np.uint8)


_DECODE = {}


def decode_table(fmt):
    """float32 value of each of the 256 codes of a format (NaN codes NaN)."""
    f = _format(fmt)
    if f.name in _DECODE:
        return _DECODE[f.name]
    out = np.empty(256, dtype=np.float32)
    for c in range(256):
        s = -1.0 if c & 0x80 else 1.0
        e = (c >> f.man_bits) & ((1 << f.exp_bits) - 1)
        m = c & ((1 << f.man_bits) - 1)
        top = (1 << f.exp_bits) - 1
        if f.fnuz and c == 0x80:
            v = math.nan
        elif f.ieee_inf and e == top:
            v = s * math.inf if m == 0 else math.nan
        elif not f.fnuz and not f.ieee_inf and e == top and m == (1 << f.man_bits) - 1:
            v = math.nan
        elif e == 0:
            v = s * m * f.min_subnormal
        else:
            v = s * (1 + m / (1 << f.man_bits)) * 2.0 ** (e - f.bias)
        out[c] = v
    _DECODE[f.name] = out
    return out


def cast(x, fmt, saturate=True):
    """x cast to FP8 and back: the float32 values the FP8 codes stand for."""
    return decode_table(fmt)[encode(x, fmt, saturate)]


def reference_encode(x, fmt, saturate=True):
    """encode() by brute force: the nearest of all the format's values to
    |x|, found by searching the sorted table of them (with the value one
    quantum past the max standing for overflow), ties to the even code. No
    bit tricks: the tests and the benchmark hold encode() against it."""
    f = _format(fmt)
    table = decode_table(f).astype(np.float64)
    codes = np.array([c for c in range(128) if np.isfinite(table[c])], dtype=np.int64)
    values = table[codes]
    order = np.argsort(values, kind="stable")
    codes, values = codes[order], values[order]
    values = np.append(values, f.max + 2.0 ** (f.emax - f.man_bits))
    codes = np.append(codes, int(_max_code(f)) + 1)
    # Between two neighbours, |x| goes to the nearer; at their midpoint (a
    # float32: neighbours differ in the last of a few bits) to the even code.
    mids = ((values[:-1] + values[1:]) / 2).astype(np.float32)
    x = np.ascontiguousarray(x, dtype=np.float32)
    sign = (x.view(np.uint32) >> 31).astype(np.uint8)
    a = np.abs(x)
    below = np.searchsorted(mids, a, side="left")   # mids < a: a is past them
    # At a midpoint between codes[i] and codes[i+1] (i = below), the even one.
    i = np.minimum(below, len(mids) - 1)
    at_mid = mids[i] == a
    even_hi = codes[i + 1] % 2 == 0
    best = np.where(at_mid & even_hi, below + 1, below)
    over = best == len(values) - 1
    code = _signed(f, codes[np.minimum(best, len(codes) - 1)].astype(np.uint8), sign)
    code = np.where(over | np.isinf(a), _overflow_codes(f, sign, saturate), code)
    return np.where(np.isnan(a), _nan_codes(f, sign), code).astype(np.uint8)


# -- stats and delayed scaling -------------------------------------------------


def _cast_scaled(x, scale, f):
    """(cast(x * scale) / scale as float32, overflow share, underflow share)."""
    y = (x * np.float32(scale)).astype(np.float32)
    codes = encode(y, f, saturate=False)
    if f.ieee_inf:
        overflowed = (codes & 0x7F) == 0x7C
    else:
        overflowed = codes == _nan_codes(f, (codes >> 7).astype(np.uint8))
    overflowed &= ~np.isnan(y)
    sign = (codes >> 7).astype(np.uint8)
    codes = np.where(overflowed, _overflow_codes(f, sign, True), codes).astype(np.uint8)
    n = max(x.size, 1)
    nonzero = x != 0
    zero = codes == 0 if f.fnuz else (codes & 0x7F) == 0
    nz = max(int(np.count_nonzero(nonzero)), 1)
    q = decode_table(f)[codes] / np.float32(scale)
    return (q.astype(np.float32), np.count_nonzero(overflowed) / n,
            np.count_nonzero(nonzero & zero) / nz)


def tensor_stats(x, scale, fmt, amax_history_len=0, margin=0, amax_group=""):
    """The fp8 stats of one cast, fp8 = cast(x * scale) (saturating):
    overflow_fraction is the share of elements whose scaled value is beyond
    the format's range (they saturate at its max), underflow_fraction the
    share of the non-zero elements that cast to zero."""
    return _stats(np.asarray(x, dtype=np.float32), scale, _format(fmt),
                  amax_history_len, margin, amax_group)[1]


def _stats(x, scale, f, amax_history_len, margin, amax_group):
    q, over, under = _cast_scaled(x, scale, f)
    amax = float(np.max(np.abs(x))) if x.size else 0.0
    return q, {"format": f.name, "amax": amax, "scale": float(scale),
               "amax_history_len": int(amax_history_len), "margin": float(margin),
               "overflow_fraction": float(over), "underflow_fraction": float(under),
               "amax_group": amax_group}


class DelayedScaling:
    """Per-tensor delayed scaling, as Transformer Engine's DelayedScaling:
    the cast of a step uses the scale computed after the previous step,
    scale = (fmt_max / amax) / 2^margin with amax = max(amax history)
    ("max") or its latest entry ("most_recent"); the history (zeros at
    first) holds the last amax_history_len amaxes, and the scale starts
    at 1. fmt_max defaults to the format's; passing another value is how a
    wrong format max (448 for E4M3_FNUZ) is reproduced."""

    def __init__(self, fmt="E4M3", amax_history_len=1024, margin=0,
                 amax_compute_algo="max", fmt_max=None, amax_group=""):
        if amax_compute_algo not in ("max", "most_recent"):
            raise ValueError('amax_compute_algo must be "max" or "most_recent"')
        if amax_history_len < 1:
            raise ValueError("amax_history_len must be >= 1")
        self.format = _format(fmt)
        self.amax_history_len = int(amax_history_len)
        self.margin = margin
        self.algo = amax_compute_algo
        self.fmt_max = self.format.max if fmt_max is None else float(fmt_max)
        self.amax_group = amax_group
        self.history = np.zeros(self.amax_history_len, dtype=np.float64)
        self.scale = 1.0

    def quantize(self, x, amax=None):
        """(x cast with this step's scale and dequantized, stats); then
        updates the history and the scale for the next step. amax: this
        step's amax if not max|x| (e.g. reduced over a process group)."""
        x = np.asarray(x, dtype=np.float32)
        q, stats = _stats(x, self.scale, self.format, self.amax_history_len,
                          self.margin, self.amax_group)
        if amax is not None:
            stats["amax"] = float(amax)
        self.update(stats["amax"])
        return q, stats

    def update(self, amax):
        self.history = np.roll(self.history, 1)
        self.history[0] = amax
        a = self.history.max() if self.algo == "max" else self.history[0]
        if np.isfinite(a) and a > 0:
            self.scale = float(self.fmt_max / a / 2.0 ** self.margin)


# -- PyTorch: emulated FP8 linears and their stats ------------------------------


def _torch():
    import torch  # deferred: trainwatch.fp8's casts need numpy only
    return torch


class _QDQ:
    """Quantize-dequantize through FP8 in the forward, identity in the
    backward (the straight-through estimator)."""

    _fn = None

    @classmethod
    def apply(cls, x, recipe, sink, name, amax=None):
        torch = _torch()
        if cls._fn is None:
            class Fn(torch.autograd.Function):
                @staticmethod
                def forward(ctx, t, recipe, sink, name, amax):
                    q, stats = recipe.quantize(t.detach().cpu().numpy(), amax)
                    sink[name] = stats
                    return torch.from_numpy(q).to(t.dtype)

                @staticmethod
                def backward(ctx, g):
                    return g, None, None, None, None
            cls._fn = Fn
        return cls._fn.apply(x, recipe, sink, name, amax)


class Fp8Linear:
    """Wraps an nn.Linear's forward so its input and weight go through FP8
    (E4M3 by default) with delayed scaling, one recipe per tensor; the last
    step's stats are in .stats ({"<name>:input": {...}, "<name>:weight": ...})."""

    def __init__(self, module, name, fmt="E4M3", amax_history_len=16, margin=0,
                 amax_compute_algo="max", fmt_max=None, amax_group=""):
        kw = dict(amax_history_len=amax_history_len, margin=margin,
                  amax_compute_algo=amax_compute_algo, fmt_max=fmt_max,
                  amax_group=amax_group)
        self.module = module
        self.name = name
        self.recipes = {"input": DelayedScaling(fmt, **kw), "weight": DelayedScaling(fmt, **kw)}
        self.stats = {}
        self.input_hook = None   # optional f(x) -> x, applied before the cast
        self.amax_of = {}        # tensor kind -> f(local amax) -> amax (a group's)
        module.forward = self.forward

    def forward(self, x):
        torch = _torch()
        if self.input_hook is not None:
            x = self.input_hook(x)
        xs = {}
        for kind, t in (("input", x), ("weight", self.module.weight)):
            amax = None
            if kind in self.amax_of:
                amax = self.amax_of[kind](float(t.detach().abs().max()))
            xs[kind] = _QDQ.apply(t, self.recipes[kind], self.stats, f"{self.name}:{kind}", amax)
        return torch.nn.functional.linear(xs["input"], xs["weight"], self.module.bias)


def emulate_fp8(model, **recipe):
    """Puts every nn.Linear of `model` through FP8 (Fp8Linear); returns
    {qualified name: Fp8Linear}."""
    torch = _torch()
    out = {}
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):
            out[name] = Fp8Linear(m, name, **recipe)
    return out


class FP8StatsHook:
    """Collects the fp8 stats of a model's emulated FP8 linears every
    `every` steps, for Client.record(step, ..., fp8=hook.collect(step)).

        linears = emulate_fp8(model, fmt="E4M3", amax_history_len=16)
        hook = FP8StatsHook(linears, every=10)
        ...
        tw.record(step, grad_norm=norm, loss=loss, fp8=hook.collect(step))

    collect() returns None on the steps in between (record() then sends no
    fp8 map). The recipes update every step whether or not it is collected.
    From Transformer Engine (untested here, docs/fp8.md): amax from
    fp8_meta["scaling_fwd"].amax_history[0], scale from .scale, per GEMM
    tensor index, with the recipe's amax_history_len, margin and format."""

    def __init__(self, linears, every=100):
        if every < 1:
            raise ValueError("every must be >= 1")
        self.linears = dict(linears)
        self.every = every

    def collect(self, step, force=False):
        if not force and step % self.every != 0:
            return None
        out = {}
        for lin in self.linears.values():
            out.update(lin.stats)
        return out or None
