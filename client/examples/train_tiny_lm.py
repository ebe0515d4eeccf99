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
  --lr 0.5               too high a learning rate: clipping on most steps
                         (ClipFractionHigh) and attention logits past the cap
                         (AttentionLogitGrowth); --lr 0.05 is not enough for
                         this model

    build/bin/trainwatch-server &
    PYTHONPATH=build/python /usr/bin/python3 client/examples/train_tiny_lm.py \\
        --server 127.0.0.1:50051 --run tiny/demo --steps 500 --corrupt-batch-at 300
    build/bin/trainwatchctl spikes --run tiny/demo
"""

import argparse
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

    def get(self, step):
        ids = [(step * self.batch + j) % self.samples for j in range(self.batch)]
        x = torch.stack([self.corpus[i * self.seq: i * self.seq + self.seq + 1] for i in ids])
        return x[:, :-1], x[:, 1:], ids


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
    ap.add_argument("--checkpoint-every", type=int, default=100, metavar="K")
    ap.add_argument("--layer-stats-every", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    corpus = markov_corpus(max(50_000, (args.batch * args.seq + 1) * 64), seed=args.seed)
    data = Batches(corpus, args.batch, args.seq)
    model = TinyLM(seq=args.seq)
    betas, eps = (0.9, 0.95), 1e-8
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=betas, eps=eps,
                            weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, args.warmup_steps)))
    scaler = DynamicLossScaler() if args.fp16_scaler else None

    tw = trainwatch.Client(args.server, run=args.run,
                           precision="fp16" if scaler else "bf16",
                           max_norm=args.max_norm, warmup_steps=args.warmup_steps,
                           adam_eps=eps, adam_beta2=betas[1],
                           labels={"model": "tiny-lm", "example": "train_tiny_lm"})
    hook = StepHook(tw, max_norm=args.max_norm, optimizer=opt, scaler=scaler,
                    model=model, layer_stats_every=args.layer_stats_every)
    params = [p for p in model.parameters()]
    started = time.monotonic()
    with tw:
        for step in range(args.steps):
            x, y, ids = data.get(step)
            corrupt = step == args.corrupt_batch_at
            if corrupt:
                x = torch.randint(0, VOCAB, x.shape)
                y = torch.randint(0, VOCAB, y.shape)
                print(f"CORRUPTED step={step} batch_ids={','.join(map(str, ids))}", flush=True)
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
            if corrupt:
                objective = objective * args.corrupt_scale
            if scaler:
                (objective * scaler.get_scale()).backward()
                scaler.unscale_(params)
            else:
                objective.backward()
            norm = torch.nn.utils.clip_grad_norm_(params, args.max_norm)
            hook.pre_step(step)
            if scaler is None or not scaler.found_inf:
                opt.step()
            if scaler:
                scaler.update()
            hook.post_step(step, norm, loss=loss, lr=sched.get_last_lr()[0], log_z=z,
                           max_attn_logit=model.max_attn_logit(), batch_ids=ids)
            sched.step()
            opt.zero_grad(set_to_none=True)
            if args.checkpoint_every and step > 0 and step % args.checkpoint_every == 0:
                tw.event("checkpoint_saved", step, f"ckpt-{step}")
            if step % 50 == 0 or step == args.steps - 1:
                print(f"step {step:5d} loss {loss.item():.3f} norm {float(norm):.3g} "
                      f"logZ {float(z):.2f}", flush=True)
        tw.event("run_finished", args.steps - 1)
        tw.flush(timeout=30.0)
    s = tw.stats
    print(f"done: {args.steps} steps in {time.monotonic() - started:.1f} s; "
          f"trainwatch recorded {s.recorded}, acked {s.acked}, dropped {s.dropped}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
