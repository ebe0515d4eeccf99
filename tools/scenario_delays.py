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
and the change). Standard library only.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GENERATOR = os.path.join(ROOT, "tests", "testdata", "scenarios", "generate.py")
CHUNK = 100


def start_server(bindir, work):
    log = open(os.path.join(work, "server.log"), "w+")
    proc = subprocess.Popen(
        [os.path.join(bindir, "trainwatch-server"), "--listen", "127.0.0.1:0",
         "--metrics-listen", "127.0.0.1:0", "--db", os.path.join(work, "tw.db")],
        stdout=log, stderr=subprocess.STDOUT)
    for _ in range(600):
        log.seek(0)
        m = re.search(r"gRPC on [^:]+:(\d+), /metrics", log.read())
        if m:
            return proc, f"127.0.0.1:{m.group(1)}"
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    proc.kill()
    log.seek(0)
    sys.exit(f"trainwatch-server did not start: {log.read()}")


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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", action="append", required=True,
                    help="[LABEL=]DIR with trainwatch-server and trainwatchctl "
                    "(given twice: side by side)")
    ap.add_argument("names", nargs="*")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tw-scenarios-") as gen_dir:
        subprocess.run([sys.executable, GENERATOR, "--out", gen_dir, *args.names], check=True)
        with open(os.path.join(gen_dir, "expected.json")) as f:
            scenarios = json.load(f)["scenarios"]
        builds = [b.split("=", 1) if "=" in b else (b, b) for b in args.bin]
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
    main()
