#!/usr/bin/python3
"""The lab held out by family: trainwatch's alerts judged on configurations
that none of its constants (nor the labeller's) was tuned on.

Trains every (family, seed) once to a JSONL step log, cached under --runs
(default build/lab-holdout/runs; a run is trained again only when its
configuration changed): the held-out families (lab_lm.FAMILIES: other widths
and depths, bf16, tied embeddings, HF / Megatron / GPT-2 / torchtitan layer
names by parameter or by module, SGD, a Zipfian language; slow and fast
divergence, spikes, logit growth, log Z drift, vanishing updates, healthy
controls) and the fit set (lab_lm.CONFIGS, the 9 configurations the lab's
constants were tuned on, at --fit-steps). Training is one process at a
time, under nice, OPENBLAS_NUM_THREADS=1; it needs torch only.

Then labels each run (labeller.py: from its records alone), replays each log
through a real server (build/bin/trainwatch-server on loopback ports with a
temporary SQLite file; `trainwatchctl replay`, then `alerts --json`; with
--server-config, default hazard_on.yaml, so that SpikeHazard runs), and
scores per alert: precision, recall and median delay (started_step -
labelled onset) on the held-out families and, separately, on the fit set,
with false pages (critical or warning, not muted by the shipped Alertmanager
inhibit rules through its caused_by, outside every label window the alert
may name) and pages on healthy families.

Windows (an alert names a label when its started_step is in the window):
spike [onset - 10, onset + 50]; divergence [onset - 10, onset + 100]
(LossDivergence is judged on the divergences whose loss stays finite and on
slow divergences: NaN is NonFiniteUpdate's, judged on a divergence's first
non-finite loss);
slow_divergence [onset - 10, crossed + 100] (crossed: the first step whose
level is >= 2x the best; a detector cannot name a 2x rise before it has
happened); level labels (logit_growth, logz_drift, stall) [onset - 1000,
end + 100] (forecasts may fire early), as bench_lab.py does.

Leave-one-family-out for each rule of LOFO_RULES (LossSpike's
loss_spike.log_sigmas x min_ratio, LossDivergence's loss_divergence.sigmas
x early_ratio): for each held-out family, the grid value with the best F1
of the alert on its labels over all the OTHER families (held-out and fit)
is chosen, and judged on the left-out family.

    PYTHONPATH=build/python /usr/bin/python3 tools/lab/holdout.py --build build
    # runs already cached: --replay-only (never trains); --train-only (no server)
"""

import argparse
import itertools
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import labeller  # noqa: E402
import lab_lm  # noqa: E402
from bench_lab import (Server, _f, _is_page, alert_table, alerts_by_run,  # noqa: E402
                       healthy_pages_line)
# The label an alert's recall is measured on first, then the kinds it may
# also name (a consequence at the same steps).
MATCH = {
    "LossSpike": ("spike", "divergence", "slow_divergence"),
    "LossDivergence": ("finite_divergence+slow_divergence", "divergence", "spike"),
    "NonFiniteUpdate": ("nonfinite",),
    "AttentionLogitGrowth": ("logit_growth",),
    "LogZDrift": ("logz_drift",),
    "LayerUpdateStall": ("stall",),
    "AdamStaleSecondMoment": ("spike", "divergence", "slow_divergence", "norm_spike"),
    "SpikeHazard": ("spike", "divergence"),
    "GradNormDrift": ("divergence+slow_divergence", "logit_growth", "logz_drift"),
    "GradNormSpike": ("norm_spike", "spike", "divergence", "hard_batch"),
    "ClipFractionHigh": ("divergence+slow_divergence", "logit_growth", "logz_drift"),
}
SCORED = ("LossSpike", "LossDivergence", "AttentionLogitGrowth", "LogZDrift",
          "LayerUpdateStall", "AdamStaleSecondMoment", "SpikeHazard", "NonFiniteUpdate",
          "GradNormDrift", "ClipFractionHigh")
WINDOWS = {"spike": (10, 50), "divergence": (10, 100), "nonfinite": (10, 100),
           "finite_divergence": (10, 100),
           "slow_divergence": (10, 100), "norm_spike": (10, 0), "hard_batch": (10, 0)}
LEVEL_EARLY, LEVEL_LATE = 1000, 100
def shipped(section, keys, path=HERE.parent.parent / "deploy" / "trainwatch.yaml"):
    """The values of section.keys in the shipped config (a tuple)."""
    found, inside = {}, False
    for line in pathlib.Path(path).read_text().splitlines():
        if not line.startswith(" ") and line.strip():
            inside = line.split("#")[0].strip() == f"{section}:"
            continue
        key, _, rest = line.split("#")[0].strip().partition(":")
        if inside and key in keys:
            found[key] = float(rest)
    return tuple(found.get(k) for k in keys)


# The rules whose constants are chosen leave-one-family-out: two config
# keys each, a grid of values, scored by the alert's F1 on its labels.
LOFO_RULES = (
    {"alert": "LossSpike", "section": "loss_spike", "keys": ("log_sigmas", "min_ratio"),
     "grid": ((3.0, 4.0, 5.0, 6.0), (1.3, 1.5, 2.0))},
    {"alert": "LossDivergence", "section": "loss_divergence", "keys": ("sigmas", "early_ratio"),
     "grid": ((3.0, 4.0, 5.0), (1.3, 1.5, 1.75))},
)
for _rule in LOFO_RULES:
    _rule["shipped"] = shipped(_rule["section"], _rule["keys"])


def purpose(name):
    """What a family is for: 'healthy' for the controls."""
    return "healthy" if name.startswith("healthy") else name


def run_id(name, seed):
    return f"lab/{name}/s{seed}"


def stem(runs_dir, name, seed):
    return pathlib.Path(runs_dir) / f"{name}-s{seed}"


def cfg_of(name, fit_steps):
    return lab_lm.config(name, steps=fit_steps if name in lab_lm.CONFIGS else None)


def _cached(runs_dir, name, seed, fit_steps):
    s = stem(runs_dir, name, seed)
    out, meta = s.with_suffix(".jsonl"), s.with_suffix(".meta.json")
    if not (out.exists() and meta.exists()):
        return False
    want = json.loads(json.dumps(cfg_of(name, fit_steps)))
    have = json.loads(meta.read_text()).get("config", {})
    # A knob added since, at its neutral default, leaves a run as it was.
    for k, v in lab_lm.STYLED.items():
        if k not in have and k in want and want[k] == v:
            have[k] = v
    return have == want


def train_all(jobs, runs_dir, fit_steps, lock=None):
    """Trains what is not cached, one process at a time, nice 10 (with
    lock: under `flock LOCK`, sharing one training slot with other scripts)."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    for name, seed in jobs:
        if _cached(runs_dir, name, seed, fit_steps):
            continue
        s = stem(runs_dir, name, seed)
        tmp = s.with_suffix(".jsonl.tmp")
        cmd = ["nice", "-n", "10", sys.executable, str(HERE / "lab_lm.py"), "--config", name,
               "--seed", str(seed), "--run", run_id(name, seed), "--out", str(tmp),
               "--meta", str(s.with_suffix(".meta.json"))]
        if name in lab_lm.CONFIGS:
            cmd += ["--steps", str(fit_steps)]
        if lock:
            cmd = ["flock", str(lock)] + cmd
        t0 = time.monotonic()
        with open(s.with_suffix(".log"), "w") as log:
            r = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        if r.returncode != 0:
            raise RuntimeError(f"{run_id(name, seed)} failed: see {s.with_suffix('.log')}")
        tmp.rename(s.with_suffix(".jsonl"))
        print(f"  trained {run_id(name, seed)} in {time.monotonic() - t0:.0f} s",
              file=sys.stderr, flush=True)


def replay(build, jobs, runs_dir, config_text=None):
    """{run: [alert]} of every job's log replayed through one fresh server."""
    with tempfile.TemporaryDirectory(prefix="tw-holdout-") as tmp:
        cfg = None
        if config_text is not None:
            cfg = pathlib.Path(tmp) / "server.yaml"
            cfg.write_text(config_text)
        server = Server(pathlib.Path(build) / "bin", tmp, cfg)
        try:
            for name, seed in jobs:
                try:
                    server.ctl("replay", str(stem(runs_dir, name, seed).with_suffix(".jsonl")),
                               "--run", run_id(name, seed))
                except RuntimeError:
                    if server.proc.poll() is not None:
                        raise RuntimeError(
                            f"trainwatch-server exited (status {server.proc.returncode}) while "
                            f"replaying {run_id(name, seed)}; its log:\n"
                            f"{server.log_path.read_text()[-2000:]}") from None
                    raise
            time.sleep(0.5)
            alerts = server.alerts()
        finally:
            server.stop()
    return alerts_by_run(alerts)


# -- scoring --------------------------------------------------------------------


def _events_for_scoring(lab):
    """The labels, plus a 'nonfinite' label at each divergence's first
    non-finite loss (what NonFiniteUpdate can name)."""
    out = list(lab["events"])
    for e in lab["events"]:
        if e["kind"] == "divergence" and "nonfinite_step" in e:
            out.append({"kind": "nonfinite", "onset": e["nonfinite_step"], "end": e["end"]})
        elif e["kind"] == "divergence":  # LossDivergence's (NaN is NonFiniteUpdate's)
            out.append(dict(e, kind="finite_divergence"))
    return out


def _window(e):
    if e["kind"] in WINDOWS:
        early, late = WINDOWS[e["kind"]]
        if e["kind"] == "slow_divergence":
            return e["onset"] - early, max(e["onset"], e.get("crossed", e["onset"])) + late
        if e["kind"] in ("norm_spike", "hard_batch"):
            return e["onset"] - early, e["end"] + late
        return e["onset"] - early, e["onset"] + late
    return e["onset"] - LEVEL_EARLY, e["end"] + LEVEL_LATE


def _kinds(name, primary_only=False):
    kinds = MATCH.get(name)
    if kinds is None:
        return None
    out = []
    for k in kinds[:1] if primary_only else kinds:
        out.extend(k.split("+"))
    return tuple(out)


def _names(alert, events):
    kinds = _kinds(alert["alertname"])
    for e in events:
        if kinds is not None and e["kind"] not in kinds:
            continue
        lo, hi = _window(e)
        if lo <= alert["started_step"] <= hi:
            return e
    return None


def score(runs, alerts_by_run, names=SCORED):
    """runs: [(name, seed, label dict)]. One row per alertname."""
    rows = []
    healthy_runs = [r for r in runs if purpose(r[0]) == "healthy"]
    for alertname in names:
        primary = _kinds(alertname, primary_only=True) or ()
        fired = right = false_pages = healthy_pages = 0
        events = hits = 0
        delays = []
        severities = set()
        for name, seed, lab in runs:
            evs = _events_for_scoring(lab)
            al = [a for a in alerts_by_run.get(run_id(name, seed), [])
                  if a["alertname"] == alertname]
            for a in al:
                severities.add(a["severity"])
                fired += 1
                if _names(a, evs) is not None:
                    right += 1
                elif _is_page(a):
                    false_pages += 1
                if _is_page(a) and purpose(name) == "healthy":
                    healthy_pages += 1
            for e in evs:
                if e["kind"] not in primary:
                    continue
                events += 1
                lo, hi = _window(e)
                starts = [a["started_step"] for a in al if lo <= a["started_step"] <= hi]
                if starts:
                    hits += 1
                    delays.append(min(starts) - e["onset"])
        p = right / fired if fired else None
        r = hits / events if events else None
        rows.append({"alertname": alertname, "severity": ",".join(sorted(severities)) or "-",
                     "judged_on": "+".join(primary), "fired": fired, "precision": p,
                     "events": events, "recall": r,
                     "f1": (2 * p * r / (p + r) if p and r else 0.0),
                     "median_delay": statistics.median(delays) if delays else None,
                     "false_pages": false_pages, "healthy_runs": len(healthy_runs),
                     "healthy_pages": healthy_pages})
    return rows


def families_table(runs, by_run, seconds):
    out = ["| family | runs | labels (per seed: spikes and hard batches counted, others' "
           "onsets) | pages (alertname@started_step, all seeds) | s per run |",
           "|---|---|---|---|---|"]
    names = list(dict.fromkeys(r[0] for r in runs))
    for name in names:
        mine = [r for r in runs if r[0] == name]
        parts = []
        for kind in ("spike", "hard_batch", "divergence", "slow_divergence", "logit_growth",
                     "logz_drift", "stall"):
            per_seed = [[e for e in lab["events"] if e["kind"] == kind] for _, _, lab in mine]
            if not any(per_seed):
                continue
            if kind in ("spike", "hard_batch"):
                parts.append(f"{kind} {'/'.join(str(len(p)) for p in per_seed)}")
            else:
                parts.append(f"{kind} @{'/'.join(str(p[0]['onset']) if p else '-' for p in per_seed)}")
        labs = "; ".join(parts) or "none"
        pages = [f"{a['alertname']}@{a['started_step']}" for _, seed, _ in mine
                 for a in by_run.get(run_id(name, seed), []) if _is_page(a)]
        pg = ", ".join(pages[:6]) + (f" (+{len(pages) - 6})" if len(pages) > 6 else "")
        secs = [seconds.get((name, seed)) for _, seed, _ in mine]
        secs = [s for s in secs if s is not None]
        out.append(f"| {name} | {len(mine)} | {labs} | {pg or 'none'} | "
                   f"{_f(statistics.mean(secs) if secs else None, '{:.0f}')} |")
    return "\n".join(out)


# A divergence is confirmed by the loss not coming back: LossDivergence looks
# check_after_steps (50) after a spike's onset. A run that ends sooner after
# the onset cannot show it; such a label is listed, not scored.
CONFIRM_STEPS = 50


def divergences_table(runs, by_run):
    """Every divergence label, the first critical alert firing in the bar's
    window [onset - 10, onset + 100] (fired in it, or still firing when it
    opens), and whether there is one."""
    out = ["| run | label | onset | 2x level at | run ends | first critical alert | "
           "delay | in [onset - 10, onset + 100] |", "|---|---|---|---|---|---|---|---|"]
    strict = judged = 0
    for name, seed, lab in runs:
        for e in lab["events"]:
            if e["kind"] not in ("divergence", "slow_divergence"):
                continue
            onset = e.get("nonfinite_step", e["onset"]) if e["kind"] == "divergence" \
                and "nonfinite_step" in e and e["nonfinite_step"] - e["onset"] < 10 else e["onset"]
            # A critical alert that fired in the window, or one already
            # firing when it opens (the run was paged and still is).
            crit = sorted((a for a in by_run.get(run_id(name, seed), [])
                           if a["severity"] == "critical" and
                           (a["started_step"] >= onset - 10 or
                            a.get("resolved_step") is None or a["resolved_step"] >= onset - 10)),
                          key=lambda a: a["started_step"])
            first = crit[0] if crit else None
            cut = lab["steps"] - 1 - e["onset"] < CONFIRM_STEPS
            ok = first is not None and first["started_step"] <= e["onset"] + 100
            if not cut:
                judged += 1
                strict += ok
            out.append(
                f"| {run_id(name, seed)} | {e['kind']}"
                f"{' (NaN at ' + str(e['nonfinite_step']) + ')' if 'nonfinite_step' in e else ''} | "
                f"{e['onset']} | {e.get('crossed', '-')} | {lab['steps'] - 1} | "
                f"{first['alertname'] + '@' + str(first['started_step']) if first else 'none'}"
                f"{' (still firing at the onset)' if first and first['started_step'] < onset - 10 else ''} | "
                f"{first['started_step'] - e['onset'] if first else '-'} | "
                f"{'cut off: the run ends ' + str(lab['steps'] - 1 - e['onset']) + ' steps after the onset' if cut else ('yes' if ok else 'no')} |")
    return "\n".join(out), strict, judged


def lofo(build, jobs, runs, runs_dir, base_yaml, rule):
    """Leave-one-family-out for one rule's two config keys (LOFO_RULES)."""
    alert, keys, shipped_point = rule["alert"], rule["keys"], rule["shipped"]
    grid = list(itertools.product(*rule["grid"]))
    per_point = {}
    for pt in grid:
        text = (base_yaml or "") + f"\n{rule['section']}:\n" + "".join(
            f"  {k}: {v}\n" for k, v in zip(keys, pt))
        per_point[pt] = replay(build, jobs, runs_dir, text)
        print(f"  grid {rule['section']} {pt}: replayed", file=sys.stderr, flush=True)

    def f1(subset, point):
        r = score(subset, per_point[point], names=(alert,))[0]
        return r["f1"], r

    def f1_text(r):
        # No label and no alert: nothing to judge; alerts without a label:
        # F1 0 (false alarms only).
        return "-" if not r["events"] and not r["fired"] else f"{r['f1']:.2f}"

    label = _kinds(alert, primary_only=True)
    out = [f"| held-out family | {'+'.join(label)} labels | chosen {tuple(keys)} | shipped chosen? | "
           f"F1 on the others | left-out {alert}s | left-out precision | left-out recall | "
           "left-out F1 | shipped's left-out F1 |", "|---|---|---|---|---|---|---|---|---|---|"]
    chosen_all = []
    for fam in lab_lm.HELD_OUT:
        left = [r for r in runs if r[0] == fam]
        others = [r for r in runs if r[0] != fam]
        best = max(grid, key=lambda pt: (round(f1(others, pt)[0], 6), pt == shipped_point))
        chosen_all.append(best)
        _, on_left = f1(left, best)
        _, shipped_left = f1(left, shipped_point)
        out.append(f"| {fam} | {on_left['events']} | {best} | "
                   f"{'yes' if best == shipped_point else 'no'} | {f1(others, best)[0]:.2f} | "
                   f"{on_left['fired']} | {_f(on_left['precision'])} | "
                   f"{_f(on_left['recall'])} | {f1_text(on_left)} | {f1_text(shipped_left)} |")
    held = [r for r in runs if r[0] in lab_lm.HELD_OUT]
    grid_rows = [f"| {' | '.join(keys)} | held-out P | held-out R | held-out F1 | fit F1 |",
                 "|---|---|---|---|---|---|"]
    fit = [r for r in runs if r[0] in lab_lm.CONFIGS]
    for pt in grid:
        h = score(held, per_point[pt], names=(alert,))[0]
        fr = score(fit, per_point[pt], names=(alert,))[0] if fit else {"f1": None}
        grid_rows.append(f"| {' | '.join(map(str, pt))} | {_f(h['precision'])} | "
                         f"{_f(h['recall'])} | {h['f1']:.2f} | {_f(fr['f1'])} |")
    n_shipped = sum(1 for c in chosen_all if c == shipped_point)
    summary = (f"The shipped default {shipped_point} was chosen for {n_shipped} of "
               f"{len(chosen_all)} left-out families.")
    return "\n".join(out), "\n".join(grid_rows), summary


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=str(HERE.parent.parent / "build"))
    ap.add_argument("--runs", default=None, help="the cache (default BUILD/lab-holdout/runs)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--families", default=",".join(lab_lm.HELD_OUT))
    ap.add_argument("--fit", default=",".join(lab_lm.FIT),
                    help="fit configurations to judge too ('' for none)")
    ap.add_argument("--fit-steps", type=int, default=800)
    ap.add_argument("--server-config", default=str(HERE / "hazard_on.yaml"))
    ap.add_argument("--train-only", action="store_true")
    ap.add_argument("--replay-only", action="store_true", help="never train; cached runs only")
    ap.add_argument("--no-lofo", action="store_true")
    ap.add_argument("--labels-only", action="store_true",
                    help="print the families' labels and times; no server")
    ap.add_argument("--json", default=None)
    ap.add_argument("--lock", default=None, help="train under `flock LOCK` (a shared slot)")
    args = ap.parse_args(argv)
    runs_dir = pathlib.Path(args.runs or pathlib.Path(args.build) / "lab-holdout" / "runs")
    runs_dir.mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",") if s]
    fams = [f for f in args.families.split(",") if f]
    fit = [f for f in args.fit.split(",") if f]
    jobs = [(n, s) for s in seeds for n in fams + fit]
    if not args.replay_only:
        train_all(jobs, runs_dir, args.fit_steps, args.lock)
    else:
        missing = [j for j in jobs if not _cached(runs_dir, *j, args.fit_steps)]
        if missing:
            print(f"not cached (left out): {missing}", file=sys.stderr)
            jobs = [j for j in jobs if j not in missing]
    if args.train_only:
        return 0
    seconds = {}
    for n, s in jobs:
        meta = json.loads(stem(runs_dir, n, s).with_suffix(".meta.json").read_text())
        seconds[(n, s)] = meta.get("seconds")
    runs = [(n, s, labeller.label_file(stem(runs_dir, n, s).with_suffix(".jsonl")))
            for n, s in jobs]
    if args.labels_only:
        print(families_table(runs, {}, seconds))
        return 0
    base_yaml = pathlib.Path(args.server_config).read_text() if args.server_config else None
    t0 = time.monotonic()
    by_run = replay(args.build, jobs, runs_dir, base_yaml)
    held = [r for r in runs if r[0] in fams]
    fitr = [r for r in runs if r[0] in fit]
    cmd = "PYTHONPATH=build/python /usr/bin/python3 tools/lab/holdout.py --build build"
    print(f"# The lab held out by family\n\n`{cmd}` ({len(jobs)} runs: "
          f"{len(fams)} held-out families, {len(fit)} fit configurations x seeds "
          f"{','.join(map(str, seeds))}; server config {pathlib.Path(args.server_config).name if args.server_config else 'built-in'}; "
          f"replayed in {time.monotonic() - t0:.0f} s)\n")
    print(f"## Held-out families ({len(held)} runs)\n")
    print(alert_table(score(held, by_run)))
    if fitr:
        print(f"\n## Fit configurations ({len(fitr)} runs, {args.fit_steps} steps)\n")
        print(alert_table(score(fitr, by_run)))
    print("\n" + healthy_pages_line(held + fitr, by_run, purpose, run_id))
    div_table, strict, judged = divergences_table(held, by_run)
    print(f"\n## Divergences of the held-out families: a critical alert within "
          f"[onset - 10, onset + 100] on {strict} of {judged} (those the run's end does "
          f"not cut off)\n")
    print(div_table)
    print("\n## Families\n")
    print(families_table(runs, by_run, seconds))
    result = {"held_out_rows": score(held, by_run), "fit_rows": score(fitr, by_run),
              "labels": {run_id(n, s): lab for n, s, lab in runs}, "alerts": by_run}
    for rule in () if args.no_lofo else LOFO_RULES:
        t1 = time.monotonic()
        lofo_table, grid_table, summary = lofo(args.build, jobs, runs, runs_dir, base_yaml, rule)
        points = len(list(itertools.product(*rule["grid"])))
        print(f"\n## {rule['alert']}, leave one family out ({points}"
              f" grid points, {time.monotonic() - t1:.0f} s)\n")
        print(lofo_table)
        print(f"\n{summary}\n")
        print(grid_table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
