#!/usr/bin/python3
"""Precursors of loss spikes, offline: candidate SpikeHazard rules calibrated
on the lab's tuning seeds and measured on its held-out seeds.

Reads the JSONL step logs that tools/lab/bench_lab.py saved (CONFIG-sSEED.jsonl
in --runs), labels them with tools/lab/labeller.py, and evaluates rules of
one shape:

    at step t, for each non-embedding layer L, x = the layer's statistic at t
    (g_over_sqrt_v_rms, update_rms_ratio, or the run's max_attn_logit);
    jump = ln(x_t / median(x over steps t-W .. t-1)) - alpha x ln(B),
    B = sqrt(1 / (1 - adam_beta2)) (the bound of g^2/v's RMS after a step);
    fire when jump >= theta in at least K layers; then stay quiet for C steps.

A firing at t is a hit when a labelled spike or divergence starts within
t + 1 .. t + 10 (lead 1..10 steps); a firing inside a labelled episode (the
spike is already visible) counts neither way; every other firing is a false
alarm. theta and K are chosen on the tuning seeds (the largest recall whose
precision is >= 0.5; the best F1 where none reaches it), then the same rule
is measured on the held-out seeds. Also given: hits with lead 0..10 (firing
on the onset's own step), since a hard batch's own record is often the
first high loss.

    /usr/bin/python3 tools/lab/hazard.py --runs build/lab [--held-out 2,3]
"""

import argparse
import json
import math
import pathlib
import re
import statistics
import sys
import warnings

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import labeller  # noqa: E402

WINDOW = 50
COOLDOWN = 20
LEAD_MAX = 10
TARGETS = ("spike", "divergence")
STATS = ("g_over_sqrt_v_rms", "update_rms_ratio", "max_attn_logit")
THETAS = [round(0.25 * i, 2) for i in range(-16, 25)]  # ln-ratio thresholds -4 .. 6
LAYER_COUNTS = (1, 2, 4, 8)
ALPHAS = (0.0, 0.5, 1.0)


def load(runs_dir):
    runs = []
    for path in sorted(pathlib.Path(runs_dir).glob("*-s*.jsonl")):
        m = re.match(r"(.+)-s(\d+)\.jsonl$", path.name)
        if not m:
            continue
        start, steps = labeller.read(path)
        runs.append({"config": m.group(1), "seed": int(m.group(2)), "start": start,
                     "steps": steps, "events": labeller.label(steps, start)})
    return runs


def jumps(run, stat, alpha):
    """Per step: the layers' jumps, sorted descending (numpy rows; NaN where
    a layer has no value or too short a history)."""
    steps = run["steps"]
    beta2 = run["start"].get("adam_beta2")
    bound = math.log(math.sqrt(1.0 / (1.0 - float(beta2)))) if beta2 else 0.0
    if stat == "max_attn_logit":
        cols = [[labeller._float(s.get("max_attn_logit")) for s in steps]]
    else:
        names = sorted({k for s in steps for k in s.get("layer_stats", {})
                        if not labeller._is_embedding(k)})
        cols = [[labeller._float(s.get("layer_stats", {}).get(k, {}).get(stat)) for s in steps]
                for k in names]
    x = np.array(cols, dtype=float).T  # [steps, layers]
    x[~(x > 0) | ~np.isfinite(x)] = np.nan
    n = x.shape[0]
    pad = np.full((WINDOW, x.shape[1]), np.nan)
    windows = sliding_window_view(np.vstack([pad, x[:-1]]), WINDOW, axis=0)  # [n, layers, W]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        med = np.nanmedian(windows, axis=2)
    enough = np.sum(np.isfinite(windows), axis=2) >= WINDOW // 2
    j = np.log(x / med) - alpha * bound
    j[~enough] = np.nan
    j = -np.sort(-np.nan_to_num(j, nan=-np.inf), axis=1)  # descending, NaN last
    return j[:n]


def fire_steps(run, js, theta, k):
    warmup = int(run["start"].get("warmup_steps", 0) or 0)
    fired, quiet_until = [], -1
    for s, j in zip(run["steps"], js):
        t = s["step"]
        if t < warmup or t <= quiet_until or len(j) < k:
            continue
        if j[k - 1] >= theta:  # the k-th largest jump
            fired.append(t)
            quiet_until = t + COOLDOWN
    return fired


def evaluate(runs, table, theta, k, lead_min=1):
    """table: {(config, seed): jumps}. Returns precision, recall, leads."""
    tp = fp = 0
    hits = total = 0
    leads = []
    for run in runs:
        targets = [e for e in run["events"] if e["kind"] in TARGETS]
        episodes = [(e["onset"], e["end"]) for e in targets]
        cut = min((e["onset"] for e in run["events"] if e["kind"] == "divergence"), default=None)
        fired = fire_steps(run, table[(run["config"], run["seed"])], theta, k)
        fired = [t for t in fired if cut is None or t <= cut]
        for t in fired:
            if any(t + lead_min <= on <= t + LEAD_MAX for on, _ in episodes):
                tp += 1
            elif any(on <= t < end for on, end in episodes):
                continue
            else:
                fp += 1
        for on, _ in episodes:
            total += 1
            before = [on - t for t in fired if lead_min <= on - t <= LEAD_MAX]
            if before:
                hits += 1
                leads.append(max(before))
    precision = tp / (tp + fp) if tp + fp else None
    recall = hits / total if total else None
    return {"precision": precision, "recall": recall, "fired": tp + fp, "tp": tp,
            "events": total, "hits": hits,
            "median_lead": statistics.median(leads) if leads else None}


def calibrate(runs, tables):
    best = None
    for (stat, alpha), table in tables.items():
        for k in LAYER_COUNTS:
            for theta in THETAS:
                r = evaluate(runs, table, theta, k)
                if r["precision"] is None or r["recall"] is None:
                    continue
                f1 = (2 * r["precision"] * r["recall"] / (r["precision"] + r["recall"])
                      if r["precision"] + r["recall"] else 0.0)
                key = (r["precision"] >= 0.5, r["recall"] if r["precision"] >= 0.5 else f1,
                       r["precision"])
                if best is None or key > best[0]:
                    best = (key, dict(stat=stat, alpha=alpha, k=k, theta=theta), r)
    return best


def _f(x, fmt="{:.2f}"):
    return "-" if x is None else fmt.format(x)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default=str(HERE.parent.parent / "build" / "lab"))
    ap.add_argument("--held-out", default="2,3")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    held = {int(s) for s in args.held_out.split(",") if s}
    runs = load(args.runs)
    tune = [r for r in runs if r["seed"] not in held]
    test = [r for r in runs if r["seed"] in held]
    tables = {}
    for stat in STATS:
        for alpha in (ALPHAS if stat != "max_attn_logit" else (0.0,)):
            tables[(stat, alpha)] = {(r["config"], r["seed"]): jumps(r, stat, alpha) for r in runs}
    print(f"{len(tune)} tuning runs, {len(test)} held-out runs; window {WINDOW}, "
          f"cooldown {COOLDOWN}, hit = lead 1..{LEAD_MAX}\n")
    print("| statistic | alpha (threshold x B^alpha) | best K | best theta (ln) | "
          "tuning P | tuning R | held-out P | held-out R | held-out median lead | "
          "held-out P, R with lead 0..10 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    results = []
    for (stat, alpha), table in tables.items():
        best = calibrate(tune, {(stat, alpha): table})
        if best is None:
            continue
        _, rule, r_tune = best
        r_test = evaluate(test, table, rule["theta"], rule["k"])
        r_test0 = evaluate(test, table, rule["theta"], rule["k"], lead_min=0)
        results.append((rule, r_tune, r_test, r_test0))
        print(f"| {stat} | {alpha:g} | {rule['k']} | {rule['theta']:g} | "
              f"{_f(r_tune['precision'])} | {_f(r_tune['recall'])} | "
              f"{_f(r_test['precision'])} ({r_test['tp']}/{r_test['fired']}) | "
              f"{_f(r_test['recall'])} ({r_test['hits']}/{r_test['events']}) | "
              f"{_f(r_test['median_lead'], '{:g}')} | "
              f"{_f(r_test0['precision'])}, {_f(r_test0['recall'])} |")
    best = calibrate(tune, tables)
    if best:
        _, rule, r_tune = best
        table = tables[(rule["stat"], rule["alpha"])]
        r_test = evaluate(test, table, rule["theta"], rule["k"])
        print(f"\nchosen on the tuning seeds: {rule}; tuning {r_tune}; held-out {r_test}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"rule": rule, "tuning": r_tune, "held_out": r_test,
                           "all": [dict(rule=a, tuning=b, held_out=c, held_out_lead0=d)
                                   for a, b, c, d in results]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
