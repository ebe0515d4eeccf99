#!/usr/bin/python3
"""Train a tiny transformer LM on CPU and stream its health to trainwatch.

A 2-layer causal transformer (d=64, 4 heads, vocab 256) learns a synthetic,
deterministic Markov-chain language the script makes itself (no downloads),
under bf16 autocast, with AdamW, linear warmup and clip_grad_norm_(1.0).
Every step goes to trainwatch through trainwatch.torch.StepHook: pre-clip
norm, clip flag and coefficient, loss, lr, log Z, max attention logit, the
batch's sample ids, per-layer stats every --layer-stats-every steps, and a
checkpoint event every --checkpoint-every steps.

Faults to inject, to see the alerts fire:
  --corrupt-batch-at N   step N trains on random tokens with the loss scaled
                         by --corrupt-scale: a gradient-norm spike (GradNormSpike,
                         with this batch's ids in the alert and the restart plan)
  --drift-logits         the output layer's logits are multiplied by a factor
                         growing each step: log Z drifts (LogZDrift; needs a
                         baseline of W post-warmup steps, 1000 by default)
  --no-zloss             drop the z-loss term (1e-4 * logZ^2) that otherwise
                         keeps log Z near 0
  --fp16-scaler          emulate fp16 dynamic loss scaling (GradScaler's policy,
                         in Python, since GradScaler needs CUDA): report
                         precision fp16, loss_scale and skipped steps
  --auto-restart         close the restart loop after a --corrupt-batch-at
                         spike: stop the attempt, ask the server for the
                         plan (trainwatch.restart_plan), reload its
                         checkpoint, skip its batches (trainwatch.SkipBatches)
                         and finish as attempt 1; the server then marks the
                         spike recovered (or recurred)
  --fault spike          the batches of --fault-steps steps from --fault-at are
                         random tokens: a loss spike the run recovers from
                         (LossSpike, info: the closed loop leaves it alone)
  --fault diverge        the same batches also train at --fault-lr-mult x the
                         learning rate: the run is wrecked and its loss stays
                         up (LossDivergence, critical, with a restart plan).
                         Both faults are keyed to those batches' ids, so
                         skipping them fixes the run
  --control auto|propose apply the server's closed-loop directives with
                         trainwatch.Control (docs/closed-loop.md): a rollback
                         reloads the checkpoint in process, skips the batch
                         ids it names and trains on as attempt + 1. The mode
                         is the server's (--closed-loop, and rollback listed
                         in closed_loop.auto for auto); in propose mode
                         nothing arrives until `trainwatchctl approve ID`
  --lr 0.5               too high a learning rate: clipping on most steps
                         (ClipFractionHigh) and attention logits past the cap
                         (AttentionLogitGrowth); --lr 0.05 is not enough for
                         this model

    build/bin/trainwatch-server &
    PYTHONPATH=build/python /usr/bin/python3 client/examples/train_tiny_lm.py \\
        --server 127.0.0.1:50051 --run tiny/demo --steps 500 --corrupt-batch-at 300
    build/bin/trainwatchctl spikes --run tiny/demo

The closed loop (a checkpoint every 50 steps; closed_loop.auto listing
rollback in the server's --config file):

    build/bin/trainwatch-server --closed-loop auto --config auto.yaml &
    PYTHONPATH=build/python /usr/bin/python3 client/examples/train_tiny_lm.py \\
        --run tiny/diverge --steps 400 --fault diverge --control auto
    build/bin/trainwatchctl directives --run tiny/diverge
"""

import argparse
import copy
import math
import sys
import time

import torch
from torch import nn
from torch.nn import functional as F

import trainwatch
from trainwatch.torch import StepHook, log_z

VOCAB = 256


# -- data --------------------------------------------------------------------


def markov_corpus(n_tokens, seed=0):
    """A deterministic Markov chain over VOCAB tokens: each token has 4
    likely successors, so a model can get well below log(256) nats."""
    g = torch.Generator().manual_seed(seed)
    succ = torch.randint(0, VOCAB, (VOCAB, 4), generator=g)
    probs = torch.tensor([0.55, 0.25, 0.12, 0.08])
    choice = torch.multinomial(probs, n_tokens, replacement=True, generator=g)
    out = torch.empty(n_tokens, dtype=torch.long)
    tok = 0
    for i in range(n_tokens):  # ~0.3 s for 200k tokens
        tok = int(succ[tok, choice[i]])
        out[i] = tok
    return out


class Batches:
    """Sample i is corpus[i*seq : i*seq + seq + 1]; step s uses samples
    s*batch .. s*batch+batch-1 (mod the sample count): its batch ids."""

    def __init__(self, corpus, batch, seq):
        self.corpus, self.batch, self.seq = corpus, batch, seq
        self.samples = (len(corpus) - 1) // seq

    def ids(self, index):
        """Sample ids of batch `index`."""
        return [(index * self.batch + j) % self.samples for j in range(self.batch)]

    def get(self, step):
        return self.load(self.ids(step))

    def load(self, ids):
        x = torch.stack([self.corpus[i * self.seq: i * self.seq + self.seq + 1] for i in ids])
        return x[:, :-1], x[:, 1:], ids


def batch_sampler(data, first):
    """(index, sample ids) of batches first, first+1, ...: SkipBatches reads
    the ids from the last element and drops the batches it is told to."""
    index = first
    while True:
        yield index, data.ids(index)
        index += 1


# -- model -------------------------------------------------------------------


class Attention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.max_logit = None  # detached, set each forward

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        # The scores are here anyway: their max costs one reduction. Code
        # that does not materialise them can use
        # trainwatch.torch.max_attention_logit(q, k, mask=mask).
        self.max_logit = att.detach().masked_fill(mask, float("-inf")).amax().float()
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, d=64, heads=4, layers=2, seq=64):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Parameter(torch.zeros(seq, d))
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB)
        # --drift-logits grows this: the logits' scale drifts, and log Z with it.
        self.register_buffer("logit_mult", torch.ones(()))

    def forward(self, x):
        h = self.tok(x) + self.pos[: x.shape[1]]
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln(h)) * self.logit_mult

    def max_attn_logit(self):
        return torch.stack([b.attn.max_logit for b in self.blocks]).amax()


# -- fp16 loss scaling, emulated -----------------------------------------------


class DynamicLossScaler:
    """torch.cuda.amp.GradScaler's policy (init 2^16, x2 after
    growth_interval clean steps, x0.5 and skip on inf/NaN), on CPU. fp16
    overflow is emulated: a scaled gradient beyond fp16's max (65504) is inf."""

    FP16_MAX = 65504.0

    def __init__(self, init_scale=2.0 ** 16, growth_interval=2000):
        self.scale = init_scale
        self.growth_interval = growth_interval
        self.clean = 0
        self.found_inf = False

    def get_scale(self):
        return self.scale

    def unscale_(self, params):
        """Divides the (scaled) gradients by the scale; sets found_inf."""
        found = False
        for p in params:
            if p.grad is None:
                continue
            if not torch.isfinite(p.grad).all() or p.grad.abs().max() > self.FP16_MAX:
                found = True
            p.grad.div_(self.scale)
        self.found_inf = found

    def update(self):
        if self.found_inf:
            self.scale *= 0.5
            self.clean = 0
        else:
            self.clean += 1
            if self.clean >= self.growth_interval:
                self.scale *= 2.0
                self.clean = 0


def optimizer_step(opt, scaler, lr_mult=1.0):
    """The update: opt.step() unless the fp16 scaler found an overflow, then
    the scaler's update; `lr_mult` scales the LR for this step only (the
    diverge fault's batches)."""
    for group in opt.param_groups:
        group["lr"] *= lr_mult
    if scaler is None or not scaler.found_inf:
        opt.step()
    for group in opt.param_groups:
        group["lr"] /= lr_mult
    if scaler:
        scaler.update()


def forward_backward(args, model, x, y, scaler, params, objective_scale=1.0):
    """One batch's loss and gradients, clipped: (loss, log Z, pre-clip norm)."""
    if args.drift_logits:
        model.logit_mult.mul_(args.drift_rate)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x)
    logits = logits.float()
    loss = F.cross_entropy(logits.view(-1, VOCAB), y.reshape(-1))
    z = log_z(logits)
    objective = loss
    if not args.no_zloss:
        objective = objective + 1e-4 * torch.logsumexp(logits, -1).pow(2).mean()
    objective = objective * objective_scale
    if scaler:
        (objective * scaler.get_scale()).backward()
        scaler.unscale_(params)
    else:
        objective.backward()
    norm = torch.nn.utils.clip_grad_norm_(params, args.max_norm)
    return loss, z, norm


def snapshot(step, next_batch, model, opt, sched, scaler, **extra):
    """A checkpoint in memory (a real run writes files)."""
    return dict(step=step, next_batch=next_batch, model=copy.deepcopy(model.state_dict()),
                opt=copy.deepcopy(opt.state_dict()), sched=sched.state_dict(),
                scaler=copy.deepcopy(scaler.__dict__) if scaler else None, **extra)


def restore(ckpt, model, opt, sched, scaler):
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    sched.load_state_dict(ckpt["sched"])
    if scaler is not None:
        scaler.__dict__.update(copy.deepcopy(ckpt["scaler"]))


def run_attempt(args, data, model, opt, sched, scaler, corrupt_ids, checkpoints,
                state, stop_at, betas, eps):
    """Trains one attempt from state["first_step"] (on batches from
    state["first_batch"], without those holding state["skip"] ids) to the
    last step, or to stop_at. Returns the last step trained; sets
    state["next_batch"]."""
    tw = trainwatch.Client(args.server, run=args.run, attempt=state["attempt"],
                           precision="fp16" if scaler else "bf16",
                           max_norm=args.max_norm, warmup_steps=args.warmup_steps,
                           adam_eps=eps, adam_beta2=betas[1],
                           labels={"model": "tiny-lm", "example": "train_tiny_lm"})
    hook = StepHook(tw, max_norm=args.max_norm, optimizer=opt, scaler=scaler,
                    model=model, layer_stats_every=args.layer_stats_every)
    params = [p for p in model.parameters()]
    batches = trainwatch.SkipBatches(batch_sampler(data, state["first_batch"]), state["skip"])
    if state["skip"]:
        print(f"attempt {state['attempt']}: resuming at step {state['first_step']}, "
              f"skipping batches {','.join(map(str, state['skip']))}", flush=True)
    consumed = state["first_batch"]  # batch index of the next batch drawn
    step = state["first_step"] - 1
    with tw:
        it = hook.timed(iter(batches))
        for step in range(state["first_step"], args.steps):
            index, ids = next(it)
            consumed = index + 1
            x, y, ids = data.load(ids)
            corrupt = corrupt_ids is not None and ids == corrupt_ids
            if corrupt:
                x = torch.randint(0, VOCAB, x.shape)
                y = torch.randint(0, VOCAB, y.shape)
                print(f"CORRUPTED step={step} batch_ids={','.join(map(str, ids))}", flush=True)
            loss, z, norm = forward_backward(args, model, x, y, scaler, params,
                                             args.corrupt_scale if corrupt else 1.0)
            hook.pre_step(step)
            optimizer_step(opt, scaler)
            hook.post_step(step, norm, loss=loss, lr=sched.get_last_lr()[0], log_z=z,
                           max_attn_logit=model.max_attn_logit(), batch_ids=ids)
            sched.step()
            opt.zero_grad(set_to_none=True)
            if args.checkpoint_every and step > 0 and step % args.checkpoint_every == 0:
                name = f"ckpt-{step}"
                checkpoints[name] = snapshot(step, consumed, model, opt, sched, scaler)
                tw.event("checkpoint_saved", step, name)
            if step % 50 == 0 or step == args.steps - 1:
                print(f"step {step:5d} loss {loss.item():.3f} norm {float(norm):.3g} "
                      f"logZ {float(z):.2f}", flush=True)
            if stop_at is not None and step >= stop_at:
                print(f"attempt {state['attempt']}: stopping at step {step} for the restart plan",
                      flush=True)
                tw.flush(timeout=30.0)
                state["next_batch"] = consumed
                return step
        tw.event("run_finished", args.steps - 1)
        tw.flush(timeout=30.0)
    s = tw.stats
    print(f"attempt {state['attempt']}: steps {state['first_step']}..{args.steps - 1}; "
          f"trainwatch recorded {s.recorded}, acked {s.acked}, dropped {s.dropped}",
          flush=True)
    state["next_batch"] = consumed
    return step


def fault_ids(args, data):
    """The sample ids --fault poisons: those of batches --fault-at ..
    --fault-at + --fault-steps - 1. Keyed to ids, not steps: a replay that
    skips them trains on clean batches."""
    if args.fault == "none":
        return frozenset()
    return frozenset(i for b in range(args.fault_at, args.fault_at + args.fault_steps)
                     for i in data.ids(b))


def run_controlled(args, data, model, opt, sched, scaler, lr_scale, betas, eps):
    """Trains 0..steps-1 as one loop under trainwatch.Control: a rollback
    directive reloads a checkpoint in process and the loop goes on from its
    step and data position as a new attempt. Returns the final loss (the
    mean of the last 20 steps' losses)."""
    poison = fault_ids(args, data)
    tw = trainwatch.Client(args.server, run=args.run, precision="fp16" if scaler else "bf16",
                           max_norm=args.max_norm, warmup_steps=args.warmup_steps,
                           adam_eps=eps, adam_beta2=betas[1],
                           labels={"model": "tiny-lm", "example": "train_tiny_lm"})
    checkpoints = {}
    position = {"next_batch": 0}  # the data position: the next batch index drawn

    def load(step, name):
        ckpt = checkpoints[name]
        assert ckpt["step"] == step, (name, step)
        restore(ckpt, model, opt, sched, scaler)
        lr_scale[0] = ckpt["lr_scale"]
        position["next_batch"] = ckpt["next_batch"]

    def set_lr_scale(factor):
        lr_scale[0] *= factor

    def save(tag):
        checkpoints[tag] = snapshot(step, position["next_batch"], model, opt, sched, scaler,
                                    lr_scale=lr_scale[0],
                                    control=control and control.state_dict())

    stopped = []
    control = None
    if args.control != "off":
        control = trainwatch.Control(tw, save=save, load=load, set_lr_scale=set_lr_scale,
                                     stop=lambda: stopped.append(True))
    params = list(model.parameters())

    def start(first_batch):
        position["next_batch"] = first_batch
        source = batch_sampler(data, first_batch)
        if control is not None:
            source = control.filter(source)
        hook = StepHook(tw, max_norm=args.max_norm, optimizer=opt, scaler=scaler,
                        model=model, layer_stats_every=args.layer_stats_every)
        return hook, hook.timed(iter(source))

    hook, it = start(0)
    losses = {}
    step = 0
    while step < args.steps:
        index, ids = next(it)
        position["next_batch"] = index + 1
        x, y, ids = data.load(ids)
        poisoned = bool(poison) and any(i in poison for i in ids)
        if poisoned:
            g = torch.Generator().manual_seed(index)
            x = torch.randint(0, VOCAB, x.shape, generator=g)
            y = torch.randint(0, VOCAB, y.shape, generator=g)
            print(f"FAULT {args.fault} step={step} batch={index}", flush=True)
        loss, z, norm = forward_backward(args, model, x, y, scaler, params)
        if control is not None:
            b = control.boundary(step)
            for d in b.applied:
                print(f"DIRECTIVE {d['id']} {d['action']} applied at step {step} "
                      f"(apply_at_step {d['apply_at_step']}, alert {d['alert']})", flush=True)
            if b.rollback:
                opt.zero_grad(set_to_none=True)
                tw = control.tw  # attempt + 1
                r = b.rollback["rollback"]
                print(f"ROLLBACK to {r['checkpoint']} (step {r['to_step']}), skipping "
                      f"{len(r['skip_batch_ids'])} batch ids, LR x {r['lr_scale']}; "
                      f"attempt {tw.attempt} resumes at step {b.resume_step}", flush=True)
                step = b.resume_step
                hook, it = start(position["next_batch"])
                continue
            if b.stop:
                print(f"STOP at step {step}", flush=True)
                break
        hook.pre_step(step)
        optimizer_step(opt, scaler, args.fault_lr_mult
                       if poisoned and args.fault == "diverge" else 1.0)
        hook.post_step(step, norm, loss=loss, lr=sched.get_last_lr()[0], log_z=z,
                       max_attn_logit=model.max_attn_logit(), batch_ids=ids)
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses[step] = loss.item()
        if args.checkpoint_every and step > 0 and step % args.checkpoint_every == 0:
            save(f"ckpt-{step}")
            tw.event("checkpoint_saved", step, f"ckpt-{step}")
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step:5d} loss {losses[step]:.3f} norm {float(norm):.3g} "
                  f"logZ {float(z):.2f}", flush=True)
        step += 1
    last = sorted(losses)[-20:]
    final = sum(losses[s] for s in last) / max(1, len(last))
    tw.event("run_finished", max(losses) if losses else 0)
    tw.flush(timeout=30.0)
    tw.close()
    if control is not None:
        print(f"control: applied {len(control.log)} directives "
              f"{[(i, at) for i, at, _ in control.log]}, skipped {control.skipped} batches",
              flush=True)
    print(f"final loss {final:.4f} (mean of the last {len(last)} steps)", flush=True)
    return final


# -- training ------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", default="127.0.0.1:50051")
    ap.add_argument("--run", default="tiny-lm")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup-steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--max-norm", type=float, default=1.0)
    ap.add_argument("--corrupt-batch-at", type=int, default=None, metavar="N")
    ap.add_argument("--corrupt-scale", type=float, default=1000.0)
    ap.add_argument("--drift-logits", action="store_true")
    ap.add_argument("--drift-rate", type=float, default=1.01)
    ap.add_argument("--no-zloss", action="store_true")
    ap.add_argument("--fp16-scaler", action="store_true")
    ap.add_argument("--checkpoint-every", type=int, default=50, metavar="K")
    ap.add_argument("--fault", choices=("spike", "diverge", "none"), default="none")
    ap.add_argument("--fault-at", type=int, default=250, metavar="BATCH")
    ap.add_argument("--fault-steps", type=int, default=5, metavar="N")
    ap.add_argument("--fault-lr-mult", type=float, default=100.0)
    ap.add_argument("--control", choices=("auto", "propose", "off"), default="off")
    ap.add_argument("--layer-stats-every", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--auto-restart", action="store_true")
    ap.add_argument("--restart-check-after", type=int, default=10, metavar="N",
                    help="with --auto-restart: steps after the corrupted one before "
                         "attempt 0 stops to ask for the plan")
    args = ap.parse_args(argv)

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    tokens = max(50_000, (args.batch * args.seq + 1) * 64)
    if args.fault != "none" or args.control != "off":
        # No epoch wraps around within a run and its replays: a fault keyed
        # to batch ids strikes once, where it was put.
        tokens = max(tokens, 2 * args.steps * args.batch * args.seq + 1)
    corpus = markov_corpus(tokens, seed=args.seed)
    data = Batches(corpus, args.batch, args.seq)
    model = TinyLM(seq=args.seq)
    betas, eps = (0.9, 0.95), 1e-8
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=betas, eps=eps,
                            weight_decay=0.1)
    lr_scale = [1.0]  # a directive's LR scale, on top of the schedule
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, args.warmup_steps)) * lr_scale[0])
    scaler = DynamicLossScaler() if args.fp16_scaler else None
    if args.fault != "none" or args.control != "off":
        started = time.monotonic()
        run_controlled(args, data, model, opt, sched, scaler, lr_scale, betas, eps)
        print(f"done: {args.steps} steps in {time.monotonic() - started:.1f} s", flush=True)
        return 0

    corrupt_ids = data.ids(args.corrupt_batch_at) if args.corrupt_batch_at is not None else None
    checkpoints = {}  # name -> state after that step (a real run writes files)
    # Attempt 0 trains from step 0 on batches 0, 1, ...; with --auto-restart
    # it stops a few steps after the spike to ask for the restart plan.
    stop_at = None
    if args.auto_restart and args.corrupt_batch_at is not None:
        stop_at = args.corrupt_batch_at + args.restart_check_after
    started = time.monotonic()
    state = dict(attempt=0, first_step=0, first_batch=0, skip=())
    while True:
        last = run_attempt(args, data, model, opt, sched, scaler, corrupt_ids,
                           checkpoints, state, stop_at, betas, eps)
        if last == args.steps - 1:
            break
        # The attempt stopped after the spike: the restart loop.
        plan = trainwatch.restart_plan(args.server, args.run)
        if plan is None or plan["restart_from_step"] is None:
            print(f"no restart plan ({plan!r}); continuing without a restart", flush=True)
            state = dict(attempt=state["attempt"], first_step=last + 1,
                         first_batch=state["next_batch"], skip=())
            stop_at = None
            continue
        print(f"PLAN spike_step={plan['spike_step']} checkpoint={plan['checkpoint']} "
              f"restart_from_step={plan['restart_from_step']} "
              f"skip={','.join(map(str, plan['skip_batch_ids']))}", flush=True)
        print(f"  why: {plan['why']}", flush=True)
        ckpt = checkpoints[plan["checkpoint"]]
        restore(ckpt, model, opt, sched, scaler)
        state = dict(attempt=state["attempt"] + 1, first_step=ckpt["step"] + 1,
                     first_batch=ckpt["next_batch"], skip=plan["skip_batch_ids"])
        stop_at = None
    if args.auto_restart and args.corrupt_batch_at is not None:
        # The server judges the replay once it is past the spike's step.
        deadline = time.monotonic() + 10
        while True:
            plan = trainwatch.restart_plan(args.server, args.run)
            if (plan and plan["outcome"]) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        print(f"OUTCOME {plan['outcome'] if plan else None} "
              f"batches_skipped={plan['batches_skipped'] if plan else None}", flush=True)
    print(f"done: {args.steps} steps in {time.monotonic() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
