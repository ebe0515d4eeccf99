#!/usr/bin/env python3
"""A synthetic fp16 run for tools/perf/storage_bytes.sh, written twice: as a
trainwatch JSONL step log (for `trainwatchctl replay`) and as OpenMetrics
gauges, one series per float field, a sample per step one second apart (for
`promtool tsdb create-blocks-from openmetrics`). Same values in both, as
shortest round-trip decimal strings, so each side parses the same doubles.

  storage_gen.py STEPS JSONL OPENMETRICS [--seed N] [--full-precision | --float32]

The fields, each step: grad_norm (lognormal), loss (decaying with noise),
lr (linear warmup then cosine), loss_scale (a power of two that halves on an
overflow step, which is skipped, and doubles after 2,000 clean steps),
clip_coef (min(1, max_norm / (norm + 1e-6)), as clip_grad_norm_), max_attn_logit,
log_z, shard_sq_sum, step_time_s and data_wait_s (the trainer's timer; the
record's time_unix_nanos follows their sum with a few microseconds of
jitter), clipped, skipped, and two batch ids.

The tensor values (grad_norm, loss, max_attn_logit, log_z, shard_sq_sum) are
float32 numbers, as `tensor.item()` gives them from an fp16/AMP run whose
reductions are float32; --full-precision makes them arbitrary doubles (every
mantissa bit noise), the hard case for any float codec. --float32 is the
record trainwatch.torch's StepHook sends: clip_coef too is a float32 tensor's
value, computed as clip_fields' tensor path does (float32 arithmetic:
1 / (norm + 1e-6) times max_norm, clamped to 1), not the double the C++
client derives.
"""
import argparse
import json
import math
import random
import struct

FIELDS = ["grad_norm", "clip_coef", "loss_scale", "max_attn_logit", "log_z",
          "loss", "lr", "shard_sq_sum", "step_time_s", "data_wait_s"]


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def clip_coef_f32(max_norm, norm):
    """clip_fields' tensor path on a float32 norm: torch's max_norm / t is
    t.reciprocal() * max_norm, each op rounded to float32 (a double op on
    float32 operands rounded once is the float32 op), clamp(max=1)."""
    r = f32(1.0 / f32(f32(norm) + f32(1e-6)))
    return min(f32(r * f32(max_norm)), 1.0)


def generate(steps, seed, full_precision, float32=False):
    rng = random.Random(seed)
    tensor = (lambda x: x) if full_precision else f32
    max_norm, warmup, peak_lr, min_lr = 1.0, 2000, 3e-4, 3e-5
    scale, clean = 65536.0, 0
    t = 1_764_000_000_000_000_000
    for i in range(steps):
        overflow = rng.random() < 0.001
        norm = math.inf if overflow else tensor(rng.lognormvariate(math.log(0.6), 0.35))
        if i < warmup:
            lr = peak_lr * (i + 1) / warmup
        else:
            p = (i - warmup) / max(1, steps - warmup)
            lr = min_lr + 0.5 * (peak_lr - min_lr) * (1 + math.cos(math.pi * p))
        step_time = 0.42 * rng.lognormvariate(0, 0.03)
        data_wait = rng.expovariate(1 / 0.004)
        # The wall clock of the record follows the step times, read a few
        # microseconds apart from the trainer's own timer.
        t += int(step_time * 1e9) + int(rng.gauss(0, 3000))
        rec = {
            "step": i,
            "grad_norm": norm,
            "clipped": norm > max_norm,
            "clip_coef": (0.0 if overflow else clip_coef_f32(max_norm, norm) if float32
                          else min(1.0, max_norm / (norm + 1e-6))),
            "loss_scale": scale,
            "skipped": overflow,
            "max_attn_logit": tensor(22 + 6 * (1 - math.exp(-i / 50000)) + rng.gauss(0, 0.4)),
            "log_z": tensor(3.1 + rng.gauss(0, 0.05)),
            "loss": tensor(2.1 + 8 * math.exp(-i / 20000) + rng.gauss(0, 0.04)),
            "lr": lr,
            "time_unix_nanos": t,
            "batch_ids": [2 * i + 17, 2 * i + 18],
            "shard_sq_sum": tensor(norm * norm) if not overflow else math.inf,
            "step_time_s": step_time,
            "data_wait_s": data_wait,
        }
        if overflow:
            scale, clean = scale / 2, 0
        else:
            clean += 1
            if clean == 2000:
                scale, clean = scale * 2, 0
        yield rec


def number(x):
    """The shortest string that reads back as x (repr), JSON's names for the rest."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return repr(x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("steps", type=int)
    ap.add_argument("jsonl")
    ap.add_argument("openmetrics")
    ap.add_argument("--seed", type=int, default=1)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--full-precision", action="store_true")
    mode.add_argument("--float32", action="store_true")
    a = ap.parse_args()
    records = list(generate(a.steps, a.seed, a.full_precision, a.float32))
    with open(a.jsonl, "w") as out:
        out.write(json.dumps({"run_start": {"run_id": "storage", "precision": "FP16",
                                            "max_norm": 1.0}}) + "\n")
        for r in records:
            line = {k: (number(v) if isinstance(v, float) and not math.isfinite(v) else v)
                    for k, v in r.items()}
            out.write(json.dumps(line) + "\n")
    # OpenMetrics: a family's samples together, timestamps in seconds.
    with open(a.openmetrics, "w") as out:
        for f in FIELDS:
            out.write(f"# TYPE trainwatch_{f} gauge\n")
            lines = [f"trainwatch_{f} {number(r[f])} {1764000000 + r['step']}\n" for r in records]
            out.write("".join(lines))
        out.write("# EOF\n")


if __name__ == "__main__":
    main()
