#!/usr/bin/python3
"""The lab benchmark: how trainwatch's alerts do on real (tiny) instabilities.

Trains the lab's runs (tools/lab/lab_lm.py: CONFIGS x seeds), each streamed
live through the Python client into one real trainwatch-server (a free
loopback port, a temporary SQLite file) and saved as JSONL; labels every run
with tools/lab/labeller.py; reads the server's alerts (`trainwatchctl alerts
--json`); and prints, per alertname, precision, recall and median delay
(started_step - labelled onset) against the labels, and false pages
(critical + warning, not caused_by another alert) per 10,000 healthy steps,
as a markdown table (docs/lab.md, "Judged on the lab").

    PYTHONPATH=build/python /usr/bin/python3 tools/lab/bench_lab.py \\
        --build build --runs build/lab [--jobs 2] [--seeds 0,1,2,3]

--replay judges runs already in --runs (their JSONL) again, through
`trainwatchctl replay`, without training: the way to re-judge a changed
server on the same records (a run's alerts are a function of its records,
docs/contracts.md, so they are the ones the live stream got); --train-only
trains and saves them without a server. Seeds in --held-out (default 2,3) are never
used for tuning (tools/lab/hazard.py calibrates on the others); the table
gives both sets' figures together and the held-out ones alone.

Not a test: it takes ~30 minutes on one core. A small subset runs in ctest
(tests/lab/test_lab.py, label `lab`).
"""

import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import labeller  # noqa: E402
import tw_harness  # noqa: E402
from lab_lm import CONFIGS  # noqa: E402


# Which labelled kinds an alert may be right about. The first is the one its
# recall is measured on; the others are consequences it may also name (a
# loss spike's norm spike). Alerts not listed are matched against any kind.
MATCH = {
    "LossSpike": ("spike", "divergence"),
    "NonFiniteUpdate": ("divergence",),
    "AttentionLogitGrowth": ("logit_growth",),
    "LogZDrift": ("logz_drift",),
    "LayerUpdateStall": ("stall",),
    "GradNormSpike": ("norm_spike", "spike", "divergence"),
    "AdamStaleSecondMoment": ("spike", "divergence", "norm_spike"),
    "SpikeHazard": ("spike",),
    "GradNormDrift": ("divergence", "logit_growth", "logz_drift"),
    "ClipFractionHigh": ("divergence", "logit_growth", "logz_drift"),
}
# An alert names an event when its started_step is in [onset - early, end + late].
EVENT_KINDS = ("spike", "divergence", "norm_spike")
EVENT_EARLY, EVENT_LATE = 10, 0
LEVEL_EARLY, LEVEL_LATE = 1000, 100  # level alerts may forecast (horizon 2000)
# What each configuration is for (the table's "expected" column).
PURPOSE = {
    "healthy": "nothing", "spike": "spike", "spike-b2-099": "spike",
    "spike-hot": "spike", "diverge": "divergence", "logit-growth": "logit_growth",
    "logz-drift": "logz_drift", "stall": "stall", "corrupt": "norm_spike",
}


def Server(bin_dir, workdir, config=None):
    """A trainwatch-server on free loopback ports with a database in
    workdir (tools/tw_harness.py, the one launcher)."""
    return tw_harness.Server(bin_dir, workdir, config=config, db="tw.db")


def run_id(config, seed):
    return f"lab/{config}/s{seed}"


def paths(runs_dir, config, seed):
    stem = pathlib.Path(runs_dir) / f"{config}-s{seed}"
    return stem.with_suffix(".jsonl"), stem.with_suffix(".meta.json"), stem.with_suffix(".log")


def train_all(server, jobs_list, runs_dir, jobs, skip_done=False):
    """Trains (config, seed) runs, `jobs` at a time, each streaming to server.
    skip_done (--train-only): leaves runs already saved, or being trained
    by another --train-only process (its .log claimed), alone."""
    pending = list(jobs_list)
    running = []
    while pending or running:
        while pending and len(running) < jobs:
            config, seed = pending.pop(0)
            out, meta, log = paths(runs_dir, config, seed)
            if skip_done:
                try:
                    os.close(os.open(log, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                except FileExistsError:
                    continue
            cmd = [sys.executable, str(HERE / "lab_lm.py"), "--config", config, "--seed", str(seed),
                   "--run", run_id(config, seed), "--out", str(out), "--meta", str(meta)]
            if server is not None:
                cmd += ["--server", server.address]
            running.append(((config, seed), subprocess.Popen(
                cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT)))
        time.sleep(0.5)
        for item in list(running):
            (config, seed), proc = item
            if proc.poll() is not None:
                running.remove(item)
                status = "ok" if proc.returncode == 0 else f"FAILED rc={proc.returncode}"
                print(f"  trained {run_id(config, seed)}: {status}", file=sys.stderr, flush=True)
                if proc.returncode != 0:
                    raise RuntimeError(f"{run_id(config, seed)} failed: see "
                                       f"{paths(runs_dir, config, seed)[2]}")


def _without_update_ratio(src, dst):
    """A copy of a step log without update_rms_ratio, for a server whose
    proto predates it."""
    with open(src) as f, open(dst, "w") as g:
        for line in f:
            obj = json.loads(line)
            for stat in obj.get("layer_stats", {}).values():
                stat.pop("update_rms_ratio", None)
            g.write(json.dumps(obj) + "\n")


def replay_all(server, jobs_list, runs_dir, tmp):
    for config, seed in jobs_list:
        out = paths(runs_dir, config, seed)[0]
        try:
            server.ctl("replay", str(out), "--run", run_id(config, seed))
        except RuntimeError as e:
            if "update_rms_ratio" not in str(e):
                raise
            stripped = pathlib.Path(tmp) / out.name
            _without_update_ratio(out, stripped)
            server.ctl("replay", str(stripped), "--run", run_id(config, seed))
        print(f"  replayed {run_id(config, seed)}", file=sys.stderr, flush=True)


# -- scoring --------------------------------------------------------------------


def _window(kind, event):
    if kind in EVENT_KINDS:
        return event["onset"] - EVENT_EARLY, event["end"] + EVENT_LATE
    return event["onset"] - LEVEL_EARLY, event["end"] + LEVEL_LATE


def _matches(alert, events):
    kinds = MATCH.get(alert["alertname"])
    for e in events:
        if kinds is not None and e["kind"] not in kinds:
            continue
        lo, hi = _window(e["kind"], e)
        if lo <= alert["started_step"] <= hi:
            return e
    return None


def _inhibitions(path=HERE.parent.parent / "deploy" / "alertmanager" / "alertmanager.yml"):
    """(source regex, target regex) of the shipped Alertmanager inhibit rules."""
    try:
        text = pathlib.Path(path).read_text()
    except OSError:
        return None
    rules = re.findall(r"source_matchers: \['(\w+)=~?\"([^\"]+)\"'\]\s*\n\s*"
                       r"target_matchers: \['(\w+)=~?\"([^\"]+)\"'\]", text)
    return [(sk, re.compile(f"^(?:{sv})$"), tk, re.compile(f"^(?:{tv})$"))
            for sk, sv, tk, tv in rules]


INHIBITS = _inhibitions()


def _is_page(alert):
    """A critical or warning alert that the shipped Alertmanager does not
    mute: one with caused_by is muted only when an inhibit rule has its
    cause as source and it as target (a LossDivergence caused_by its
    LossSpike is not: the spike is info, the divergence is the page)."""
    if alert["severity"] not in ("critical", "warning"):
        return False
    cause = alert.get("caused_by")
    if not cause:
        return True
    if INHIBITS is None:
        return False
    return not any(sk == "alertname" and sv.match(cause) and tv.match(str(alert.get(tk, "")))
                   for sk, sv, tk, tv in INHIBITS)


def alerts_by_run(alerts):
    """{run: [alert]} of `trainwatchctl alerts --json`'s list."""
    out = {}
    for a in alerts:
        out.setdefault(a["run"], []).append(a)
    return out


def healthy_pages_line(runs, by_run, purpose, run_id):
    """The labs' line naming every page on a healthy run: runs are (name,
    seed, ...) tuples, purpose(name) and run_id(name, seed) the lab's own."""
    hp = {}
    for name, seed, *_ in runs:
        if purpose(name) == "healthy":
            for a in by_run.get(run_id(name, seed), []):
                if _is_page(a):
                    hp.setdefault(a["alertname"], []).append(f"{name}/s{seed}@{a['started_step']}")
    return "Every page on a healthy run (any alertname): " + ("; ".join(
        f"{k} x{len(v)} ({', '.join(v)})" for k, v in sorted(hp.items())) or "none") + "."


def score(runs, alerts_by_run):
    """runs: [(config, seed, label dict)]. Returns (rows, totals)."""
    names = sorted({a["alertname"] for al in alerts_by_run.values() for a in al}
                   | {"LossSpike", "AttentionLogitGrowth", "LogZDrift", "LayerUpdateStall",
                      "NonFiniteUpdate", "AdamStaleSecondMoment", "GradNormSpike"})
    healthy_steps = sum(hi - lo for _, _, lab in runs for lo, hi in lab["healthy_steps"])
    rows = []
    for name in names:
        fired = matched = 0
        false_pages = 0
        healthy_cfg_pages = 0
        primary = MATCH.get(name, (None,))[0]
        events = hits = 0
        delays = []
        for config, seed, lab in runs:
            al = [a for a in alerts_by_run.get(run_id(config, seed), []) if a["alertname"] == name]
            for a in al:
                fired += 1
                if _matches(a, lab["events"]) is not None:
                    matched += 1
                elif _is_page(a) and any(lo <= a["started_step"] < hi
                                         for lo, hi in lab["healthy_steps"]):
                    false_pages += 1
                if _is_page(a) and config == "healthy":
                    healthy_cfg_pages += 1
            for e in lab["events"]:
                if e["kind"] != primary:
                    continue
                events += 1
                lo, hi = _window(e["kind"], e)
                starts = [a["started_step"] for a in al if lo <= a["started_step"] <= hi]
                if starts:
                    hits += 1
                    delays.append(min(starts) - e["onset"])
        severity = sorted({a["severity"] for al in alerts_by_run.values() for a in al
                           if a["alertname"] == name})
        rows.append({
            "alertname": name, "severity": ",".join(severity) or "-", "kind": primary or "any",
            "fired": fired, "precision": matched / fired if fired else None,
            "events": events, "recall": hits / events if events else None,
            "median_delay": statistics.median(delays) if delays else None,
            "false_pages": false_pages,
            "false_pages_per_10k": 1e4 * false_pages / healthy_steps if healthy_steps else None,
            "healthy_config_pages": healthy_cfg_pages,
        })
    return rows, {"healthy_steps": healthy_steps, "runs": len(runs)}


def _f(x, fmt="{:.2f}"):
    return "-" if x is None else fmt.format(x)


def alert_table(rows):
    """The per-alert table of holdout.py and moe_lab.py (score()'s rows)."""
    out = ["| alertname | severity | judged on | fired | precision | events | recall | "
           "median delay (steps) | false pages | pages on healthy runs |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['alertname']} | {r['severity']} | {r['judged_on']} | {r['fired']} | "
                   f"{_f(r['precision'])} | {r['events']} | {_f(r['recall'])} | "
                   f"{_f(r['median_delay'], '{:g}')} | {r['false_pages']} | "
                   f"{r['healthy_pages']} (of {r['healthy_runs']} runs) |")
    return "\n".join(out)


def table(rows, totals):
    out = ["| alertname | severity | judged on | fired | precision | events | recall | "
           "median delay (steps) | false pages | per 10k healthy steps | pages on healthy runs |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if not r["fired"] and not r["events"]:
            continue
        out.append(f"| {r['alertname']} | {r['severity']} | {r['kind']} | {r['fired']} | "
                   f"{_f(r['precision'])} | {r['events']} | {_f(r['recall'])} | "
                   f"{_f(r['median_delay'], '{:g}')} | {r['false_pages']} | "
                   f"{_f(r['false_pages_per_10k'], '{:.1f}')} | {r['healthy_config_pages']} |")
    out.append("")
    out.append(f"{totals['runs']} runs, {totals['healthy_steps']} healthy steps "
               f"(labelled: outside [onset - 10, end + 100) of every event).")
    return "\n".join(out)


def runs_table(runs, alerts_by_run):
    out = ["| run | steps | labelled events | pages (alertname@started_step) |",
           "|---|---|---|---|"]
    for config, seed, lab in runs:
        ev = {}
        for e in lab["events"]:
            ev.setdefault(e["kind"], []).append(e["onset"])
        evs = "; ".join(f"{k} x{len(v)} @{','.join(map(str, v[:6]))}{'...' if len(v) > 6 else ''}"
                        for k, v in ev.items()) or "none"
        pages = [f"{a['alertname']}@{a['started_step']}"
                 for a in alerts_by_run.get(run_id(config, seed), []) if _is_page(a)]
        pg = ", ".join(pages[:8]) + (f" (+{len(pages) - 8})" if len(pages) > 8 else "")
        out.append(f"| {run_id(config, seed)} | {lab['steps']} | {evs} | {pg or 'none'} |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=str(HERE.parent.parent / "build"))
    ap.add_argument("--runs", default=None, help="where runs are written (default BUILD/lab)")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--seeds", default="0,1,2,3")
    ap.add_argument("--held-out", default="2,3")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--replay", action="store_true",
                    help="replay the saved JSONL instead of training")
    ap.add_argument("--train-only", action="store_true",
                    help="train and save the runs without a server (judge later with --replay)")
    ap.add_argument("--server-config", default=None,
                    help="YAML for trainwatch-server --config (default: its built-in defaults)")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    runs_dir = pathlib.Path(args.runs or pathlib.Path(args.build) / "lab")
    runs_dir.mkdir(parents=True, exist_ok=True)
    configs = [c for c in args.configs.split(",") if c]
    seeds = [int(s) for s in args.seeds.split(",") if s]
    held_out = {int(s) for s in args.held_out.split(",") if s}
    jobs_list = [(c, s) for c in configs for s in seeds]

    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(pathlib.Path(args.build) / "python"), os.environ.get("PYTHONPATH", "")])
    if args.train_only:
        train_all(None, jobs_list, runs_dir, args.jobs, skip_done=True)
        return 0
    with tempfile.TemporaryDirectory(prefix="tw-lab-") as tmp:
        server = Server(pathlib.Path(args.build) / "bin", tmp, args.server_config)
        try:
            started = time.monotonic()
            if args.replay:
                replay_all(server, jobs_list, runs_dir, tmp)
            else:
                train_all(server, jobs_list, runs_dir, args.jobs)
            time.sleep(1.0)
            alerts = server.alerts()
        finally:
            server.stop()
    by_run = alerts_by_run(alerts)
    runs = [(c, s, labeller.label_file(paths(runs_dir, c, s)[0])) for c, s in jobs_list]
    rows, totals = score(runs, by_run)
    held = [r for r in runs if r[1] in held_out]
    held_rows, held_totals = score(held, by_run) if held else ([], None)
    print(f"## All runs ({len(runs)}: configs {', '.join(configs)}; seeds "
          f"{', '.join(map(str, seeds))}; {time.monotonic() - started:.0f} s)\n")
    print(table(rows, totals))
    if held:
        print(f"\n## Held-out seeds only ({', '.join(map(str, sorted(held_out)))})\n")
        print(table(held_rows, held_totals))
    print("\n## Runs\n")
    print(runs_table(runs, by_run))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "totals": totals, "held_out_rows": held_rows,
                       "labels": {run_id(c, s): lab for c, s, lab in runs},
                       "alerts": alerts}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
