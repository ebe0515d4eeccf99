#!/usr/bin/python3
"""Writes the scenario suite: synthetic training runs as JSONL step logs.

Each scenario is one run made with a fixed seed: healthy runs of several
kinds, and runs with one failure each of docs/detectors.md. The manifest
(expected.json) lists, per scenario, its run id, its files as "replay"
stages (a stage holds one file per rank, streamed together; a restarted job
has one stage per attempt, streamed in order), the alerts it must raise with
the step where each becomes true, and the alerts it may raise without
counting as a false alarm. tests/integration/scenario_test.cc replays every
scenario through the real server and compares.

  generate.py --out DIR [NAME ...]   write the named scenarios (default: all)
                                     and DIR/expected.json (of those)
  generate.py --manifest-only --out DIR
  generate.py --list

The committed tests/testdata/scenarios/expected.json is what --manifest-only
writes; the test checks they agree. Standard library only; the output depends
on nothing but this file (random.Random with a fixed seed per scenario).

Realism, shared by all scenarios unless a scenario says otherwise:
- steps count from 1; an LR warmup (short, to keep the files small) with
  norms several times higher at the start, then a cosine LR decay with the
  typical norm falling slowly;
- norms are lognormal around that trend: an AR(1) wander plus white noise in
  log space, 3% of steps drawn from a 2.2x wider distribution (mild heavy
  tails);
- loss falls from about log V = 10.8; lr, two batch ids per step, a
  timestamp every 0.4 s; CHECKPOINT_SAVED every 1000 steps; RUN_FINISHED (or
  RUN_FAILED after a divergence) at the end;
- fp16 runs follow torch.cuda.amp.GradScaler: init 65536, halve on overflow
  (the step is skipped, its norm is inf), double after growth_interval clean
  steps; loss_scale is the scale after the step's update;
- self-checks stop the generator if a seed makes a run other than it claims:
  a norm 5x its trailing median where no spike is meant, a healthy fp16 run
  whose scale collapses, a skip rate off target.

"onset_step" of an expected alert is the first step at which the generating
process itself meets the alert's documented condition (for a windowed mean
or median, the step where the underlying quantity crosses the threshold; for
a rule that needs N steps, the N-th step): the detection delay is the alert's
started_step minus it, so a windowed median's lag of about W/2 shows in it. "failure_step" is
where the failure begins; an expected alert starting before it is a false
alarm.
"""

import argparse
import bisect
import json
import math
import os
import random
import statistics
import sys
import zlib

BASE_TIME_NS = 1_767_225_600 * 10**9  # 2026-01-01T00:00:00Z
STEP_TIME_NS = 400_000_000
WINDOW = 1000  # docs/detectors.md default W
MANIFEST = "expected.json"


# ---------------------------------------------------------------- formatting


def num(x, digits=8):
    """A float as the JSONL log carries it (proto3 JSON for non-finite)."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return float(f"{x:.{digits}g}")


class RankLog:
    """One rank's JSONL step log. On close it checks that no step's norm is
    5x the median of the 200 before it (a spike by GradNormSpike's own
    min_ratio), except at the steps in `spikes`: a scenario only spikes
    where it says so, whatever the seed."""

    SPIKE_RATIO = 5.0
    TRAILING = 200

    def __init__(self, path, run_start):
        self.path = path or run_start["run_id"]
        self.out = open(path, "w") if path else None
        self.spikes = set()
        self.norms = []  # (step, finite grad_norm)
        self._write({"run_start": run_start})

    def _write(self, obj):
        if self.out:
            self.out.write(json.dumps(obj, separators=(",", ":")) + "\n")

    def step(self, record):
        norm = record["grad_norm"]
        if isinstance(norm, float) and math.isfinite(norm):
            self.norms.append((record["step"], norm))
        self._write(record)

    def check_no_spike(self):
        trailing, window = [], []
        for step, norm in self.norms:
            if len(window) == self.TRAILING and step not in self.spikes:
                median = window[len(window) // 2]
                check(norm < self.SPIKE_RATIO * median,
                      f"{self.path}: step {step}: norm {norm:.4g} is "
                      f"{norm / median:.1f}x the trailing median (change the seed "
                      "or the noise)")
            bisect.insort(window, norm)
            trailing.append(norm)
            if len(trailing) > self.TRAILING:
                window.pop(bisect.bisect_left(window, trailing.pop(0)))

    def event(self, step, kind, detail=""):
        ev = {"step": step, "kind": kind}
        if detail:
            ev["detail"] = detail
        self._write({"event": ev})

    def close(self):
        self.check_no_spike()
        if self.out:
            self.out.close()


# ------------------------------------------------------------- the trainer


class LogNoise:
    """Log-space deviation of a norm from its trend: AR(1) plus white noise
    with a mild heavy tail (3% of steps from a 2.2x wider gaussian)."""

    TAIL_P = 0.03
    TAIL_X = 2.2
    AR = 0.9

    def __init__(self, rng, sigma, ar_sigma=0.03):
        self.rng = rng
        self.sigma = sigma
        self.ar_sigma = ar_sigma
        self.a = 0.0

    def next(self):
        self.a = self.AR * self.a + self.rng.gauss(0.0, self.ar_sigma)
        s = self.sigma * (self.TAIL_X if self.rng.random() < self.TAIL_P else 1.0)
        return self.a + self.rng.gauss(0.0, s)

    def prob_above(self, log_margin):
        """P(deviation > log_margin) under the stationary distribution."""
        ar_var = self.ar_sigma**2 / (1 - self.AR**2)

        def q(sd):
            return 0.5 * math.erfc(log_margin / (sd * math.sqrt(2)))

        core = math.sqrt(self.sigma**2 + ar_var)
        tail = math.sqrt((self.TAIL_X * self.sigma) ** 2 + ar_var)
        return (1 - self.TAIL_P) * q(core) + self.TAIL_P * q(tail)


class Run:
    """Shape of one training run: its schedule and typical norm."""

    def __init__(self, steps, warmup, m0, m_end=None, peak_lr=3e-4):
        self.steps = steps
        self.warmup = warmup
        self.m0 = m0  # typical post-warmup norm at the end of warmup
        self.m_end = m0 * 0.85 if m_end is None else m_end
        self.peak_lr = peak_lr

    def progress(self, step):
        return min(1.0, max(0.0, (step - self.warmup) / max(1, self.steps - self.warmup)))

    def median(self, step):
        """Typical norm: high at the start, falling fast through warmup, then
        slowly with the LR decay."""
        early = 1.0 + 5.0 * math.exp(-4.0 * step / max(1, self.warmup))
        return early * self.m0 * (self.m_end / self.m0) ** self.progress(step)

    def lr(self, step):
        if step < self.warmup:
            return self.peak_lr * step / self.warmup
        p = self.progress(step)
        return self.peak_lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))

    def loss(self, rng, step):
        return 2.1 + 8.7 * math.exp(-step / 700.0) + 0.4 * (1 - self.progress(step)) + rng.gauss(0, 0.03)

    def base(self, rng, step, grad_norm):
        """A step record with the fields every scenario carries."""
        return {
            "step": step,
            "grad_norm": num(grad_norm),
            "loss": num(self.loss(rng, step), 5),
            "lr": num(self.lr(step), 4),
            "time_unix_nanos": BASE_TIME_NS + step * STEP_TIME_NS,
            "batch_ids": [2 * (step - 1), 2 * (step - 1) + 1],
        }


class Scaler:
    """torch.cuda.amp.GradScaler's update rule. `update_on_skip=False` is the
    ScalerStuck bug: update() is only called on clean steps."""

    def __init__(self, scale=65536.0, growth_interval=2000, update_on_skip=True):
        self.scale = scale
        self.growth_interval = growth_interval
        self.update_on_skip = update_on_skip
        self.clean = 0
        self.history = []  # (step, scale after update)

    def update(self, step, overflow):
        if overflow:
            if self.update_on_skip:
                self.scale *= 0.5
            self.clean = 0
        else:
            self.clean += 1
            if self.clean == self.growth_interval:
                self.scale *= 2.0
                self.clean = 0
        self.history.append((step, self.scale))
        return self.scale


def max_halvings_without_growth(history, within=100):
    """Most scale decreases inside `within` steps with no increase between:
    the LossScaleCollapse condition, for self-checks of healthy parts."""
    best, run = 0, []
    prev = None
    for step, scale in history:
        if prev is not None:
            if scale > prev:
                run = []
            elif scale < prev:
                run.append(step)
                run = [s for s in run if s > step - within]
                best = max(best, len(run))
        prev = scale
    return best


def check(condition, message):
    if not condition:
        sys.exit(f"generate.py: self-check failed: {message}")


def checkpoints(log, step, every=1000):
    if step % every == 0:
        log.event(step, "CHECKPOINT_SAVED", f"ckpt-{step:06d}")


LAYERS = [
    # name, share of the squared global norm, parameter count
    ("embed", 0.20, 51_200_000),
    ("layers.0.attn.qkv", 0.10, 2_359_296),
    ("layers.0.mlp.up", 0.12, 4_194_304),
    ("layers.1.attn.qkv", 0.10, 2_359_296),
    ("layers.1.mlp.up", 0.12, 4_194_304),
    ("layers.2.attn.qkv", 0.10, 2_359_296),
    ("layers.2.mlp.up", 0.12, 4_194_304),
    ("lm_head", 0.14, 51_200_000),
]


def layer_stats(rng, norm, overrides=None):
    """Per-layer stats consistent with the global norm; g/sqrt(v) about 1."""
    out = {}
    for name, share, numel in LAYERS:
        g = norm * math.sqrt(share) * math.exp(rng.gauss(0, 0.05))
        stats = {
            "grad_norm": num(g, 6),
            "grad_rms": num(g / math.sqrt(numel), 6),
            "g_over_sqrt_v_rms": num(math.exp(rng.gauss(0.0, 0.08)), 4),
        }
        stats.update((overrides or {}).get(name, {}))
        out[name] = stats
    return out


# ---------------------------------------------------------------- scenarios
#
# A scenario function takes (rng, out_dir or None) and returns its manifest
# entry. With out_dir None nothing is written (the manifest alone).


SCENARIOS = []


def scenario(fn):
    SCENARIOS.append(fn)
    return fn


def run_start(name, **fields):
    start = {
        "run_id": f"scenario/{name}",
        "world_size": 1,
        "max_norm": 1.0,
        "labels": {"model": "gpt-350m", "suite": "scenarios"},
    }
    start.update(fields)
    return start


def entry(name, description, files, run, expected=(), allowed=(), failure_step=None,
          world_size=1, replay=None, pages=None, max_fires=None):
    """A manifest entry. `files` (one per rank) are streamed together;
    `replay` instead gives stages streamed one after the other (a restart).
    `pages`, when given, lists the only alertnames that may page (severity
    warning or critical, and no caused_by); `max_fires` bounds the fire
    events of an alertname (a hovering quantity must not flap)."""
    return {
        "name": name,
        "description": description,
        "run_id": f"scenario/{name}",
        "replay": replay or [files],
        "world_size": world_size,
        "steps": run.steps,
        "warmup_steps": run.warmup,
        "failure_step": failure_step,
        "expected": [expected_alert(*e) for e in expected],
        "allowed": sorted(allowed),
        **({"pages": sorted(pages)} if pages is not None else {}),
        **({"max_fires": max_fires} if max_fires else {}),
    }


def expected_alert(alertname, onset_step, max_delay=None):
    """An expected alert; with max_delay, the test also asserts that it fires
    no later than onset_step + max_delay (its delay budget)."""
    e = {"alertname": alertname, "onset_step": onset_step}
    if max_delay is not None:
        e["max_delay"] = max_delay
    return e


def open_logs(out, name, world_size, start):
    """One RankLog per rank; returns (logs, file names)."""
    if world_size == 1:
        files = [f"{name}.jsonl"]
    else:
        files = [f"{name}.rank{r}.jsonl" for r in range(world_size)]
    logs = []
    for rank, f in enumerate(files):
        s = dict(start, rank=rank, world_size=world_size)
        logs.append(RankLog(os.path.join(out, f) if out else None, s))
    return logs, files


def finish(logs, step, failed=False):
    for log in logs:
        log.event(step, "RUN_FAILED" if failed else "RUN_FINISHED",
                  "diverged" if failed else "")
        log.close()


def plain_run(name, description, seed_run, out, precision="BF16", sigma=0.15,
              with_layers=False, attn_logz=False, extra_start=None, expected=(),
              failure_step=None):
    """A run with nothing wrong in its records (the failure, if any, is in
    its RunStart)."""
    rng, run = seed_run
    start = run_start(name, precision=precision, warmup_steps=run.warmup,
                      **(extra_start or {}))
    logs, files = open_logs(out, name, 1, start)
    noise = LogNoise(rng, sigma)
    for step in range(1, run.steps + 1):
        norm = run.median(step) * math.exp(noise.next())
        rec = run.base(rng, step, norm)
        if with_layers and step % 100 == 0:
            rec["layer_stats"] = layer_stats(rng, norm)
        if attn_logz:
            rec["max_attn_logit"] = num(attn_logit(rng, step, run.warmup), 5)
            rec["log_z"] = num(10.8 - 0.4 * run.progress(step) + rng.gauss(0, 0.05), 5)
        logs[0].step(rec)
        checkpoints(logs[0], step)
    finish(logs, run.steps)
    return entry(name, description, files, run, expected, failure_step=failure_step)


def attn_logit(rng, step, warmup, level=15.0):
    """Max attention logit: about 5 at init, settling at `level` in warmup."""
    settle = 1.0 - math.exp(-3.0 * step / max(1, warmup))
    return (5.0 + (level - 5.0) * settle) * math.exp(rng.gauss(0, 0.03))


@scenario
def healthy_bf16_a(rng, out):
    return plain_run("healthy-bf16-a", "bf16, 6000 steps, typical norm 0.45 falling to 0.38",
                     (rng, Run(6000, 200, 0.45, 0.38)), out)


@scenario
def healthy_bf16_b(rng, out):
    return plain_run(
        "healthy-bf16-b",
        "bf16, 12000 steps, longer warmup, noisier norms (sigma 0.18), layer_stats "
        "every 100 steps with adam_eps 1e-8",
        (rng, Run(12000, 500, 0.3, 0.24)), out, sigma=0.18, with_layers=True,
        extra_start={"adam_eps": 1e-8, "adam_beta2": 0.95})


@scenario
def healthy_attn_logz(rng, out):
    return plain_run(
        "healthy-attn-logz",
        "bf16 with max attention logit flat at ~15 and log Z ~10.8, slowly "
        "falling by 0.4 nats",
        (rng, Run(8000, 300, 0.4)), out, attn_logz=True)


def fp16_run(name, rng, out, run, overflow_at, description, expected=(),
             allowed=(), failure_step=None, scaler=None, norm_of=None,
             extra_start=None, failed=False):
    """An fp16 run with GradScaler. overflow_at(step, scale) says whether the
    step overflows; norm_of(step, healthy_norm, scale) gives the reported norm
    of a clean step (default: the healthy norm, unscaled correctly)."""
    scaler = scaler or Scaler()
    start = run_start(name, precision="FP16", warmup_steps=run.warmup,
                      scaler_growth_interval=scaler.growth_interval,
                      **(extra_start or {}))
    logs, files = open_logs(out, name, 1, start)
    noise = LogNoise(rng, 0.15)
    skipped = []
    for step in range(1, run.steps + 1):
        norm = run.median(step) * math.exp(noise.next())
        overflow = overflow_at(step, scaler.scale)
        scale = scaler.update(step, overflow)
        if overflow:
            rec = run.base(rng, step, math.inf)
            rec["skipped"] = True
        else:
            rec = run.base(rng, step, norm_of(step, norm, scale) if norm_of else norm)
        rec["loss_scale"] = scale
        skipped.append(overflow)
        logs[0].step(rec)
        checkpoints(logs[0], step)
    finish(logs, run.steps, failed)
    e = entry(name, description, files, run, expected, allowed, failure_step)
    return e, scaler, skipped


def first_full(run, min_steps):
    """The step at which the window first holds `min_steps` post-warmup steps
    (step warmup_steps is the first post-warmup step, as in the server)."""
    return run.warmup + min_steps - 1


def window_max_fraction(flags, start, end, w=WINDOW):
    """Largest fraction of set flags over any full window of steps in
    [start, end) (1-based steps; flags[i] is step i + 1)."""
    best, count = 0.0, 0
    for i in range(start - 1, end - 1):
        count += flags[i]
        if i - w >= start - 1:
            count -= flags[i - w]
        if i - (start - 1) + 1 >= 100:
            best = max(best, count / min(w, i - (start - 1) + 1))
    return best


def early_overflows(step, scale, steps=(1, 2, 5)):
    """The first steps overflow at the initial scale (three halvings, as
    GradScaler often does when 65536 is too high for a fresh model)."""
    return step in steps


def ceiling_overflow(rng, ceiling, p):
    """After the early ones, a scale above `ceiling` overflows with
    probability p per step (the scaler grew past what the gradients allow)."""
    def f(step, scale):
        return early_overflows(step, scale) or (scale > ceiling and rng.random() < p)
    return f


@scenario
def healthy_fp16(rng, out):
    run = Run(9000, 300, 0.4)
    e, scaler, skipped = fp16_run(
        "healthy-fp16", rng, out, run, ceiling_overflow(rng, 2**14.5, 0.004),
        "fp16, GradScaler from 65536: three overflows in the first steps, growth "
        "every 2000 clean steps, an overflow a few hundred steps after a growth "
        "past 2^14.5 halves the scale back")
    check(max_halvings_without_growth(scaler.history) < 4, "healthy-fp16 collapses")
    check(sum(skipped[run.warmup:]) >= 2, "healthy-fp16 has no post-growth overflow")
    check(window_max_fraction(skipped, run.warmup, run.steps) <= 0.005,
          "healthy-fp16 skips too often")
    return e


@scenario
def healthy_fsdp_2rank(rng, out):
    name = "healthy-fsdp-2rank"
    run = Run(6000, 200, 0.5)
    start = run_start(name, precision="BF16", warmup_steps=run.warmup)
    logs, files = open_logs(out, name, 2, start)
    noise = LogNoise(rng, 0.15)
    for step in range(1, run.steps + 1):
        norm = num(run.median(step) * math.exp(noise.next()))
        rec = run.base(rng, step, norm)
        # Each rank holds half of the parameters (ZeRO-2 / FSDP): its local
        # sum of squares is its share of norm^2; the norm is global on both.
        share = min(0.6, max(0.4, rng.gauss(0.5, 0.02)))
        sq0 = num(norm * norm * share)
        for rank, log in enumerate(logs):
            r = dict(rec)
            r["shard_sq_sum"] = sq0 if rank == 0 else num(norm * norm - sq0)
            log.step(r)
            checkpoints(log, step)
    finish(logs, run.steps)
    return entry(name, "2-rank FSDP bf16: the same global norm on both ranks, "
                 "shard_sq_sum halves summing to norm^2", files, run, world_size=2)


@scenario
def spike(rng, out):
    name = "spike"
    run = Run(5000, 200, 0.45)
    at = 3000
    start = run_start(name, precision="BF16", warmup_steps=run.warmup)
    logs, files = open_logs(out, name, 1, start)
    logs[0].spikes.add(at)
    noise = LogNoise(rng, 0.15)
    for step in range(1, run.steps + 1):
        norm = run.median(step) * math.exp(noise.next())
        if step == at:
            norm = 25.0 * run.median(step)
        rec = run.base(rng, step, norm)
        if step in (at, at + 1):
            rec["loss"] = num(rec["loss"] + 0.6, 5)
        logs[0].step(rec)
        checkpoints(logs[0], step)
    finish(logs, run.steps)
    return entry(name, f"bf16, one gradient spike of 25x the typical norm at step {at}",
                 files, run, [("GradNormSpike", at)], failure_step=at)


def restarted_run(name, rng, out, run, crash_at, resume_from, spike_at=None):
    """A bf16 run that stops at `crash_at` (no final event: the job died) and
    is restarted from the checkpoint at `resume_from` as attempt 1, which
    runs to the end. A spike at `spike_at` happens in attempt 0 only; the
    restart skips its batches."""
    stages, noise = [], LogNoise(rng, 0.15)
    for attempt, (first, last) in enumerate([(1, crash_at), (resume_from + 1, run.steps)]):
        start = run_start(name, precision="BF16", warmup_steps=run.warmup,
                          attempt=attempt)
        f = f"{name}.attempt{attempt}.jsonl"
        log = RankLog(os.path.join(out, f) if out else None, dict(start, rank=0))
        log.spikes.add(spike_at)
        stages.append([f])
        for step in range(first, last + 1):
            norm = run.median(step) * math.exp(noise.next())
            if step == spike_at and attempt == 0:
                norm = 25.0 * run.median(step)
            rec = run.base(rng, step, norm)
            if attempt == 1 and spike_at is not None and step >= spike_at:
                rec["batch_ids"] = [b + 2 for b in rec["batch_ids"]]
            log.step(rec)
            checkpoints(log, step)
        if attempt == 1:
            log.event(run.steps, "RUN_FINISHED")
        log.close()
    return stages


@scenario
def healthy_restart(rng, out):
    name = "healthy-restart"
    run = Run(6000, 200, 0.45)
    stages = restarted_run(name, rng, out, run, crash_at=3500, resume_from=3000)
    return entry(name, "bf16; the job dies at step 3500 and restarts from the "
                 "step-3000 checkpoint as attempt 1", None, run, replay=stages)


@scenario
def spike_then_restart(rng, out):
    name = "spike-then-restart"
    run = Run(5000, 200, 0.45)
    at = 3000
    stages = restarted_run(name, rng, out, run, crash_at=at + 50, resume_from=2000,
                           spike_at=at)
    return entry(name, f"bf16, a 25x spike at step {at}; 50 steps later the job is "
                 "restarted from the step-2000 checkpoint (the restart plan), "
                 "skipping the spike's batches, and runs clean",
                 None, run, [("GradNormSpike", at)], failure_step=at, replay=stages)


@scenario
def drift(rng, out):
    name = "drift"
    warmup, creep_from, creep_steps = 200, 200 + WINDOW, 20000
    run = Run(creep_from + creep_steps, warmup, 0.35, 0.35)
    lo, hi = 0.35, 1.3
    sigma = 0.15
    noise = LogNoise(rng, sigma)

    def median(step):
        if step < creep_from:
            return run.median(step)
        return lo * (hi / lo) ** ((step - creep_from) / creep_steps)

    # Onsets: the typical norm reaches 2x the baseline; more than 5% of the
    # steps clip (P(norm > max_norm = 1) > 0.05).
    drift_on = next(s for s in range(creep_from, run.steps + 1) if median(s) >= 2 * lo)
    clip_on = next(s for s in range(creep_from, run.steps + 1)
                   if noise.prob_above(math.log(1.0 / median(s))) > 0.05)
    start = run_start(name, precision="BF16", warmup_steps=warmup)
    logs, files = open_logs(out, name, 1, start)
    for step in range(1, run.steps + 1):
        rec = run.base(rng, step, median(step) * math.exp(noise.next()))
        logs[0].step(rec)
        checkpoints(logs[0], step)
    finish(logs, run.steps)
    return entry(name, f"bf16, max_norm 1: the typical norm creeps from {lo} to {hi} "
                 f"over {creep_steps} steps from step {creep_from}",
                 files, run, [("ClipFractionHigh", clip_on), ("GradNormDrift", drift_on)],
                 failure_step=creep_from)


@scenario
def loss_scale_collapse(rng, out):
    run = Run(2700, 200, 0.4)
    at = 2500

    def overflow(step, scale):
        return early_overflows(step, scale) or step >= at

    # The scale halves on every step from `at`: the 4th halving is at+3,
    # and the skipped fraction over W passes 1% at the 11th skip.
    e, scaler, _ = fp16_run(
        "loss-scale-collapse", rng, out, run, overflow,
        f"fp16, the run diverges at step {at}: every step overflows and the "
        "scale halves step after step", expected=[
            ("LossScaleCollapse", at + 3), ("SkipRateHigh", at + 10)],
        allowed=["ClipFractionHigh"], failure_step=at, failed=True)
    check(max_halvings_without_growth(
        [h for h in scaler.history if h[0] < at]) < 4, "collapse before the failure")
    return e


@scenario
def skip_rate_high(rng, out):
    run = Run(5000, 200, 0.4)
    ceiling = 2.0**15

    def overflow(step, scale):
        # The scale probes a ceiling: at it, an overflow is likely; half of
        # it is safe. With growth every 32 clean steps that is a sawtooth
        # skipping about 3% of the steps, and the scale always recovers.
        return scale >= ceiling * math.exp(rng.gauss(0, 0.25))

    e, scaler, skipped = fp16_run(
        "skip-rate-high", rng, out, run, overflow,
        "fp16 with an aggressive scaler (growth every 32 clean steps) probing "
        "an overflow ceiling at 2^15: about 3% of steps skipped, the scale "
        "recovers every time", expected=[("SkipRateHigh", first_full(run, 100))],
        allowed=["ClipFractionHigh"], failure_step=run.warmup,
        scaler=Scaler(growth_interval=32))
    rate = sum(skipped[run.warmup:]) / (run.steps - run.warmup)
    check(0.02 <= rate <= 0.04, f"skip-rate-high skips {rate:.3f}")
    check(max_halvings_without_growth(scaler.history) < 4, "skip-rate-high collapses")
    return e


@scenario
def scaler_stuck(rng, out):
    run = Run(2700, 200, 0.4)
    at = 2500

    def overflow(step, scale):
        return early_overflows(step, scale) or step >= at

    e, _, _ = fp16_run(
        "scaler-stuck", rng, out, run, overflow,
        f"fp16, scaler.update() only on clean steps: from step {at} every step "
        "overflows and the scale never changes",
        expected=[("ScalerStuck", at + 4), ("SkipRateHigh", at + 10)],
        allowed=["ClipFractionHigh"], failure_step=at,
        scaler=StuckAfter(at), failed=True)
    return e


class StuckAfter(Scaler):
    """A scaler whose update() is not called on skipped steps from `step` on:
    the training loop calls it only after a clean step (the early overflows
    before `step` went through a code path that did call it)."""

    def __init__(self, step):
        super().__init__()
        self.stuck_from = step

    def update(self, step, overflow):
        self.update_on_skip = step < self.stuck_from
        return super().update(step, overflow)


@scenario
def nonfinite_update(rng, out):
    name = "nonfinite-update"
    run = Run(2530, 200, 0.45)
    at = 2500
    start = run_start(name, precision="BF16", warmup_steps=run.warmup)
    logs, files = open_logs(out, name, 1, start)
    noise = LogNoise(rng, 0.15)
    for step in range(1, run.steps + 1):
        rec = run.base(rng, step, run.median(step) * math.exp(noise.next()))
        if step >= at:
            # A NaN loss; the update is applied (no guard), so the weights and
            # every later loss and norm are NaN too.
            rec["loss"] = "NaN"
            rec["grad_norm"] = "NaN"
        logs[0].step(rec)
        checkpoints(logs[0], step)
    finish(logs, run.steps, failed=True)
    return entry(name, f"bf16, NaN loss and norm from step {at} on steps that were "
                 "not skipped", files, run, [("NonFiniteUpdate", at)],
                 failure_step=at)


@scenario
def clip_before_unscale(rng, out):
    run = Run(4000, 200, 0.4)
    e, scaler, _ = fp16_run(
        "clip-before-unscale", rng, out, run, early_overflows,
        "fp16, clip_grad_norm_ called before scaler.unscale_: the reported norm "
        "is loss scale x the true norm (thousands), clipped on every step",
        expected=[("ClipBeforeUnscale", 100)],
        allowed=["ClipFractionHigh", "GradNormDrift"], failure_step=1,
        norm_of=lambda step, norm, scale: norm * scale)
    return e


def post_clip_run(name, rng, out, reported, description):
    run = Run(4000, 200, 0.8)
    start = run_start(name, precision="BF16", warmup_steps=run.warmup)
    logs, files = open_logs(out, name, 1, start)
    noise = LogNoise(rng, 0.2)
    above = 0
    for step in range(1, run.steps + 1):
        pre = run.median(step) * math.exp(noise.next())
        above += step >= run.warmup and pre > 1.0
        logs[0].step(run.base(rng, step, reported(pre)))
        checkpoints(logs[0], step)
    finish(logs, run.steps)
    check(above / (run.steps - run.warmup) > 0.05, f"{name}: pre-clip norm rarely above 1")
    return entry(name, description, files, run,
                 [("PostClipNormReported", first_full(run, 100))],
                 allowed=["ClipFractionHigh"], failure_step=1)


@scenario
def post_clip_norm(rng, out):
    return post_clip_run(
        "post-clip-norm", rng, out, lambda pre: min(pre, 1.0),
        "bf16, max_norm 1: the trainer logs min(norm, max_norm); the pre-clip "
        "norm (typical 0.8) is above 1 on ~15% of steps")


@scenario
def post_clip_norm_recomputed(rng, out):
    return post_clip_run(
        "post-clip-norm-recomputed", rng, out,
        lambda pre: pre * 1.0 / (pre + 1e-6) if pre > 1.0 else pre,
        "bf16, max_norm 1: the trainer logs the norm of the clipped gradients "
        "(max_norm * n / (n + 1e-6), just below 1, never exactly 1)")


@scenario
def attention_logit_growth(rng, out):
    run = Run(7000, 200, 0.45)
    grow_from, grow_to, lo, hi = 2000, 6000, 15.0, 40.0

    def level(step):
        f = min(1.0, max(0.0, (step - grow_from) / (grow_to - grow_from)))
        return lo + (hi - lo) * f

    onset = next(s for s in range(grow_from, run.steps) if level(s) >= 2 * lo)
    return logit_logz_run(
        "attention-logit-growth", rng, out, run,
        lambda step: attn_logit(rng, step, run.warmup, level(step)),
        lambda step: 10.8 + rng.gauss(0, 0.05),
        f"bf16, the max attention logit grows from {lo:g} to {hi:g} between steps "
        f"{grow_from} and {grow_to}", [("AttentionLogitGrowth", onset)], grow_from)


@scenario
def logz_drift(rng, out):
    run = Run(8500, 200, 0.45)
    # Away from 0, as output logits grow without z-loss (Wortsman et al.
    # 2023: 12 -> 23); toward 0 is what z-loss does on purpose.
    drift_from, drift_to, lo, hi = 2000, 8000, 10.8, 19.6

    def level(step):
        f = min(1.0, max(0.0, (step - drift_from) / (drift_to - drift_from)))
        return lo + (hi - lo) * f

    onset = next(s for s in range(drift_from, run.steps) if level(s) - lo >= 5.0)
    return logit_logz_run(
        "logz-drift", rng, out, run,
        lambda step: attn_logit(rng, step, run.warmup),
        lambda step: level(step) + rng.gauss(0, 0.05),
        f"bf16, log Z drifts from {lo} to {hi} between steps {drift_from} and "
        f"{drift_to} (no z-loss)", [("LogZDrift", onset)], drift_from)


def logit_logz_run(name, rng, out, run, logit, logz, description, expected, failure):
    start = run_start(name, precision="BF16", warmup_steps=run.warmup)
    logs, files = open_logs(out, name, 1, start)
    noise = LogNoise(rng, 0.15)
    for step in range(1, run.steps + 1):
        rec = run.base(rng, step, run.median(step) * math.exp(noise.next()))
        rec["max_attn_logit"] = num(logit(step), 5)
        rec["log_z"] = num(logz(step), 5)
        logs[0].step(rec)
        checkpoints(logs[0], step)
    finish(logs, run.steps)
    return entry(name, description, files, run, expected, failure_step=failure)


def multi_rank_run(name, rng, out, world, record_of, description, expected):
    """record_of(base_record, global_norm, rank) -> the rank's record."""
    run = Run(3000, 200, 0.5)
    start = run_start(name, precision="BF16", warmup_steps=run.warmup)
    logs, files = open_logs(out, name, world, start)
    noise = LogNoise(rng, 0.15)
    for step in range(1, run.steps + 1):
        norm = num(run.median(step) * math.exp(noise.next()))
        rec = run.base(rng, step, norm)
        for rank, log in enumerate(logs):
            log.step(record_of(rec, norm, rank))
            checkpoints(log, step)
    finish(logs, run.steps)
    return entry(name, description, files, run, expected, failure_step=1,
                 world_size=world)


@scenario
def rank_norm_mismatch(rng, out):
    # Per-shard clipping: each rank clips by the norm of its own shard
    # (sqrt of its share of norm^2) instead of the global norm.
    def record_of(rec, norm, rank):
        share = 0.5 + (0.06 if rank == 0 else -0.06) + rng.gauss(0, 0.01)
        local = norm * math.sqrt(share)
        r = dict(rec, grad_norm=num(local))
        r["clip_coef"] = num(min(1.0, 1.0 / (local + 1e-6)))
        r["clipped"] = local > 1.0
        return r

    return multi_rank_run(
        "rank-norm-mismatch", rng, out, 2, record_of,
        "2 ranks clipping by their own shard's norm: grad_norm and clip_coef "
        "differ by ~10% between ranks on every step",
        [("RankNormMismatch", 1)])


@scenario
def shard_norm_mismatch(rng, out):
    # The squares of replicated parameters are counted on every rank: the
    # shard sums add up to 4 norm^2 while the reported (global) norm is right.
    shares = {}

    def record_of(rec, norm, rank):
        if rank == 0:
            w = [rng.uniform(0.8, 1.2) for _ in range(4)]
            shares["w"] = [x / sum(w) for x in w]
        return dict(rec, shard_sq_sum=num(4 * norm * norm * shares["w"][rank]))

    return multi_rank_run(
        "shard-norm-mismatch", rng, out, 4, record_of,
        "4 ranks whose shard_sq_sum add up to 4 x norm^2 (replicated parameters "
        "counted on every rank); grad_norm is the same on all ranks",
        [("ShardNormMismatch", 1)])


@scenario
def fp16_without_scaler(rng, out):
    return plain_run("fp16-without-scaler",
                     "precision FP16 without a GradScaler: no loss_scale field at all",
                     (rng, Run(3000, 200, 0.4)), out, precision="FP16",
                     expected=[("Fp16WithoutScaler", 100)], failure_step=1)


@scenario
def adam_stale_second_moment(rng, out):
    name = "adam-stale-second-moment"
    run = Run(5000, 200, 0.45)
    at, layer = 3000, "layers.1.attn.qkv"
    start = run_start(name, precision="BF16", warmup_steps=run.warmup,
                      adam_eps=1e-8, adam_beta2=0.999)
    logs, files = open_logs(out, name, 1, start)
    noise = LogNoise(rng, 0.15)
    for step in range(1, run.steps + 1):
        norm = run.median(step) * math.exp(noise.next())
        if step == at + 3:
            norm *= 3.0  # the spike that tends to follow, small here
        rec = run.base(rng, step, norm)
        if step % 100 == 0:
            over = {}
            if step == at:
                over = {layer: {"g_over_sqrt_v_rms": 8.0}}
            elif step == at + 100:
                over = {layer: {"g_over_sqrt_v_rms": 1.6}}
            rec["layer_stats"] = layer_stats(rng, norm, over)
        logs[0].step(rec)
        checkpoints(logs[0], step)
    finish(logs, run.steps)
    return entry(name, f"bf16, beta2 0.999: at step {at} {layer}'s g/sqrt(v) RMS "
                 "jumps to 8 (layer_stats every 100 steps), a 3x norm bump follows",
                 files, run, [("AdamStaleSecondMoment", at)],
                 allowed=["GradNormSpike"], failure_step=at)


@scenario
def layer_update_stall(rng, out):
    name = "layer-update-stall"
    run = Run(5000, 200, 0.45)
    fade_from, dead_from, layer = 2000, 3000, "layers.2.mlp.up"
    start = run_start(name, precision="BF16", warmup_steps=run.warmup,
                      adam_eps=1e-8, adam_beta2=0.95)
    logs, files = open_logs(out, name, 1, start)
    noise = LogNoise(rng, 0.15)
    for step in range(1, run.steps + 1):
        norm = run.median(step) * math.exp(noise.next())
        rec = run.base(rng, step, norm)
        if step % 100 == 0:
            over = {}
            if step >= dead_from:
                rms = 5e-8 * math.exp(rng.gauss(0, 0.1))
            elif step >= fade_from:  # 3e-6 fading to 1.5e-7, still above 10 eps
                f = (step - fade_from) / (dead_from - fade_from)
                rms = 3e-6 * (0.05**f)
            else:
                rms = None
            if rms is not None:
                over = {layer: {"grad_rms": num(rms, 4),
                                "grad_norm": num(rms * math.sqrt(4_194_304), 4)}}
            rec["layer_stats"] = layer_stats(rng, norm, over)
        logs[0].step(rec)
        checkpoints(logs[0], step)
    finish(logs, run.steps)
    return entry(name, f"bf16, adam_eps 1e-8: {layer}'s gradient RMS fades from 3e-6 "
                 f"and sits at 5e-8 (< 10 eps) from step {dead_from}",
                 files, run, [("LayerUpdateStall", dead_from + 200)],
                 failure_step=dead_from)


# ------------------------------------------------ detection v2
#
# Each names a failure within its delay budget (max_delay) or stays silent
# where a healthy run does what healthy runs do; `pages` lists what may page.


def level_run(name, rng, out, run, median_of, description, expected, failure_step,
              allowed=(), pages=None, max_fires=None, sigma=0.15, loss_of=None,
              spikes=(), lr_of=None, excursion=None):
    """A bf16 run whose typical norm is median_of(step); loss_of(step, loss)
    and lr_of(step) reshape the loss and the LR; excursion(step) multiplies a
    step's norm (the steps in `spikes` may be 5x their trailing median)."""
    start = run_start(name, precision="BF16", warmup_steps=run.warmup)
    logs, files = open_logs(out, name, 1, start)
    logs[0].spikes.update(spikes)
    noise = LogNoise(rng, sigma)
    for step in range(1, run.steps + 1):
        norm = median_of(step) * math.exp(noise.next())
        if excursion:
            norm *= excursion(step)
        rec = run.base(rng, step, norm)
        if loss_of:
            rec["loss"] = num(loss_of(step, rec["loss"]), 5)
        if lr_of:
            rec["lr"] = num(lr_of(step), 4)
        logs[0].step(rec)
        checkpoints(logs[0], step)
    finish(logs, run.steps)
    return entry(name, description, files, run, expected, allowed, failure_step,
                 pages=pages, max_fires=max_fires)


@scenario
def sudden_norm_shift(rng, out):
    run = Run(5000, 200, 0.3)
    at = 3100
    return level_run(
        "sudden-norm-shift", rng, out, run,
        lambda s: run.median(s) * (3.0 if s >= at else 1.0),
        f"bf16, max_norm 1: the typical norm jumps 3x (0.26 -> 0.8) at step {at} "
        "and stays there", [("GradNormDrift", at, 50)], at,
        allowed=["ClipFractionHigh"])


@scenario
def clip_rate_jump(rng, out):
    # Typical norm 0.68 (about 1% of steps above max_norm 1), then 0.87 from
    # `at`: about 20% clipped. The level moves 1.28x: no drift.
    run = Run(5000, 200, 0.68, 0.68)
    at, hi = 3000, 0.87
    noise = LogNoise(random.Random(0), 0.15)
    rate = noise.prob_above(math.log(1.0 / hi))
    check(0.15 <= rate <= 0.25, f"clip-rate-jump clips {rate:.3f}")
    return level_run(
        "clip-rate-jump", rng, out, run,
        lambda s: run.median(s) if s < at else hi,
        f"bf16, max_norm 1: the clipped share jumps from ~1% to {100 * rate:.0f}% "
        f"at step {at} (the typical norm moves 1.28x)",
        [("ClipFractionHigh", at, 90)], at, pages=["ClipFractionHigh"])


@scenario
def clip_hover(rng, out):
    # The clipped share wanders between 4.6% and 7% for 9,000 steps.
    run = Run(10200, 200, 0.6, 0.6)
    noise = LogNoise(random.Random(0), 0.15)
    level = {}
    wander = random.Random(7)
    target = 0.055
    for block in range(0, run.steps + 300, 300):
        target = wander.uniform(0.046, 0.07)
        # The median whose share above max_norm 1 is `target`.
        lo, hi = 0.1, 1.0
        for _ in range(50):
            mid = 0.5 * (lo + hi)
            (lo, hi) = (mid, hi) if noise.prob_above(math.log(1.0 / mid)) < target else (lo, mid)
        level[block // 300] = lo
    return level_run(
        "clip-hover", rng, out, run,
        lambda s: run.median(s) if s < 1200 else level[s // 300],
        "bf16, max_norm 1: the clipped share hovers between 4.6% and 7% from "
        "step 1200 to the end (9,000 steps): one alert, not a flapping pager",
        [("ClipFractionHigh", 1200, 1500)], 1200, pages=["ClipFractionHigh"],
        max_fires={"ClipFractionHigh": 2})


@scenario
def scale_bleed(rng, out):
    run = Run(5000, 200, 0.4)
    at = 2000

    def overflow(step, scale):
        # From `at`, one overflow every 150 steps: never 2000 clean steps in a
        # row, so the scale never grows back.
        return early_overflows(step, scale) or (step > at and (step - at) % 150 == 0)

    e, scaler, skipped = fp16_run(
        "scale-bleed", rng, out, run, overflow,
        f"fp16: from step {at} the scale halves every 150 steps and never grows "
        "back (0.7% of steps skipped, never 4 halvings within 100 steps)",
        expected=[("LossScaleCollapse", at + 150, 1200)], allowed=["SkipRateHigh"],
        failure_step=at)
    check(max_halvings_without_growth(scaler.history) < 4, "scale-bleed collapses fast")
    e["pages"] = ["LossScaleCollapse"]
    return e


@scenario
def logit_climb(rng, out):
    # Baseline ~60 (2x is past the cap), climbing linearly to 100 at step
    # 6200: named at least 1,000 steps before the crossing.
    run = Run(7000, 200, 0.45)
    start_climb, cross, lo = 1500, 6200, 60.0

    def level(step):
        f = max(0.0, (step - start_climb) / (cross - start_climb))
        return lo + (100.0 - lo) * f

    return logit_logz_run(
        "logit-climb", rng, out, run,
        lambda step: attn_logit(rng, step, run.warmup, level(step)),
        lambda step: 10.8 + rng.gauss(0, 0.05),
        f"bf16, the max attention logit starts at ~{lo:g} and climbs linearly "
        f"from step {start_climb} to 100 at step {cross}: forecast before it crosses",
        [("AttentionLogitGrowth", cross - 1000, 0)], start_climb)


@scenario
def ranks_far_apart(rng, out):
    # Per-shard clipping from step `at`; rank 1's whole log arrives after
    # rank 0 has finished (a client catching up after an outage).
    name = "ranks-far-apart"
    run = Run(6000, 200, 0.5)
    at = 1500
    start = run_start(name, precision="BF16", warmup_steps=run.warmup)
    logs, files = open_logs(out, name, 2, start)
    noise = LogNoise(rng, 0.15)
    for step in range(1, run.steps + 1):
        norm = num(run.median(step) * math.exp(noise.next()))
        rec = run.base(rng, step, norm)
        for rank, log in enumerate(logs):
            r = dict(rec)
            if step >= at:
                share = 0.5 + (0.06 if rank == 0 else -0.06) + rng.gauss(0, 0.01)
                r["grad_norm"] = num(norm * math.sqrt(share))
            log.step(r)
            checkpoints(log, step)
    finish(logs, run.steps)
    return entry(name, f"2 ranks agreeing until step {at}, then clipping by their own "
                 "shard's norm; rank 1's log is replayed after rank 0's has ended "
                 f"({run.steps} steps apart)", None, run,
                 [("RankNormMismatch", at, 0)], failure_step=at, world_size=2,
                 replay=[[files[0]], [files[1]]])


@scenario
def absorbed_spikes(rng, out):
    # 10-15x norm spikes that clipping absorbs: the loss does not move.
    run = Run(6000, 200, 0.45)
    at = [2500, 3700, 4900]
    mult = {s: rng.uniform(10.0, 15.0) for s in at}
    return level_run(
        "absorbed-spikes", rng, out, run, run.median,
        f"bf16, max_norm 1: grad-norm spikes of 10-15x at steps {at} that clipping "
        "absorbs (the loss does not move): info only, nothing pages",
        [("GradNormSpike", at[0])], at[0], pages=[], spikes=at,
        excursion=lambda s: mult.get(s, 1.0))


@scenario
def loss_spike(rng, out):
    # BLOOM-176B's first spike, in shape: the norm climbs from 0.24 to ~960
    # over 8 steps while the loss goes 2.2 -> 5.1, both back in ~30 steps.
    run = Run(5000, 200, 0.24, 0.22)
    at = 3000

    def bump(step):
        """0 -> 1 over 8 steps, 1 -> 0 over the next 30."""
        if at <= step < at + 8:
            return (step - at + 1) / 8.0
        if at + 8 <= step < at + 38:
            return (at + 38 - step) / 30.0
        return 0.0

    spikes = [s for s in range(at, at + 38) if bump(s) > 0]
    return level_run(
        "loss-spike", rng, out, run,
        run.median,
        f"bf16, a BLOOM-like loss spike at step {at}: grad norm 0.24 -> ~960 in 8 "
        "steps, loss 2.2 -> 5.1, both recovered ~30 steps later",
        [("LossSpike", at + 2, 10)], at,
        allowed=["GradNormSpike", "ClipFractionHigh", "GradNormDrift"],
        pages=["LossSpike"], spikes=spikes,
        excursion=lambda s: 4000.0 ** bump(s),
        loss_of=lambda s, loss: loss * (5.1 / 2.2) ** bump(s))


@scenario
def healthy_heavy_tailed(rng, out):
    # Occasional single-step 4-6x excursions on top of the usual tails.
    run = Run(9000, 300, 0.4)
    exc = {s: rng.uniform(4.0, 6.0) for s in range(1500, 9000) if rng.random() < 0.002}
    return level_run(
        "healthy-heavy-tailed", rng, out, run, run.median,
        f"bf16, healthy, noisier norms (sigma 0.2) with {len(exc)} single-step "
        "excursions of 4-6x: nothing pages", [], None, allowed=["GradNormSpike"],
        pages=[], sigma=0.2, spikes=list(exc), excursion=lambda s: exc.get(s, 1.0))


@scenario
def healthy_cosine_end(rng, out):
    # Cosine LR to 1% of its peak; over the last 15% of the run the norm rises
    # 2.3x as the LR reaches its floor (AdamW: steady-state norm ~ sqrt(wd/lr)).
    run = Run(10000, 300, 0.4, 0.36)
    rise_from = run.steps - int(0.15 * run.steps)

    def lr(step):
        if step < run.warmup:
            return run.peak_lr * step / run.warmup
        return run.peak_lr * (0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * run.progress(step))))

    def median(step):
        f = max(0.0, (step - rise_from) / (run.steps - rise_from))
        return run.median(step) * 2.3 ** f

    return level_run(
        "healthy-cosine-end", rng, out, run, median,
        "bf16, cosine LR to 1% of its peak; the norm rises 2.3x over the last "
        "15% of the run as the LR reaches its floor: not drift", [], None,
        pages=[], lr_of=lr)


@scenario
def healthy_fp16_sawtooth(rng, out):
    run = Run(12000, 300, 0.4)
    # A few stray overflows, at least 1500 steps apart.
    stray = set()
    while len(stray) < 4:
        s = rng.randrange(1000, 12000)
        if all(abs(s - t) >= 1500 for t in stray):
            stray.add(s)

    def overflow(step, scale):
        # The scale grows every 1000 clean steps; above 2^15 an overflow comes
        # within ~100 steps and halves it back; a few stray overflows.
        return (early_overflows(step, scale) or step in stray
                or (scale > 2.0**15 and rng.random() < 0.01))

    e, scaler, skipped = fp16_run(
        "healthy-fp16-sawtooth", rng, out, run, overflow,
        f"fp16, GradScaler growth every 1000 clean steps: the scale grows past "
        f"2^15, overflows within ~100 steps and halves back, {len(stray)} stray "
        "overflows: nothing pages", scaler=Scaler(growth_interval=1000))
    check(max_halvings_without_growth(scaler.history) < 4, "sawtooth collapses")
    e["pages"] = []
    return e
# ----------------------------------------------- step times, input waits


def timed_run(name, rng, out, world, description, slow_rank=None, slow_from=None,
              slow=1.0, stall_from=None, expected=(), failure_step=None):
    """An 8-rank (or `world`-rank) bf16 data-parallel run whose records carry
    step_time_s: 0.4 s with +-10% uniform jitter per rank and step, x4 on
    every rank at each checkpoint save (every 1000 steps) and x2 on every
    rank for the two steps of each evaluation (every 250 steps); rank
    `slow_rank` is `slow` x slower from `slow_from` on. Four ranks a host.
    The lead rank's data_wait_s is 2% of its step, and 35% from `stall_from`
    on (its step time grows by the wait)."""
    run = Run(3000, 200, 0.45)
    start = run_start(name, precision="BF16", warmup_steps=run.warmup)
    files = ([f"{name}.jsonl"] if world == 1
             else [f"{name}.rank{r}.jsonl" for r in range(world)])
    logs = [RankLog(os.path.join(out, f) if out else None,
                    dict(start, rank=r, world_size=world, host=f"gpu-node-{r // 4}"))
            for r, f in enumerate(files)]
    noise = LogNoise(rng, 0.15)
    base_s = STEP_TIME_NS * 1e-9
    for step in range(1, run.steps + 1):
        norm = run.median(step) * math.exp(noise.next())
        rec = run.base(rng, step, norm)
        everyone = 1.0
        if step % 1000 == 0:
            everyone = 4.0
        elif step % 250 in (0, 1):
            everyone = 2.0
        for rank, log in enumerate(logs):
            t = base_s * rng.uniform(0.9, 1.1) * everyone
            if rank == slow_rank and step >= slow_from:
                t *= slow
            r = dict(rec, step_time_s=num(t, 5))
            if rank == 0:
                wait = 0.02 * t
                if stall_from is not None and step >= stall_from:
                    wait = 0.35 * t / 0.65 * rng.uniform(0.9, 1.1)
                    t += wait
                    r["step_time_s"] = num(t, 5)
                r["data_wait_s"] = num(wait, 5)
            log.step(r)
            checkpoints(log, step)
    finish(logs, run.steps)
    return entry(name, description, files, run, expected, failure_step=failure_step,
                 world_size=world)


@scenario
def healthy_8rank_jitter(rng, out):
    return timed_run("healthy-8rank-jitter", rng, out, 8,
                     "8 ranks on 2 hosts, step times with +-10% jitter, every rank "
                     "4x slower on checkpoint saves and 2x on two-step evaluations")


@scenario
def rank_straggler(rng, out):
    at = 1500
    return timed_run("rank-straggler", rng, out, 8,
                     f"8 ranks with jittery step times; rank 5 (gpu-node-1) runs "
                     f"30% slower from step {at}", slow_rank=5, slow_from=at,
                     slow=1.3, expected=[("RankStraggler", at, 100)], failure_step=at)


@scenario
def input_pipeline_stall(rng, out):
    at = 1500
    return timed_run("input-pipeline-stall", rng, out, 1,
                     f"one rank whose input pipeline stalls from step {at}: it "
                     "waits 35% of each step for data (2% before)", stall_from=at,
                     expected=[("InputPipelineStall", at, 100)], failure_step=at)


# ------------------------------------------------------- mixture of experts
#
# MoE runs (the Moe* rows of docs/detectors.md). A step line's "moe" is one
# routing report: per MoE layer, the routed assignments per expert in the
# step's global batch (tokens x top_k, before any capacity drop), the drops
# past capacity (when not dropless), the normalised balancing loss, the
# router z-loss (when the run has one), the aux-free bias (when it balances
# by bias) and the largest router logit.
#
# Realism, shared by the MoE scenarios unless one says otherwise:
# - 32,768 tokens a step; a layer's experts have a persistent lognormal
#   skew of their share (sd 0.25 in log space, placed at normal quantiles:
#   the busiest expert ~1.6x the mean, as aux-loss-balanced runs settle;
#   twice as wide at init, balanced away in ~100 steps), a slow AR(1)
#   wander (the data mix) and a per-step jitter (the batch's mix); the
#   counts are a multinomial-like draw of the assignments over those
#   shares (normal approximation), no expert above one per token;
# - the balancing loss is E x sum(f_i P_i), f the assignment shares and P
#   the router's mean probabilities (flatter than f): ~1.04 at this skew;
# - the z-loss starts at (ln E)^2 (logits near 0), settles near 1 within
#   ~300 steps and declines slowly (30% over the run), 12% noise from report
#   to report; the largest logit grows from 1.7 and settles near 3 (with
#   z-loss) or keeps growing slowly (without);
# - an aux-free bias is updated every step as DeepSeek-V3's, bias += rate x
#   sign(mean load - load), and re-centred (its mean subtracted), except
#   where a scenario keeps the update as published (Megatron-Core's and
#   DeepSeek-V3's are not re-centred: the batch's jitter is lognormal, a
#   right-skewed load, more experts sit below the mean load than above, and
#   the mean creeps up ~2e-5 a step; a shift of every bias by one amount
#   changes no routing);
# - a fault is an offset of some experts' log shares from a step on (a
#   routing bias the router learned, -inf: never routed), a multiplier of
#   the z-loss, or a changed bias update.
#
# The onsets are read off the process without its per-step noise (the
# shares without the batch's jitter and the draw, the z-loss without its
# report noise, the bias as it is) against the rules of docs/detectors.md
# and their constants in deploy/trainwatch.yaml (moe:): where a level (the
# median of 10 reports) crosses its line, N steps later for a rule that
# must hold N steps, and no earlier than the first report judged.

MOE_TOKENS = 32_768  # tokens in a step's global batch
MOE_BIAS_RATE = 1e-3  # the aux-free bias's update rate
MOE_SETTLE = 200  # moe.settle_steps: no Moe rule judges earlier post-warmup steps
MOE_LEVEL = 10  # moe.level_reports: a level is the median of this many reports
MOE_PERSIST = 100  # moe.persist_steps (MoeImbalanceHigh, MoeRouterZLossGrowth)
MOE_DEAD = 100  # moe.dead_steps
MOE_COLLAPSE_MULTIPLE = 2.0  # moe.collapse_top_k_multiple


def n90(shares):
    """The fewest experts that carry 90% of the assignments."""
    total = 0.0
    for i, s in enumerate(sorted(shares, reverse=True)):
        total += s
        if total >= 0.9 * sum(shares):
            return i + 1
    return len(shares)


def block_ratio(shares, ep_size):
    """The busiest expert-parallel block's load over the mean block's."""
    per = len(shares) // ep_size
    blocks = [sum(shares[b * per:(b + 1) * per]) for b in range(ep_size)]
    return max(blocks) / (sum(blocks) / ep_size)


def mean_sd(xs):
    m = sum(xs) / len(xs)
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


class MoeLayer:
    """One MoE layer's router, step by step: the shares of the assignments,
    their draw, its balancing loss, z-loss, largest logit and aux-free bias.
    `offset(step)` gives per-expert offsets of the log shares (None: none),
    `z_mult(step)` a multiplier of the z-loss; with `bias_update` the layer
    balances by an aux-free bias (sign update, re-centred unless
    `recentre` is False; from step `idle_from`, if given, the update reads
    the experts in `idle` as having no load: their biases rise by the rate
    every step, whatever their load). `max_mean_at` keeps each step's drawn
    max/mean load."""

    SKEW = 0.25
    WANDER_AR = 0.99
    WANDER = 0.007  # stationary sd 0.05
    JITTER = 0.05
    BIAS_GAIN = 10.0  # log share per unit of bias
    P_FLAT = 0.7  # the mean router probabilities: the shares^0.7, normalised

    def __init__(self, rng, name, experts, top_k, z_loss=True, offset=None,
                 z_mult=None, bias_update=False, idle_from=None, idle=(), recentre=True):
        self.rng = rng
        self.name = name
        self.experts = experts
        self.top_k = top_k
        q = [statistics.NormalDist().inv_cdf((i + 0.5) / experts) for i in range(experts)]
        rng.shuffle(q)
        self.skew = [self.SKEW * x for x in q]
        self.wander = [0.0] * experts
        self.bias = [0.0] * experts
        self.z_loss = z_loss
        self.z_settled = rng.uniform(0.8, 1.2)
        self.offset = offset or (lambda step: None)
        self.z_mult = z_mult or (lambda step: 1.0)
        self.bias_update = bias_update
        self.idle_from = idle_from
        self.idle = set(idle)
        self.recentre = recentre
        self.truth = {}  # step -> (shares without noise, z-loss without noise)
        self.bias_at = {}  # step -> the bias after the step's update
        self.max_mean_at = {}  # step -> the drawn counts' max/mean

    def _shares(self, step, jitter):
        early = 1.0 + math.exp(-step / 100.0)
        off = self.offset(step) or [0.0] * self.experts
        logw = [early * s + w + self.BIAS_GAIN * b + o
                for s, w, b, o in zip(self.skew, self.wander, self.bias, off)]
        if jitter:
            logw = [x + self.rng.gauss(0.0, self.JITTER) for x in logw]
        top = max(logw)
        w = [math.exp(x - top) for x in logw]
        total = sum(w)
        return cap_shares([x / total for x in w], 1.0 / self.top_k)

    def _draw(self, shares):
        """Assignments per expert: about multinomial, each at most one per
        token, adding up to tokens x top_k."""
        n = MOE_TOKENS * self.top_k
        counts = []
        for p in shares:
            mu = n * p
            c = round(mu + math.sqrt(mu * (1.0 - p)) * self.rng.gauss(0.0, 1.0)) if p > 0 else 0
            counts.append(min(MOE_TOKENS, max(0, c)))
        rest = n - sum(counts)
        for i in sorted(range(len(counts)), key=lambda i: -counts[i]):
            give = max(-counts[i], min(rest, MOE_TOKENS - counts[i]))
            counts[i] += give
            rest -= give
            if rest == 0:
                break
        return counts

    def z_true(self, step, progress):
        z0 = math.log(self.experts) ** 2
        settled = self.z_settled * (1.0 - 0.3 * progress)
        return (settled + (z0 - settled) * math.exp(-step / 60.0)) * self.z_mult(step)

    def logit_true(self, step):
        """The largest router logit: settling near 3 with z-loss; without,
        the router sharpens as it learns (2.0 after warmup, 4.4 at step 6000)."""
        if self.z_loss:
            return (1.7 + 1.3 * (1.0 - math.exp(-step / 150.0))) * math.sqrt(self.z_mult(step))
        return 1.7 * (1.0 + step / 800.0) ** 0.45

    def step(self, step, progress, capacity_factor=0.0):
        """Advances one step; returns the layer's report."""
        self.wander = [self.WANDER_AR * w + self.rng.gauss(0.0, self.WANDER) for w in self.wander]
        z = self.z_true(step, progress)
        self.truth[step] = (self._shares(step, False), z)
        shares = self._shares(step, True)
        counts = self._draw(shares)
        n = MOE_TOKENS * self.top_k
        self.max_mean_at[step] = max(counts) * self.experts / n
        f = [c / n for c in counts]
        probs = [s**self.P_FLAT for s in shares]
        total = sum(probs)
        aux = self.experts * sum(fi * p / total for fi, p in zip(f, probs))
        rep = {"layer": self.name, "tokens_per_expert": counts}
        if capacity_factor > 0:
            cap = math.ceil(capacity_factor * n / self.experts)
            rep["dropped"] = sum(max(0, c - cap) for c in counts)
        rep["aux_loss"] = num(aux * math.exp(self.rng.gauss(0.0, 0.003)), 6)
        if self.z_loss:
            rep["z_loss"] = num(z * math.exp(self.rng.gauss(0.0, 0.12)), 5)
        logit = self.logit_true(step) * math.exp(self.rng.gauss(0.0, 0.04))
        rep["router_logit_max"] = num(logit, 5)
        if self.bias_update:
            mean = n / self.experts
            seen = counts
            if self.idle_from is not None and step >= self.idle_from:
                seen = [0 if e in self.idle else c for e, c in enumerate(counts)]
            self.bias = [b + MOE_BIAS_RATE * ((mean > c) - (mean < c))
                         for b, c in zip(self.bias, seen)]
            if self.recentre:
                centre = sum(self.bias) / self.experts
                self.bias = [b - centre for b in self.bias]
            self.bias_at[step] = list(self.bias)
            rep["expert_bias"] = [num(b, 6) for b in self.bias]
        return rep


def cap_shares(shares, cap):
    """Shares with none above `cap` (top-k routes a token to k distinct
    experts), the excess spread over the others in proportion."""
    shares = list(shares)
    for _ in range(len(shares)):
        over = [i for i, s in enumerate(shares) if s > cap]
        if not over:
            break
        excess = sum(shares[i] - cap for i in over)
        rest = sum(s for i, s in enumerate(shares) if s < cap)
        for i, s in enumerate(shares):
            shares[i] = cap if s >= cap else s + excess * s / rest
    return shares


def moe_run(name, rng, out, run, layers, every=1, balancing="AUX_LOSS", top_k=2,
            capacity_factor=0.0, ep_size=1):
    """A bf16 MoE run whose records carry a routing report of `layers`
    (MoeLayer) every `every` steps; returns its files."""
    moe = {"num_experts": layers[0].experts, "top_k": top_k, "ep_size": ep_size,
           "balancing": balancing,
           "aux_loss_coeff": 0.01 if balancing == "AUX_LOSS" else 0.0,
           "z_loss_coeff": 1e-3 if layers[0].z_loss else 0.0,
           "capacity_factor": capacity_factor}
    if balancing == "AUX_FREE_BIAS":
        moe["bias_update_rate"] = MOE_BIAS_RATE
    start = run_start(name, precision="BF16", warmup_steps=run.warmup, moe=moe,
                      labels={"model": f"moe-{moe['num_experts']}x-top{top_k}",
                              "suite": "scenarios"})
    logs, files = open_logs(out, name, 1, start)
    noise = LogNoise(rng, 0.15)
    for step in range(1, run.steps + 1):
        rec = run.base(rng, step, run.median(step) * math.exp(noise.next()))
        reports = [layer.step(step, run.progress(step), capacity_factor) for layer in layers]
        if step % every == 0:
            rec["moe"] = {"layers": reports}
        logs[0].step(rec)
        checkpoints(logs[0], step)
    finish(logs, run.steps)
    return files


def moe_layers(rng, n, experts=16, top_k=2, **kw):
    return [MoeLayer(rng, str(i), experts, top_k, **kw) for i in range(n)]


def moe_first_judged(run, every):
    """The first report the Moe rules judge: moe.settle_steps past the
    first post-warmup report."""
    first = -(-run.warmup // every) * every
    return first + -(-MOE_SETTLE // every) * every


def first_step(steps, cond, what):
    """The first of `steps` (in order) at which cond(step) holds."""
    for s in steps:
        if cond(s):
            return s
    sys.exit(f"generate.py: self-check failed: {what} never meets its rule")


def growth_over(values, steps, within=500):
    """The largest ratio of a value to the lowest of the `within` steps
    before it (values: step -> value), over `steps`."""
    return max(values[s] / min(values[t] for t in range(max(1, s - within), s + 1))
               for s in steps)


def moe_check_healthy(name, run, layers, every, imbalance=(1.4, 1.9)):
    """A healthy run's settled load: each layer's max/mean (its median) in
    `imbalance`, n90 far from a collapse, no expert starved; its router
    logits (z-loss, else the largest logit) never 1.5x their low of the 500
    steps before."""
    judged = range(moe_first_judged(run, every), run.steps + 1)
    for layer in layers:
        mm = sorted(max(layer.truth[s][0]) * layer.experts for s in judged)
        check(imbalance[0] <= mm[len(mm) // 2] <= imbalance[1],
              f"{name}: layer {layer.name}'s max/mean {mm[len(mm) // 2]:.2f}")
        check(min(n90(layer.truth[s][0]) for s in judged) > 2 * layer.top_k + 2,
              f"{name}: layer {layer.name} close to a collapse")
        check(min(min(layer.truth[s][0]) for s in judged) > 0,
              f"{name}: layer {layer.name} starves an expert")
        logits = {s: layer.truth[s][1] if layer.z_loss else layer.logit_true(s)
                  for s in range(1, run.steps + 1)}
        check(growth_over(logits, judged) < 1.5, f"{name}: layer {layer.name}'s logits grow")


@scenario
def healthy_moe(rng, out):
    name = "healthy-moe"
    run = Run(6000, 200, 0.4)
    layers = moe_layers(rng, 2)
    files = moe_run(name, rng, out, run, layers, capacity_factor=2.0)
    moe_check_healthy(name, run, layers, 1)
    return entry(name, "MoE, 16 experts top-2, 2 layers, aux loss 0.01 and z-loss 1e-3, "
                 "capacity factor 2.0: the busiest expert ~1.6x the mean (natural "
                 "skew), balancing loss ~1.04, z-loss settling near 1, a report "
                 "every step: nothing pages", files, run, pages=[])


@scenario
def healthy_moe_bias(rng, out):
    name = "healthy-moe-bias"
    run = Run(6000, 200, 0.4)
    every = 5
    layers = moe_layers(rng, 2, bias_update=True)
    files = moe_run(name, rng, out, run, layers, every=every, balancing="AUX_FREE_BIAS")
    moe_check_healthy(name, run, layers, every, imbalance=(1.0, 1.5))
    worst = max(abs(mean_sd(b)[0]) for layer in layers for b in layer.bias_at.values())
    check(worst < 20 * MOE_BIAS_RATE, f"{name}: the bias mean wanders to {worst:.3g}")
    return entry(name, "MoE, 16 experts top-2, 2 layers, aux-loss-free balancing by "
                 "expert bias (sign update, rate 1e-3, re-centred; "
                 "the aux loss reported as a diagnostic), z-loss 1e-3, a report "
                 "every 5 steps: nothing pages", files, run, pages=[])


@scenario
def healthy_moe_bias_megatron(rng, out):
    name = "healthy-moe-bias-megatron"
    run = Run(6000, 200, 0.4)
    every = 5
    layers = moe_layers(rng, 2, bias_update=True, recentre=False)
    files = moe_run(name, rng, out, run, layers, every=every, balancing="AUX_FREE_BIAS")
    moe_check_healthy(name, run, layers, every, imbalance=(1.0, 1.5))
    first = moe_first_judged(run, every)
    reports = range(first, run.steps + 1, every)
    for layer in layers:
        # Balanced as the server sees it: the drawn max/mean's level (the
        # median of moe.level_reports reports) ~1.1, never near the 1.5 at
        # which MoeExpertBiasDrift's rules call a load uneven.
        levels = [statistics.median(layer.max_mean_at[t] for t in
                                    range(s - (MOE_LEVEL - 1) * every, s + 1, every))
                  for s in reports]
        check(1.0 < statistics.median(levels) < 1.3 and max(levels) < 1.4,
              f"{name}: layer {layer.name}'s load level {statistics.median(levels):.2f} "
              f"(at most {max(levels):.2f})")
        # The mean drifts as the published update makes it: ~1e-5-3e-5 a
        # step, one way, while the spread holds (the relative biases
        # balance the skew).
        (m0, sd0), (m1, sd1) = mean_sd(layer.bias_at[first]), mean_sd(layer.bias_at[run.steps])
        drift = (m1 - m0) / (run.steps - first)
        check(1e-5 <= drift <= 3e-5, f"{name}: layer {layer.name}'s bias mean drifts "
              f"{drift:.2g} a step")
        check(abs(m1) >= 2 * sd1 and abs(m1) >= 20 * MOE_BIAS_RATE,
              f"{name}: layer {layer.name}'s bias mean {m1:.3g} stays within its spread "
              f"{sd1:.3g} (the scenario is meant to show a drift on a balanced load)")
    m, sd = mean_sd(layers[0].bias_at[run.steps])
    climb = (m - mean_sd(layers[0].bias_at[first])[0]) / (run.steps - first)
    return entry(name, "MoE, 16 experts top-2, 2 layers, aux-loss-free balancing by "
                 "expert bias as Megatron-Core and DeepSeek-V3 publish it (sign update, "
                 "rate 1e-3, not re-centred), z-loss 1e-3, a report every 5 steps: the "
                 "load's jitter is right-skewed, more experts sit below the mean load "
                 f"than above, and the bias's mean climbs ~{climb:.1g} a step ({m:.2f} at "
                 f"the end, {m / sd:.0f}x its spread {sd:.3f}) while the load stays "
                 "balanced (max/mean ~1.1): a shift of every bias by one amount "
                 "changes no routing: nothing pages", files, run, pages=[])


@scenario
def healthy_moe_no_zloss(rng, out):
    name = "healthy-moe-no-zloss"
    run = Run(6000, 200, 0.4)
    layers = moe_layers(rng, 2, experts=8, z_loss=False)
    files = moe_run(name, rng, out, run, layers)
    moe_check_healthy(name, run, layers, 1, imbalance=(1.3, 1.8))
    first = moe_first_judged(run, 1)
    logit = {s: layers[0].logit_true(s) for s in range(1, run.steps + 1)}
    return entry(name, "MoE, 8 experts top-2, 2 layers, aux loss, no z-loss (none "
                 "reported): the largest router logit grows slowly as the router "
                 f"learns, {logit[first]:.1f} -> {logit[run.steps]:.1f} from step {first} "
                 f"to the end (at most {growth_over(logit, range(first, run.steps + 1)):.2f}x "
                 "in 500 steps): nothing pages", files, run, pages=[])


@scenario
def moe_router_collapse(rng, out):
    name = "moe-router-collapse"
    run = Run(4000, 200, 0.4)
    at, ramp = 2000, 30
    hot = set(rng.sample(range(16), 2))

    def offset(step):
        # The aux loss detached (no pull back): two experts' logits run away.
        beta = 7.0 * min(1.0, max(0.0, (step - at) / ramp))
        return [beta if e in hot else 0.0 for e in range(16)]

    layers = [MoeLayer(rng, "0", 16, 2), MoeLayer(rng, "1", 16, 2, offset=offset)]
    files = moe_run(name, rng, out, run, layers)
    limit = min(MOE_COLLAPSE_MULTIPLE * 2, 16 / 2)  # x top_k, at most half the experts
    onset = first_step(range(at, run.steps + 1),
                       lambda s: n90(layers[1].truth[s][0]) <= limit, name)
    share = sum(layers[1].truth[run.steps][0][e] for e in hot)
    return entry(name, f"MoE, 16 experts top-2, 2 layers: from step {at} the aux loss "
                 f"is detached and layer 1 routes onto experts {sorted(hot)} within "
                 f"{ramp} steps ({100 * share:.0f}% of its assignments; n90 <= {limit:g} "
                 f"from step {onset})", files, run, [("MoeRouterCollapse", onset, MOE_LEVEL)],
                 allowed=["MoeImbalanceHigh", "MoeAuxLossOffBalance", "MoeDeadExpert"],
                 failure_step=at, pages=["MoeRouterCollapse"])


@scenario
def moe_dead_expert(rng, out):
    name = "moe-dead-expert"
    run = Run(4000, 200, 0.4)
    at, dead, every = 2000, 5, 10

    def offset(step):
        # The expert's router bias pushed to -20: never routed again.
        return [-math.inf if e == dead and step >= at else 0.0 for e in range(16)]

    layers = [MoeLayer(rng, "0", 16, 2, offset=offset), MoeLayer(rng, "1", 16, 2)]
    files = moe_run(name, rng, out, run, layers, every=every)
    check(at % every == 0, f"{name}: the death is not on a report")
    # Starved on every report for moe.dead_steps (the rule: step - its first
    # empty report >= dead_steps, on >= 3 reports).
    onset = at + MOE_DEAD
    return entry(name, f"MoE, 16 experts top-2, 2 layers, a report every {every} steps: "
                 f"from step {at} layer 0's expert {dead} gets no assignment", files,
                 run, [("MoeDeadExpert", onset, every)], failure_step=at,
                 pages=["MoeDeadExpert"])


@scenario
def moe_tokens_dropped(rng, out):
    name = "moe-tokens-dropped"
    run = Run(4000, 200, 0.4)
    cf = 1.0
    layers = moe_layers(rng, 2)
    files = moe_run(name, rng, out, run, layers, capacity_factor=cf)
    onset = moe_first_judged(run, 1)

    def expected_drop(s):
        """Over both layers: the shares above capacity, their mean."""
        over = [max(0.0, p - cf / layer.experts) for layer in layers for p in layer.truth[s][0]]
        return sum(over) / len(layers)

    check(min(expected_drop(s) for s in range(onset, run.steps + 1)) > 0.02,
          f"{name}: drops under 2%")
    return entry(name, f"MoE, 16 experts top-2, 2 layers, capacity factor {cf:g} from "
                 "the start with the natural skew (the busiest expert ~1.6x the mean): "
                 f"~{100 * expected_drop(onset):.0f}% of the assignments dropped; judged "
                 f"from step {onset} (moe.settle_steps past warmup)", files, run,
                 [("MoeTokensDropped", onset, MOE_LEVEL)], failure_step=1,
                 pages=["MoeTokensDropped"])


@scenario
def moe_zloss_growth(rng, out):
    name = "moe-zloss-growth"
    run = Run(4000, 200, 0.4)
    at, rise, top = 2000, 150, 3.5

    def z_mult(step):
        # The router's logits run away (router in bf16, its LR too high):
        # the z-loss rises 3.5x over 150 steps and stays.
        return top ** min(1.0, max(0.0, (step - at) / rise))

    layers = [MoeLayer(rng, "0", 16, 2), MoeLayer(rng, "1", 16, 2, z_mult=z_mult)]
    files = moe_run(name, rng, out, run, layers)
    z = {s: layers[1].truth[s][1] for s in range(1, run.steps + 1)}
    base = z[moe_first_judged(run, 1)]
    # >= z_ratio (2) x its lowest over the z_growth_steps (500) before, and
    # x its level when the run settled; held moe.persist_steps.
    cross = first_step(range(at, run.steps + 1),
                       lambda s: z[s] >= 2 * min(z[t] for t in range(s - 500, s + 1))
                       and z[s] >= 2 * base, name)
    return entry(name, f"MoE, 16 experts top-2, 2 layers, z-loss 1e-3: from step {at} "
                 f"layer 1's z-loss rises {top:g}x over {rise} steps (2x its low at "
                 f"step {cross}) and stays", files, run,
                 [("MoeRouterZLossGrowth", cross + MOE_PERSIST, MOE_LEVEL)],
                 failure_step=at, pages=["MoeRouterZLossGrowth"])


@scenario
def moe_bias_drift(rng, out):
    name = "moe-bias-drift"
    run = Run(4000, 200, 0.4)
    at, every = 2000, 5
    idle = (14, 15)
    # The update as Megatron-Core and DeepSeek-V3 publish it (sign, not
    # re-centred), its mean load taken from the batch (tokens x top_k /
    # experts). From step `at` the gather of the counts it reads leaves the
    # last two experts' slots unwritten (0): they look idle whatever their
    # load, and their biases rise by the rate every step. The other experts'
    # biases keep up only while they sit under the mean load, and the
    # batch's jitter puts some of them over it report after report (their
    # biases fall): the idle two gain on them, the load goes uneven, and
    # every bias climbs with theirs, the mean ~1e-3 a step, far past its
    # spread. (Re-centred, the mean would stay at 0 and only the load's
    # rules would see it; with the mean taken from the counts, as
    # Megatron-Core takes it, the two zeros pull it under the other experts'
    # loads, their biases fall, and the routing collapses onto the two.)
    layers = moe_layers(rng, 2, bias_update=True, recentre=False, idle_from=at, idle=idle)
    files = moe_run(name, rng, out, run, layers, every=every, balancing="AUX_FREE_BIAS")
    first = moe_first_judged(run, every)
    reports = range(first, run.steps + 1, every)

    def level(f, s):
        """f's level at report s: the median of its last MOE_LEVEL reports."""
        return statistics.median(f(t) for t in range(s - (MOE_LEVEL - 1) * every, s + 1, every))

    def load(layer):
        """The layer's max/mean, the shares without the batch's jitter and
        the draw."""
        return lambda t: max(layer.truth[t][0]) * layer.experts

    def mean_over_sd(layer):
        return lambda t: abs(mean_sd(layer.bias_at[t])[0]) / mean_sd(layer.bias_at[t])[1]

    def holds(layer, s, ratio=1.0):
        # MoeExpertBiasDrift's drift (docs/detectors.md): the bias's |mean|
        # >= moe.bias_mean_sd (2) x its spread (its level) and >= 20 x the
        # update rate, while the load's max/mean level >= 1.5; `ratio` of
        # the way from neutral to those lines (0.8: what holds a firing
        # alert).
        return (level(mean_over_sd(layer), s) >= ratio * 2 and
                abs(mean_sd(layer.bias_at[s])[0]) >= ratio * 20 * MOE_BIAS_RATE and
                level(load(layer), s) >= 1 + ratio * 0.5)

    onset = first_step(reports, lambda s: any(holds(l, s) for l in layers), name)
    check(onset > at, f"{name}: the rule holds at step {onset}, before the fault")
    for layer in layers:
        # Before the fault the bias's mean drifts as the published update's
        # does (healthy-moe-bias-megatron) on a balanced load: the drawn
        # max/mean's level (what the server judges) under 1.4.
        drawn = max(level(lambda t: layer.max_mean_at[t], s) for s in reports if s < at)
        check(drawn < 1.4, f"{name}: layer {layer.name}'s load level {drawn:.2f} before "
              "the fault")
        # Uneven, not collapsed: no expert starves, n90 far from 2 x top_k.
        after = range(at, run.steps + 1, every)
        low = min(min(layer.truth[s][0]) * layer.experts for s in after)
        check(low > 0.3, f"{name}: layer {layer.name} starves an expert ({low:.2f}x the mean)")
        check(min(n90(layer.truth[s][0]) for s in after) > 2 * layer.top_k + 2,
              f"{name}: layer {layer.name} close to a collapse")
        end = level(load(layer), run.steps)
        check(1.9 <= end <= 2.8, f"{name}: layer {layer.name}'s load level {end:.2f} at the end")
    # One alert: from the onset to the end some layer holds the lines that
    # keep it firing.
    check(all(any(holds(l, s, 0.8) for l in layers) for s in reports if s >= onset),
          f"{name}: the drift lets go after step {onset}")
    lv = [level(load(l), run.steps) for l in layers]
    m, sd = mean_sd(layers[0].bias_at[run.steps])
    climb = (m - mean_sd(layers[0].bias_at[at])[0]) / (run.steps - at)
    return entry(name, "MoE, 16 experts top-2, 2 layers, aux-free bias by the published "
                 "sign update (Megatron-Core's, DeepSeek-V3's: rate 1e-3, not re-centred), "
                 "its mean load taken from the batch (tokens x top_k / experts), a report "
                 f"every {every} steps: from step {at} the update reads "
                 f"experts {idle[0]} and {idle[1]}'s counts as 0 (their slots of the gathered "
                 "counts never written), so their biases rise by the rate every step "
                 "whatever their load; the other experts' keep up only while under the "
                 "mean load, the two take more and more tokens (the load's max/mean level "
                 f"1.5 at step {onset}, {min(lv):.2f}-{max(lv):.2f} at the end, no expert "
                 f"starved) and every bias climbs with theirs: the mean ~{climb:.1g} a step, "
                 f"{m:.2f} at the end, {m / sd:.0f}x its spread", files, run,
                 [("MoeExpertBiasDrift", onset, MOE_LEVEL * every)],
                 # The uneven load is this fault's harm: MoeImbalanceHigh
                 # (level >= 2, or forecast to) pages with it.
                 allowed=["MoeImbalanceHigh"], failure_step=at,
                 pages=["MoeExpertBiasDrift", "MoeImbalanceHigh"],
                 max_fires={"MoeExpertBiasDrift": 1})


@scenario
def moe_ep_imbalance(rng, out):
    name = "moe-ep-imbalance"
    run = Run(4000, 200, 0.4)
    at, ramp, ep, hot_block = 2000, 100, 4, 2
    block = range(hot_block * 4, hot_block * 4 + 4)

    def offset(step):
        # The data mix shifts towards what EP rank 2's experts serve: each
        # of them gets 2.5x its share, over 100 steps.
        f = math.log(2.5) * min(1.0, max(0.0, (step - at) / ramp))
        return [f if e in block else 0.0 for e in range(16)]

    layers = [MoeLayer(rng, "0", 16, 2, offset=offset), MoeLayer(rng, "1", 16, 2)]
    files = moe_run(name, rng, out, run, layers, ep_size=ep)
    onset = first_step(range(at, run.steps + 1),
                       lambda s: block_ratio(layers[0].truth[s][0], ep) >= 1.5, name)
    return entry(name, f"MoE, 16 experts top-2 on {ep} expert-parallel ranks, 2 layers: "
                 f"from step {at} the data mix shifts over {ramp} steps so that layer "
                 f"0's experts on EP rank {hot_block} (experts {block[0]}-{block[-1]}) "
                 f"get 2.5x their share: that rank carries 1.5x the mean rank's from step "
                 f"{onset}", files, run, [("MoeExpertParallelImbalance", onset, MOE_LEVEL)],
                 # The hot experts' layer is uneven too: MoeImbalanceHigh may
                 # fire (its forecast), caused_by the EP alert, so it never pages.
                 allowed=["MoeImbalanceHigh"],
                 failure_step=at, pages=["MoeExpertParallelImbalance"])


@scenario
def moe_mix_shift(rng, out):
    name = "moe-mix-shift"
    run = Run(4000, 200, 0.4)
    at, ramp = 2000, 100
    block = range(8, 12)

    def offset(step):
        # The data mix shifts towards what four experts serve: each gets 2.3x
        # its share, over 100 steps, and stays there (one expert parallel
        # rank: nothing else names it).
        f = math.log(2.3) * min(1.0, max(0.0, (step - at) / ramp))
        return [f if e in block else 0.0 for e in range(16)]

    layers = [MoeLayer(rng, "0", 16, 2, offset=offset), MoeLayer(rng, "1", 16, 2)]
    files = moe_run(name, rng, out, run, layers)
    settled = max(layers[0].truth[moe_first_judged(run, 1)][0]) * 16
    onset = first_step(range(at, run.steps + 1),
                       lambda s: max(layers[0].truth[s][0]) * 16 >= max(2.0, settled + 1.0),
                       name)
    return entry(name, f"MoE, 16 experts top-2, 2 layers: from step {at} the data mix "
                 f"shifts over {ramp} steps so that layer 0's experts {block[0]}-{block[-1]} "
                 f"get 2.3x their share and keep it; the busiest expert's load is its "
                 f"settled level ({settled:.2f}x the mean) + 1 from step {onset}: one "
                 "MoeImbalanceHigh for the whole of it (a report under the line does not "
                 "resolve it)", files, run,
                 [("MoeImbalanceHigh", onset)],
                 # The balancing loss rises with the load and hovers at its line.
                 allowed=["MoeAuxLossOffBalance"], failure_step=at,
                 pages=["MoeImbalanceHigh", "MoeAuxLossOffBalance"],
                 max_fires={"MoeImbalanceHigh": 1})


# --------------------------------------------------------------------- main


def generate(out, names=None):
    """Runs the scenarios in `names` (all when None), writing their files
    into `out` (nothing when out is None); returns their manifest entries."""
    manifest = []
    for fn in SCENARIOS:
        name = fn.__name__.replace("_", "-")
        if names is not None and name not in names:
            continue
        # Seeded by name: adding a scenario leaves the others as they were.
        rng = random.Random(zlib.crc32(name.encode()))
        e = fn(rng, out)
        check(e["name"] == name, f"{fn.__name__} names itself {e['name']}")
        manifest.append(e)
    return manifest


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="directory for the JSONL files and expected.json")
    ap.add_argument("--manifest-only", action="store_true")
    ap.add_argument("--list", action="store_true", help="print the scenario names")
    ap.add_argument("names", nargs="*")
    args = ap.parse_args()
    known = [fn.__name__.replace("_", "-") for fn in SCENARIOS]
    if args.list:
        print("\n".join(known))
        return
    if not args.out:
        ap.error("--out is required")
    unknown = [n for n in args.names if n not in known]
    if unknown:
        ap.error(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(known)}")
    os.makedirs(args.out, exist_ok=True)
    write_dir = None if args.manifest_only else args.out
    manifest = generate(write_dir, set(args.names) if args.names else None)
    with open(os.path.join(args.out, MANIFEST), "w") as f:
        json.dump({"window_steps": WINDOW, "scenarios": manifest}, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
