#!/usr/bin/python3
"""Offline labeller: what happened in a lab run, and when, from its own records.

Reads a JSONL step log (docs/contracts.md; the layer stats may carry
update_rms_ratio) and marks, by the rules below, the events a monitor should
name. It uses the full record, past and future (it is ground truth, not a
detector), knows nothing of trainwatch's server, and was written before any
alert of the lab was looked at. The numbers are the rules; change them only
with docs/lab.md ("The lab's labels").

Notation: l_t = ln(loss_t) (NaN when the loss is not finite or <= 0);
b = max(warmup_steps, 100), the first step with a settled baseline.

spike, hard_batch and divergence, from the loss
  Reference at step t: ref_t = median and sd_t = 1.4826 x MAD of l over the
  last 100 calm steps before t (steps outside every episode labelled so far;
  at least 20 of them, else no label at t); an episode therefore freezes
  its own reference. A step is high when l_t >= ref_t + max(ln 1.5, 3 sd_t)
  (>= 1.5x the reference and beyond its noise), and low when
  l_t < ref_t + max(ln 1.2, 2 sd_t).
  Spike onset: the first step t >= 50 that is high and with >= 3 of the 5
  steps t .. t+4 high. A high step with only 1 or 2 of its 5 high is a
  hard_batch (onset t, end after its last high step of the 5): a hard
  batch and its aftermath, not a spike. Recovery: the first step of 5
  consecutive low steps after the onset; the episode is [onset, recovery).
  Its peak is the largest loss / exp(ref) in it.
  An episode that never recovers is a divergence when its loss is ever
  non-finite, or the median of its last 50 losses is >= 2x the reference;
  otherwise it is a spike without a recovery (it ends with the run). A
  non-finite loss outside every episode starts a divergence whose onset is
  where the loss left its level: the first of the consecutive high steps
  just before it (the non-finite step itself when there are none);
  nonfinite_step: the first non-finite loss. Nothing after a divergence's
  onset is labelled.
slow_divergence, from the loss (when no divergence is labelled)
  Level L_t = median of the last 50 finite losses (>= 25 of them); best_t =
  min of L over [100, t], warmup included (a run whose loss climbs while
  its LR still warms up diverges; the first 100 steps are the loss's
  steep first fall). Condition: L_t >= 2 x best_t. Labelled when it
  holds on >= 100 consecutive steps (or on the run's last >= 50 steps);
  crossed = the first step of that stretch; onset = the last step before
  crossed with L <= 1.2 x best (where the climb began).
logit_growth, from max_attn_logit
  Baseline A0 = median over steps [b, b + 100). Condition at step
  t >= b + 100: the trailing median over 25 steps is >= 2 x A0, or >= 100
  (the cap MuonClip uses). Onset: the first step of the first stretch of
  >= 100 consecutive steps where the condition holds (an excursion during
  a loss spike is the spike's, not a growth). One event per run, to the
  last step where the condition holds.
logz_drift, from log_z
  Baseline Z0 = median over [b, b + 100). Condition: the trailing 25-step
  median m is >= 5 nats farther from 0 than Z0, on the same side
  (|m| - |Z0| >= 5 and (m - Z0) x sign(Z0) >= 5): a move toward 0 (what
  z-loss does) is not a drift. Onset and persistence as for logit_growth.
stall, from the layer stats and adam_eps (eps rule), or from the update
  (collapse rule); one stall per run, the earlier rule's.
  eps rule: a = g_over_sqrt_v_rms, the RMS of g / (sqrt(v_hat) + eps):
  Adam's normalised step, about 1 when eps is negligible, g/eps when eps
  dominates. Layers: every layer but the embeddings (names ending, after a
  parameter's ".weight" / ".bias", in "tok", "pos", "embed", "wte", "wpe",
  "embed_tokens", "word_embeddings", "tok_embeddings", ...: their rows of
  rare tokens see no gradient most of the time, so their RMS says little).
  A layer is stalled at t when, over the trailing 50 steps, the median of
  a is < 0.1 (its step is < 10% of Adam's nominal) and the median grad_rms
  is < adam_eps (eps, not a stale v inflated by a spike, is what shrinks
  it). Onset: the first t >= b with at least half of the layers stalled.
  Needs adam_eps in the RunStart.
  collapse rule (any optimizer): u_t = median over the non-embedding
  layers of update_rms_ratio; U0 = median u over [b, b + 100); stalled
  when the trailing 50-step median of u is <= U0 / 30 on >= 50 consecutive
  steps from b + 100 on; onset: the first of them. (30x, not 10x: a cosine
  decay to 10% of the peak LR shrinks the update 8-11x on healthy runs.)
norm_spike, from grad_norm
  A step t >= b with grad_norm >= 10x the median of the previous 100 finite
  norms (a corrupted or hard batch), whether or not the loss moves; steps
  within 20 of the previous such step belong to its event.

Usage: labeller.py RUN.jsonl [...] prints one JSON line per run:
{"file", "run", "steps", "warmup", "events": [{"kind", "onset", "end",
 "peak", ...}], "healthy_steps": [[lo, hi), ...]}. Healthy steps: every step
(warmup included) outside [onset - 10, end + 100) of every event but hard_batch
(and before any divergence or slow_divergence): where a page is a false
page.
"""

import json
import math
import statistics
import sys

import steplog

EMBEDDING_SUFFIXES = ("tok", "pos", "embed", "wte", "wpe", "embeddings", "embed_tokens",
                      "embed_positions", "word_embeddings", "position_embeddings",
                      "tok_embeddings", "pos_embeddings")

SPIKE_MIN_REF = 20          # calm steps needed for a reference
SPIKE_REF_STEPS = 100       # calm steps in the reference
SPIKE_HIGH_RATIO = math.log(1.5)
SPIKE_HIGH_SD = 3.0
SPIKE_LOW_RATIO = math.log(1.2)
SPIKE_LOW_SD = 2.0
SPIKE_RECOVER_STEPS = 5
SPIKE_FIRST_STEP = 50
SPIKE_SPAN = 5              # a spike: >= SPIKE_MIN_HIGH high steps of SPIKE_SPAN from its onset
SPIKE_MIN_HIGH = 3
DIVERGE_RATIO = math.log(2.0)
SLOW_LEVEL_STEPS = 50       # slow_divergence: the loss's level, a trailing median
SLOW_RATIO = 2.0            # ... at least this times the best level so far ...
SLOW_PERSIST = 100          # ... on this many consecutive steps (or to the run's end, >= 50)
SLOW_ONSET_RATIO = 1.2      # onset: the last step before, with the level within this of the best
STALL_COLLAPSE = 30.0       # stall: median update_rms_ratio this many times below its baseline
                            # (a cosine decay to 10% of the peak LR shrinks it 8-11x on healthy runs)
STALL_PERSIST = 50
DIVERGE_TAIL = 50
LEVEL_SETTLE = 100          # b = max(warmup, 100)
LEVEL_BASELINE_STEPS = 100
LEVEL_SMOOTH = 25
LOGIT_GROWTH = 2.0
LOGIT_CAP = 100.0
LOGZ_NATS = 5.0
STALL_SMOOTH = 50
STALL_STEP = 0.1
NORM_SPIKE_RATIO = 10.0
NORM_REF_STEPS = 100
HEALTHY_BEFORE = 10
HEALTHY_AFTER = 100


_float = steplog.number
read = steplog.read  # (run_start dict, [step dicts]) of a JSONL step log


def _median(xs):
    return statistics.median(xs) if xs else math.nan


def _mad_sd(xs, med):
    return 1.4826 * statistics.median([abs(x - med) for x in xs]) if xs else math.nan


def _trailing_median(values, t, n):
    w = [v for v in values[max(0, t - n + 1): t + 1] if math.isfinite(v)]
    return _median(w)


def loss_events(steps):
    """Spike, hard_batch and divergence episodes from the loss (rules in the
    module doc)."""
    n = len(steps)
    loss = [_float(s.get("loss")) for s in steps]
    ll = [math.log(x) if math.isfinite(x) and x > 0 else math.nan for x in loss]
    calm = []            # indices of calm steps so far (finite l)
    events = []
    t = 0

    def nonfinite_divergence(t, ref, hi):
        # The loss leaves its level: back over the high steps before it.
        i = t
        while (hi is not None and i - 1 >= 0 and math.isfinite(ll[i - 1])
               and ll[i - 1] >= hi):
            i -= 1
        e = {"kind": "divergence", "onset": steps[i]["step"], "end": steps[-1]["step"] + 1,
             "peak": math.inf, "nonfinite_step": steps[t]["step"],
             "why": f"loss {loss[t]} at step {steps[t]['step']}"}
        if ref is not None:
            e["reference_loss"] = round(math.exp(ref), 4)
        events.append(e)
        return events

    while t < n:
        ref_vals = [ll[i] for i in calm[-SPIKE_REF_STEPS:]]
        have_ref = len(ref_vals) >= SPIKE_MIN_REF
        ref = _median(ref_vals) if have_ref else None
        sd = _mad_sd(ref_vals, ref) if have_ref else None
        hi = ref + max(SPIKE_HIGH_RATIO, SPIKE_HIGH_SD * sd) if have_ref else None
        if not math.isfinite(ll[t]):
            if not math.isfinite(loss[t]):
                return nonfinite_divergence(t, ref, hi)
            t += 1
            continue
        if t >= SPIKE_FIRST_STEP and have_ref and t + 1 < n:
            lo = ref + max(SPIKE_LOW_RATIO, SPIKE_LOW_SD * sd)

            def high(i):
                return not math.isfinite(ll[i]) or ll[i] >= hi

            span = range(t, min(n, t + SPIKE_SPAN))
            highs = sum(1 for i in span if high(i))
            if high(t) and highs < SPIKE_MIN_HIGH and t + SPIKE_SPAN <= n:
                # A hard batch: high on 1-2 of 5 steps.
                if any(not math.isfinite(loss[i]) for i in span):
                    t = next(i for i in span if not math.isfinite(loss[i]))
                    return nonfinite_divergence(t, ref, hi)
                last = max(i for i in span if high(i))
                events.append({"kind": "hard_batch", "onset": steps[t]["step"],
                               "end": steps[last]["step"] + 1, "high_steps": highs,
                               "peak": round(math.exp(max(ll[i] for i in span if high(i))
                                                      - ref), 2),
                               "reference_loss": round(math.exp(ref), 4)})
                t = last + 1
                continue
            if high(t) and highs >= SPIKE_MIN_HIGH:
                # An episode: find its recovery.
                run_low, rec, peak, nonfinite = 0, None, 0.0, False
                i = t
                while i < n:
                    if not math.isfinite(loss[i]):
                        nonfinite = True
                        break
                    peak = max(peak, ll[i] - ref)
                    if ll[i] < lo:
                        run_low += 1
                        if run_low == SPIKE_RECOVER_STEPS:
                            rec = i - SPIKE_RECOVER_STEPS + 1
                            break
                    else:
                        run_low = 0
                    i += 1
                onset = steps[t]["step"]
                if rec is None:
                    tail = [x for x in ll[t:] if math.isfinite(x)][-DIVERGE_TAIL:]
                    if nonfinite or (tail and _median(tail) - ref >= DIVERGE_RATIO):
                        why = ("the loss became non-finite" if nonfinite else
                               f"the last {len(tail)} losses stay at "
                               f"{math.exp(_median(tail) - ref):.1f}x the reference")
                        e = {"kind": "divergence", "onset": onset,
                             "end": steps[-1]["step"] + 1,
                             "peak": math.inf if nonfinite else round(math.exp(peak), 2),
                             "reference_loss": round(math.exp(ref), 4), "why": why}
                        if nonfinite:
                            e["nonfinite_step"] = steps[i]["step"]
                        events.append(e)
                        return events
                    events.append({"kind": "spike", "onset": onset,
                                   "end": steps[-1]["step"] + 1, "recovered": None,
                                   "peak": round(math.exp(peak), 2),
                                   "reference_loss": round(math.exp(ref), 4)})
                    return events
                events.append({"kind": "spike", "onset": onset, "end": steps[rec]["step"],
                               "recovered": steps[rec]["step"],
                               "peak": round(math.exp(peak), 2),
                               "reference_loss": round(math.exp(ref), 4)})
                t = rec
                continue
        calm.append(t)
        t += 1
    return events


def slow_divergence_events(steps, b=LEVEL_SETTLE):
    """The loss's level (trailing median of SLOW_LEVEL_STEPS finite losses)
    rises to >= SLOW_RATIO x the best level since b (LEVEL_SETTLE: warmup
    included) and stays there."""
    loss = [_float(s.get("loss")) for s in steps]
    level, best = [], []
    cur_best = math.inf
    for i, s in enumerate(steps):
        w = [x for x in loss[max(0, i - SLOW_LEVEL_STEPS + 1): i + 1] if math.isfinite(x)]
        m = _median(w) if len(w) >= SLOW_LEVEL_STEPS // 2 else math.nan
        if s["step"] >= b and math.isfinite(m):
            cur_best = min(cur_best, m)
        level.append(m)
        best.append(cur_best)
    cond = [math.isfinite(level[i]) and math.isfinite(best[i]) and steps[i]["step"] >= b
            and level[i] >= SLOW_RATIO * best[i] for i in range(len(steps))]
    start = None
    for i, c in enumerate(cond):
        if c and start is None:
            start = i
        elif not c:
            start = None
        if start is not None and (i - start + 1 >= SLOW_PERSIST
                                  or (i == len(steps) - 1 and i - start + 1 >= 50)):
            ref = best[start]
            onset = start
            while onset > 0 and not (math.isfinite(level[onset])
                                     and level[onset] <= SLOW_ONSET_RATIO * best[onset]):
                onset -= 1
            return [{"kind": "slow_divergence", "onset": steps[onset]["step"],
                     "crossed": steps[start]["step"], "end": steps[-1]["step"] + 1,
                     "best_level": round(ref, 4),
                     "last_level": round(level[-1], 4) if math.isfinite(level[-1]) else None,
                     "peak": round(max(v for v, st in zip(level, steps)
                                       if math.isfinite(v) and st["step"] >= b) / ref, 2)}]
    return []


def _level_baseline(steps, values, b):
    base = [v for s, v in zip(steps, values) if b <= s["step"] < b + LEVEL_BASELINE_STEPS
            and math.isfinite(v)]
    return _median(base)


LEVEL_PERSIST = 100
NORM_MERGE = 20


def _persistent(steps, cond):
    """(onset, last) of a condition that holds on >= LEVEL_PERSIST
    consecutive steps (onset: the first such stretch's start; last: the
    last step it holds), or None."""
    onset = last = None
    start, length = None, 0
    for s, c in zip(steps, cond):
        if c:
            start = s["step"] if length == 0 else start
            length += 1
            if length >= LEVEL_PERSIST and onset is None:
                onset = start
            last = s["step"]
        else:
            length = 0
    return None if onset is None else (onset, last)


def logit_events(steps, b):
    vals = [_float(s.get("max_attn_logit")) for s in steps]
    if not any(math.isfinite(v) for v in vals):
        return []
    a0 = _level_baseline(steps, vals, b)
    if not math.isfinite(a0):
        return []
    cond = []
    for i, s in enumerate(steps):
        m = _trailing_median(vals, i, LEVEL_SMOOTH)
        cond.append(s["step"] >= b + LEVEL_BASELINE_STEPS and math.isfinite(m)
                    and (m >= LOGIT_GROWTH * a0 or m >= LOGIT_CAP))
    found = _persistent(steps, cond)
    if found is None:
        return []
    onset, last = found
    return [{"kind": "logit_growth", "onset": onset, "end": last + 1,
             "baseline": round(a0, 2), "max": round(max(v for v in vals if math.isfinite(v)), 2)}]


def logz_events(steps, b):
    vals = [_float(s.get("log_z")) for s in steps]
    if not any(math.isfinite(v) for v in vals):
        return []
    z0 = _level_baseline(steps, vals, b)
    if not math.isfinite(z0):
        return []
    sign = 1.0 if z0 >= 0 else -1.0
    cond = []
    for i, s in enumerate(steps):
        m = _trailing_median(vals, i, LEVEL_SMOOTH)
        cond.append(s["step"] >= b + LEVEL_BASELINE_STEPS and math.isfinite(m)
                    and (m - z0) * sign >= LOGZ_NATS and abs(m) - abs(z0) >= LOGZ_NATS)
    found = _persistent(steps, cond)
    if found is None:
        return []
    onset, last = found
    fin = [v for v in vals if math.isfinite(v)]
    return [{"kind": "logz_drift", "onset": onset, "end": last + 1, "baseline": round(z0, 2),
             "range": [round(min(fin), 2), round(max(fin), 2)]}]


def _is_embedding(name):
    parts = name.split(".")
    if len(parts) > 1 and parts[-1] in ("weight", "bias"):  # a parameter's name
        parts = parts[:-1]
    return parts[-1] in EMBEDDING_SUFFIXES


def stall_events(steps, b, eps):
    layers = sorted({k for s in steps for k in s.get("layer_stats", {}) if not _is_embedding(k)})
    if not layers or eps is None:
        return []

    def series(k, field):
        return [_float(s.get("layer_stats", {}).get(k, {}).get(field)) for s in steps]

    a = {k: series(k, "g_over_sqrt_v_rms") for k in layers}
    rms = {k: series(k, "grad_rms") for k in layers}
    for i, s in enumerate(steps):
        if s["step"] < b:
            continue
        low = 0
        for k in layers:
            m = _trailing_median(a[k], i, STALL_SMOOTH)
            g = _trailing_median(rms[k], i, STALL_SMOOTH)
            if math.isfinite(m) and m < STALL_STEP and math.isfinite(g) and g < eps:
                low += 1
        if 2 * low >= len(layers):
            ratios = [_float(x.get("update_rms_ratio")) for x in s["layer_stats"].values()]
            lr = _float(s.get("lr"))
            fin = [r for r in ratios if math.isfinite(r)]
            return [{"kind": "stall", "onset": s["step"], "end": steps[-1]["step"] + 1,
                     "why": "eps", "layers_low": low, "layers": len(layers),
                     "median_update_rms_ratio_over_lr":
                         round(_median(fin) / lr, 4) if fin and lr > 0 else None}]
    return []


def update_collapse_events(steps, b):
    """stall by the update's size: u_t = median over the non-embedding
    layers of update_rms_ratio; its trailing STALL_SMOOTH-step median falls
    >= STALL_COLLAPSE x below the baseline (median u over [b, b + 100)) on
    >= STALL_PERSIST consecutive steps from b + 100 on."""
    u = []
    for s in steps:
        vals = [_float(v.get("update_rms_ratio")) for k, v in s.get("layer_stats", {}).items()
                if not _is_embedding(k)]
        vals = [v for v in vals if math.isfinite(v)]
        u.append(_median(vals) if vals else math.nan)
    if not any(math.isfinite(x) for x in u):
        return []
    u0 = _level_baseline(steps, u, b)
    if not (math.isfinite(u0) and u0 > 0):
        return []
    start = None
    for i, s in enumerate(steps):
        m = _trailing_median(u, i, STALL_SMOOTH)
        c = (s["step"] >= b + LEVEL_BASELINE_STEPS and math.isfinite(m)
             and m * STALL_COLLAPSE <= u0)
        if c and start is None:
            start = i
        elif not c:
            start = None
        if start is not None and i - start + 1 >= STALL_PERSIST:
            last = _trailing_median(u, len(steps) - 1, STALL_SMOOTH)
            return [{"kind": "stall", "onset": steps[start]["step"],
                     "end": steps[-1]["step"] + 1, "why": "update_collapse",
                     "baseline_update_rms_ratio": float(f"{u0:.3g}"),
                     "last_update_rms_ratio": float(f"{last:.3g}")}]
    return []


def norm_spike_events(steps, b):
    norms = [_float(s.get("grad_norm")) for s in steps]
    out = []
    for i, s in enumerate(steps):
        if s["step"] < b or not math.isfinite(norms[i]):
            continue
        prev = [x for x in norms[max(0, i - NORM_REF_STEPS): i] if math.isfinite(x)]
        if len(prev) >= 20:
            med = _median(prev)
            if med > 0 and norms[i] >= NORM_SPIKE_RATIO * med:
                ratio = round(norms[i] / med, 1)
                if out and s["step"] - (out[-1]["end"] - 1) <= NORM_MERGE:
                    out[-1]["end"] = s["step"] + 1
                    out[-1]["peak"] = max(out[-1]["peak"], ratio)
                else:
                    out.append({"kind": "norm_spike", "onset": s["step"], "end": s["step"] + 1,
                                "peak": ratio})
    return out


def label(steps, start):
    """Events of one run (lists of dicts, by onset)."""
    warmup = int(start.get("warmup_steps", 0) or 0)
    b = max(warmup, LEVEL_SETTLE)
    events = loss_events(steps)
    diverged = [e["onset"] for e in events if e["kind"] == "divergence"]
    cut = diverged[0] if diverged else None
    kept = steps if cut is None else [s for s in steps if s["step"] < cut]
    eps = start.get("adam_eps")
    if cut is None:
        events.extend(slow_divergence_events(kept))
    stall = (stall_events(kept, b, None if eps is None else float(eps))
             or update_collapse_events(kept, b))
    for more in (logit_events(kept, b), logz_events(kept, b), stall,
                 norm_spike_events(kept, b)):
        events.extend(more)
    events.sort(key=lambda e: (e["onset"], e["kind"]))
    return events


def healthy_ranges(steps, start, events):
    """[lo, hi) step ranges where nothing is labelled: where a page is false."""
    if not steps:
        return []
    lo, hi = steps[0]["step"], steps[-1]["step"] + 1
    blocked = []
    for e in events:
        if e["kind"] == "hard_batch":
            continue  # a page at a lone hard batch is a false page
        if e["kind"] in ("divergence", "slow_divergence"):
            blocked.append((e["onset"] - HEALTHY_BEFORE, hi))
        else:
            blocked.append((e["onset"] - HEALTHY_BEFORE, e["end"] + HEALTHY_AFTER))
    blocked.sort()
    out, cur = [], lo
    for a, z in blocked:
        if a > cur:
            out.append([cur, min(a, hi)])
        cur = max(cur, z)
    if cur < hi:
        out.append([cur, hi])
    return [r for r in out if r[1] > r[0]]


def label_file(path):
    start, steps = read(path)
    events = label(steps, start)
    return {"file": str(path), "run": start.get("run_id"), "steps": len(steps),
            "warmup": int(start.get("warmup_steps", 0) or 0), "events": events,
            "healthy_steps": healthy_ranges(steps, start, events)}


def main(argv):
    for path in argv[1:]:
        print(json.dumps(label_file(path)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
