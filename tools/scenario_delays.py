#!/usr/bin/python3
"""Detection delays of the scenario suite, measured through a real server.

Generates the scenarios (tests/testdata/scenarios/generate.py), replays each
through trainwatch-server with trainwatchctl replay (the ranks of a stage in
lockstep chunks of 100 steps, as tests/integration/scenario_test.cc does),
and prints, per expected alert, the step it fired and its delay (started_step
minus the onset the generator knows), and per scenario the alerts that page
(warning or critical, no caused_by) and how often each fired.

  tools/scenario_delays.py --bin build/bin [NAME ...]
  tools/scenario_delays.py --bin old=OLD/bin --bin new=build/bin [NAME ...]

With two --bin the table has a column per build (e.g. main before a change,
and the change).

  tools/scenario_delays.py --bin build/bin --orders [NAME ...]

--orders replays each multi-rank scenario (world_size > 1) three ways, each
under a run id of its own (RUN_ID/ORDER) against one server, every rank's
whole file with `trainwatchctl replay FILE --run R --rank N`: every rank at
once (concurrent streams), one rank after another rank 0 first, and one
after another from the highest rank down to rank 0 (rank 0 last). It prints
the alerts of each (alertname@started_step/onset_step) and whether the three
are equal, and exits 1 if any differ. The server runs with
ranks.missing_after_seconds = --missing-after (default 5; the sequential
orders must replay faster than that, or ranks not yet replayed count as
missing), the alerts are read once that long has passed since the last
replay (a step waiting for a silent rank has been judged by then).
HostSuspect takes the replays of one scenario (the same alerts at the same
steps under other run ids) for one run. Standard library only.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import tw_harness  # noqa: E402
GENERATOR = os.path.join(ROOT, "tests", "testdata", "scenarios", "generate.py")
CHUNK = 100


def start_server(bindir, work, config=None):
    """(the server's process, its address): tools/tw_harness.py's launcher."""
    try:
        server = tw_harness.Server(bindir, work, config=config, db="tw.db")
    except tw_harness.ServerError as e:
        sys.exit(str(e))
    return server.proc, server.address


def ctl(bindir, address, *args):
    r = subprocess.run([os.path.join(bindir, "trainwatchctl"), "--server", address,
                        *args], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"trainwatchctl {' '.join(args)}: {r.stdout}{r.stderr}")
    return r.stdout


def replay_stage(bindir, address, paths, work):
    if len(paths) == 1:
        ctl(bindir, address, "replay", paths[0])
        return
    chunks = {}  # chunk -> [path per rank]
    for rank, path in enumerate(paths):
        with open(path) as f:
            head = f.readline()
            text = {}
            for line in f:
                j = json.loads(line)
                step = j["event"]["step"] if "event" in j else j["step"]
                text.setdefault(step // CHUNK, []).append(line)
        for c, lines in text.items():
            p = os.path.join(work, f"chunk{c}.rank{rank}.jsonl")
            with open(p, "w") as out:
                out.write(head)
                out.writelines(lines)
            chunks.setdefault(c, [None] * len(paths))[rank] = p
    for c in sorted(chunks):
        round_ = [p for p in chunks[c] if p]
        if c == min(chunks):
            for p in round_:
                ctl(bindir, address, "replay", p)
            continue
        procs = [subprocess.Popen([os.path.join(bindir, "trainwatchctl"), "--server",
                                   address, "replay", p], stdout=subprocess.DEVNULL)
                 for p in round_]
        for p in procs:
            p.wait()


def settled_alerts(bindir, address, run):
    last = None
    for _ in range(50):
        out = ctl(bindir, address, "alerts", "--run", run, "--json")
        if out == last:
            return json.loads(out)
        last = out
        time.sleep(0.1)
    return json.loads(last)


def measure(bindir, scenario, gen_dir):
    with tempfile.TemporaryDirectory(prefix="tw-delays-") as work:
        proc, address = start_server(bindir, work)
        try:
            for stage in scenario["replay"]:
                replay_stage(bindir, address, [os.path.join(gen_dir, f) for f in stage],
                             work)
            alerts = settled_alerts(bindir, address, scenario["run_id"])
        finally:
            proc.kill()
            proc.wait()
    failure = scenario["failure_step"] or 0
    rows = []
    for e in scenario["expected"]:
        starts = sorted(a["started_step"] for a in alerts
                        if a["alertname"] == e["alertname"] and a["started_step"] >= failure)
        rows.append(starts[0] - e["onset_step"] if starts else None)
    fires, pages = {}, set()
    for a in alerts:
        fires[a["alertname"]] = fires.get(a["alertname"], 0) + 1
        if a.get("severity") in ("warning", "critical") and not a.get("caused_by"):
            pages.add(a["alertname"])
    return rows, fires, pages


# Arrival orders of a multi-rank scenario's ranks (--orders).
ORDERS = ("all at once", "rank 0 first", "rank 0 last")
ORDER_RUN = {"all at once": "at-once", "rank 0 first": "rank0-first",
             "rank 0 last": "rank0-last"}


def rank_files(scenario, gen_dir):
    """{attempt: [(rank, path)]} of the scenario's files, from their run_start."""
    out = {}
    for stage in scenario["replay"]:
        for f in stage:
            path = os.path.join(gen_dir, f)
            with open(path) as fh:
                start = json.loads(fh.readline())["run_start"]
            out.setdefault(start.get("attempt", 0), []).append((start.get("rank", 0), path))
    return {a: sorted(files) for a, files in out.items()}


def replay_order(bindir, address, run, attempts, order):
    ctl_path = os.path.join(bindir, "trainwatchctl")
    for attempt in sorted(attempts):
        files = attempts[attempt]
        argv = [[ctl_path, "--server", address, "replay", path, "--run", run,
                 "--rank", str(rank)] for rank, path in files]
        if order == "all at once":
            procs = [subprocess.Popen(a, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True) for a in argv]
            outs = [(p, p.communicate()[0]) for p in procs]
            for p, out in outs:
                if p.returncode != 0:
                    sys.exit(f"trainwatchctl replay ({run}): {out}")
            continue
        for a in (argv if order == "rank 0 first" else reversed(argv)):
            r = subprocess.run(a, capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"{' '.join(a)}: {r.stdout}{r.stderr}")


def alert_key(a):
    return (a["alertname"], a["started_step"], a["onset_step"])


def compare_orders(bindir, scenarios, gen_dir, missing_after):
    multi = [s for s in scenarios if s.get("world_size", 1) > 1]
    if not multi:
        sys.exit("no multi-rank scenario among those named")
    differ = []
    with tempfile.TemporaryDirectory(prefix="tw-orders-") as work:
        config = os.path.join(work, "trainwatch.yaml")
        with open(config, "w") as f:
            f.write(f"ranks:\n  missing_after_seconds: {missing_after}\n")
        proc, address = start_server(bindir, work, config)
        try:
            for s in multi:
                attempts = rank_files(s, gen_dir)
                for order in ORDERS:
                    began = time.monotonic()
                    replay_order(bindir, address, f"{s['run_id']}/{ORDER_RUN[order]}",
                                 attempts, order)
                    last_replay = time.monotonic()
                    if last_replay - began >= missing_after:
                        print(f"warning: {s['name']} ({order}) took "
                              f"{last_replay - began:.1f} s, over --missing-after: ranks "
                              "not yet replayed may have counted as missing", file=sys.stderr)
            # A step that waits for a rank is judged once the timer (every
            # second) has declared the rank missing.
            time.sleep(max(0.0, last_replay + missing_after + 2 - time.monotonic()))
            print("| scenario | ranks | " + " | ".join(ORDERS) + " | equal |")
            print("|---" * (3 + len(ORDERS)) + "|")
            for s in multi:
                alerts = [settled_alerts(bindir, address,
                                         f"{s['run_id']}/{ORDER_RUN[o]}") for o in ORDERS]
                keys = [sorted(alert_key(a) for a in al) for al in alerts]
                same = all(k == keys[0] for k in keys)
                if not same:
                    differ.append(s["name"])
                cells = [", ".join(f"{n}@{st}/{on}" for n, st, on in k) or "none"
                         for k in keys]
                print(f"| {s['name']} | {s['world_size']} | " + " | ".join(cells) +
                      f" | {'yes' if same else 'NO'} |", flush=True)
                if not same:
                    for o, al in zip(ORDERS, alerts):
                        for a in sorted(al, key=alert_key):
                            print(f"  {s['name']} ({o}): {json.dumps(a, sort_keys=True)}",
                                  file=sys.stderr)
        finally:
            proc.kill()
            proc.wait()
    if differ:
        print(f"verdicts depend on the arrival order: {', '.join(differ)}", file=sys.stderr)
        return 1
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", action="append", required=True,
                    help="[LABEL=]DIR with trainwatch-server and trainwatchctl "
                    "(given twice: side by side)")
    ap.add_argument("--orders", action="store_true",
                    help="replay each multi-rank scenario in three arrival orders "
                    "and compare the alerts")
    ap.add_argument("--missing-after", type=int, default=5, metavar="SECONDS",
                    help="ranks.missing_after_seconds of the server (--orders)")
    ap.add_argument("names", nargs="*")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tw-scenarios-") as gen_dir:
        subprocess.run([sys.executable, GENERATOR, "--out", gen_dir, *args.names], check=True)
        with open(os.path.join(gen_dir, "expected.json")) as f:
            scenarios = json.load(f)["scenarios"]
        builds = [b.split("=", 1) if "=" in b else (b, b) for b in args.bin]
        if args.orders:
            rc = 0
            for label, d in builds:
                if len(builds) > 1:
                    print(f"\n{label}:\n")
                rc |= compare_orders(d, scenarios, gen_dir, args.missing_after)
            return rc
        heads = [label for label, _ in builds]
        print("| scenario | alert | onset | " + " | ".join(f"delay ({h})" for h in heads) +
              " | " + " | ".join(f"pages ({h})" for h in heads) + " |")
        print("|---" * (3 + 2 * len(heads)) + "|")
        for s in scenarios:
            results = [measure(d, s, gen_dir) for _, d in builds]
            pages = [", ".join(f"{n} x{r[1][n]}" for n in sorted(r[2])) or "none"
                     for r in results]
            expected = s["expected"] or [{"alertname": "(healthy)", "onset_step": "-"}]
            for i, e in enumerate(expected):
                delays = []
                for r in results:
                    d = r[0][i] if i < len(r[0]) else "-"
                    delays.append("missed" if d is None else str(d))
                print(f"| {s['name']} | {e['alertname']} | {e['onset_step']} | " +
                      " | ".join(delays) + " | " +
                      " | ".join(pages if i == 0 else [""] * len(pages)) + " |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
