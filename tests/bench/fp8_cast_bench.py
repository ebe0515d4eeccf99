#!/usr/bin/python3
"""trainwatch.fp8's casts against the brute-force reference on EVERY float32
bit pattern (2^32 of them, in chunks): a benchmark, not a test (ctest runs a
sample: tests/python/test_fp8.py).

    PYTHONPATH=client/python /usr/bin/python3 tests/bench/fp8_cast_bench.py \\
        [--formats E4M3,E5M2,E4M3_FNUZ,E5M2_FNUZ] [--modes saturate,nan] \\
        [--jobs N] [--chunk-bits 22]

Prints, per format and overflow mode, the patterns checked, how many differ
(0 is the bar) and the first few that do, and the time both took; exits 1 if
any differ. docs/fp8.md has the figures.
"""

import argparse
import importlib.util
import multiprocessing
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
FP8_PY = os.path.join(HERE, "..", "..", "client", "python", "trainwatch", "fp8.py")


def load_fp8():
    """trainwatch/fp8.py alone (it needs numpy only, not the binding)."""
    spec = importlib.util.spec_from_file_location("trainwatch_fp8", FP8_PY)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def check_range(task):
    name, saturate, start, count = task
    fp8 = load_fp8() if not hasattr(check_range, "fp8") else check_range.fp8
    check_range.fp8 = fp8
    bits = np.arange(start, start + count, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    t0 = time.perf_counter()
    fast = fp8.encode(x, name, saturate)
    t1 = time.perf_counter()
    ref = fp8.reference_encode(x, name, saturate)
    t2 = time.perf_counter()
    bad = np.nonzero(fast != ref)[0]
    examples = [(int(bits[i]), int(fast[i]), int(ref[i])) for i in bad[:3]]
    return name, saturate, count, int(bad.size), examples, t1 - t0, t2 - t1


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--formats", default="E4M3,E5M2,E4M3_FNUZ,E5M2_FNUZ")
    p.add_argument("--modes", default="saturate,nan",
                   help="saturate (overflow -> +-max) and/or nan (-> NaN, or Inf for E5M2)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--chunk-bits", type=int, default=22)
    p.add_argument("--patterns-bits", type=int, default=32,
                   help="check the first 2^N patterns and their negatives (32: all)")
    args = p.parse_args(argv)
    formats = args.formats.split(",")
    modes = [m == "saturate" for m in args.modes.split(",")]
    chunk = 1 << args.chunk_bits
    total = 1 << args.patterns_bits
    tasks = []
    for name in formats:
        for saturate in modes:
            if total == 1 << 32:
                starts = range(0, total, chunk)
            else:  # a prefix of the positive patterns and the same negatives
                starts = list(range(0, total, chunk)) + list(range(1 << 31, (1 << 31) + total, chunk))
            tasks += [(name, saturate, s, min(chunk, (1 << 32) - s)) for s in starts]
    print(f"fp8 casts vs the brute-force reference: {len(formats)} format(s) x "
          f"{len(modes)} mode(s), {total if total == 1 << 32 else 2 * total} patterns each, "
          f"{args.jobs} job(s), machine {os.uname().machine} with {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    t0 = time.time()
    results = {}
    with multiprocessing.Pool(args.jobs) as pool:
        for name, sat, count, bad, examples, tf, tr in pool.imap_unordered(check_range, tasks, chunksize=1):
            r = results.setdefault((name, sat), [0, 0, [], 0.0, 0.0])
            r[0] += count
            r[1] += bad
            r[2] = (r[2] + examples)[:3]
            r[3] += tf
            r[4] += tr
    failed = False
    for (name, sat), (count, bad, examples, tf, tr) in sorted(results.items()):
        mode = "saturate" if sat else "nan"
        print(f"{name:10s} {mode:8s} checked {count} patterns, {bad} differ"
              f"{'' if not examples else ' e.g. ' + ', '.join(f'0x{b:08x}: fast 0x{f:02x} ref 0x{r:02x}' for b, f, r in examples)}"
              f"; cast {count / tf / 1e6:.1f} M/s, reference {count / tr / 1e6:.1f} M/s (per job)")
        failed |= bad > 0
    print(f"total {sum(r[0] for r in results.values())} patterns, "
          f"{sum(r[1] for r in results.values())} differ, {time.time() - t0:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
