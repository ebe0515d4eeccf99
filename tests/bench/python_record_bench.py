#!/usr/bin/python3
"""Per-step cost of trainwatch.Client.record() from Python, against
prometheus_client setting the same six gauges, in the same run.

    PYTHONPATH=build/python /usr/bin/python3 tests/bench/python_record_bench.py

Each variant is timed per call with time.perf_counter_ns over --calls calls
(after a warm-up), and the median is reported. The client points at a port
nothing listens on with a capacity above the call count, so record() pays its
full queue push and nothing is dropped; no server is needed. Budget
(docs/performance.md): record() <= 2 us median; Control.boundary() with
nothing due is measured beside it. Not a test: nothing is asserted.
"""

import argparse
import statistics
import time

import trainwatch


def timed(fn, calls, warmup=2000):
    for i in range(warmup):
        fn(i)
    out = [0] * calls
    clock = time.perf_counter_ns
    for i in range(calls):
        t0 = clock()
        fn(i)
        out[i] = clock() - t0
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200_000)
    args = ap.parse_args()
    n = args.calls

    clock_floor = statistics.median(timed(lambda i: None, n))
    rows = []

    tw = trainwatch.Client("127.0.0.1:1", run="bench", max_norm=1.0, capacity=4 * n + 100_000)
    step = [0]

    def rec_floats(i):
        step[0] += 1
        tw.record(step[0], 0.5, loss=2.3, loss_scale=65536.0, skipped=False,
                  clip_coef=1.0, lr=3e-4)
    rows.append(("trainwatch record(), 6 floats", timed(rec_floats, n)))

    import torch
    norm, loss, scale, coef, lr = (torch.tensor(v) for v in (0.5, 2.3, 65536.0, 1.0, 3e-4))

    def rec_tensors(i):
        step[0] += 1
        tw.record(step[0], norm, loss=loss, loss_scale=scale, skipped=False,
                  clip_coef=coef, lr=lr)
    rows.append(("trainwatch record(), 5 CPU tensors", timed(rec_tensors, n // 4)))

    # The closed loop's hook (docs/closed-loop.md), nothing due, no
    # torch.distributed: what each step pays for Control.boundary().
    control = trainwatch.Control(tw)

    def boundary(i):
        control.boundary(i)
    rows.append(("trainwatch Control.boundary(), nothing due", timed(boundary, n)))
    dropped = tw.stats.dropped
    tw.close(timeout=0.1)

    from prometheus_client import CollectorRegistry, Gauge
    reg = CollectorRegistry()
    gauges = [Gauge(f"bench_{name}", name, registry=reg) for name in
              ("step", "grad_norm", "loss", "loss_scale", "clip_coef", "lr")]
    g_step, g_norm, g_loss, g_scale, g_coef, g_lr = gauges

    def prom(i):
        g_step.set(i)
        g_norm.set(0.5)
        g_loss.set(2.3)
        g_scale.set(65536.0)
        g_coef.set(1.0)
        g_lr.set(3e-4)
    rows.append(("prometheus_client, 6 Gauge.set()", timed(prom, n)))

    base = statistics.median(rows[-1][1])
    print(f"timer overhead (empty call): {clock_floor:.0f} ns (included below)")
    print(f"{'variant':40s} {'median ns':>10s} {'p90 ns':>8s} {'p99 ns':>8s} {'vs prometheus':>14s}")
    for name, ts in rows:
        q = statistics.quantiles(ts, n=100)
        med = statistics.median(ts)
        print(f"{name:40s} {med:10.0f} {q[89]:8.0f} {q[98]:8.0f} {med / base:13.2f}x")
    print(f"dropped during the run: {dropped} (must be 0 for the figures to count)")


if __name__ == "__main__":
    main()
