#!/usr/bin/python3
"""The instability lab: a small decoder-only transformer LM that really spikes,
diverges, grows its attention logits, drifts its log Z, or stalls, on CPU.

A 2-layer pre-LN causal transformer (d 64, 4 heads, vocab 256, context 64),
attention written by hand so that its logits are visible, trained in fp32 with
AdamW on a structured synthetic language (see Language) that has rare tokens
and, now and then, a hard batch. Everything is deterministic by --seed
(torch.manual_seed, one thread). Each step is streamed through the Python
client (trainwatch.Client + trainwatch.torch.StepHook, layer stats every
step: grad_norm, grad_rms, g_over_sqrt_v_rms, update_rms_ratio) when
--server is given, and written to --out as a JSONL step log (docs/contracts.md:
a run_start line, one step line per step, a run_finished event) with
update_rms_ratio in each layer stat, which `trainwatchctl replay/import` and
tests/lab/labeller.py read. --meta writes the run's configuration and the
steps of its hard and corrupted batches (the labeller does not read them).

Configurations (--config; CONFIGS below): healthy, spike (lr 1e-2, no
warmup, beta2 0.999, no qk-layernorm, clipping off), spike-hot (lr 2e-2),
spike-b2-099 (beta2 0.99), diverge (lr 0.3 after a 300-step warmup),
logit-growth (lr 5e-2), logz-drift (lr 0.3, no z-loss), stall (eps 1e-2),
corrupt.

    PYTHONPATH=build/python /usr/bin/python3 tests/lab/lab_lm.py \\
        --config spike --seed 1 --out /tmp/spike-1.jsonl [--server 127.0.0.1:50051]
"""

import argparse
import json
import math
import os
import sys
import time

# OpenBLAS's own threads spin against the other processes on a shared
# machine (10x slower matmuls here); torch.set_num_threads does not reach them.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import torch  # noqa: E402
from torch import nn
from torch.nn import functional as F

VOCAB = 256
COMMON = 192  # tokens 0..191 carry the language; 192..255 are rare


# -- configurations ------------------------------------------------------------

BASE = dict(steps=1200, lr=3e-3, warmup=100, beta1=0.9, beta2=0.95, eps=1e-8,
            weight_decay=0.1, max_norm=1.0, qk_norm=True, z_loss=1e-4,
            hard_every=100, corrupt_at=None, corrupt_scale=1.0, decay=True, jumps=2, rare=2,
            hard_rare=48)

CONFIGS = {
    # Warmup, qk-layernorm, z-loss, clipping at 1, beta2 0.95: nothing happens.
    "healthy": dict(),
    # The Wortsman et al. recipe for loss spikes that recover: a high LR with
    # a short warmup, a slow second moment (beta2 0.999), no qk-layernorm,
    # no clipping; hard batches set them off.
    "spike": dict(lr=1e-2, warmup=0, beta2=0.999, qk_norm=False, max_norm=0.0, decay=False),
    # Twice the LR and a 10-step warmup: larger spikes, some of them long.
    "spike-hot": dict(lr=2e-2, warmup=10, beta2=0.999, qk_norm=False, max_norm=0.0, decay=False),
    "spike-b2-099": dict(lr=1e-2, warmup=0, beta2=0.99, qk_norm=False, max_norm=0.0, decay=False),
    # Far too high a peak learning rate, reached by a long warmup: the
    # loss first falls, then leaves and does not come back.
    "diverge": dict(lr=0.3, warmup=300, beta2=0.999, qk_norm=False, max_norm=0.0, decay=False),
    # A high LR without qk-layernorm: the attention logits grow with the
    # q/k weights (clipping keeps the loss itself in hand).
    "logit-growth": dict(lr=5e-2, warmup=100, qk_norm=False, weight_decay=0.0, decay=False),
    # Without z-loss (and weight decay) at a very high LR (qk-layernorm and
    # clipping keep the rest trainable), the output logits drift: log Z
    # walks away from its level (Wortsman et al. 2023's output divergence).
    "logz-drift": dict(z_loss=0.0, weight_decay=0.0, lr=0.3, decay=False),
    # eps 1e-2 is larger than sqrt(v) of every layer: the updates vanish.
    "stall": dict(eps=1e-2),
    # One batch of random tokens with a 1000x loss at step 700; clipped.
    "corrupt": dict(corrupt_at=700, corrupt_scale=1000.0),
}


def config(name, **overrides):
    cfg = dict(BASE)
    cfg.update(CONFIGS[name])
    cfg.update({k: v for k, v in overrides.items() if v is not None})
    cfg["name"] = name
    return cfg


# -- the language --------------------------------------------------------------


class Language:
    """A near-deterministic Markov language with rare tokens and a dialect.

    Common tokens (0..191) follow a fixed successor permutation. In each
    batch exactly `jumps` positions (seeded, uniform) restart the chain at
    a uniform common token and exactly `rare` positions emit a uniform rare
    token (192..255), followed by that token's fixed common successor: the
    loss has a floor of about (jumps x log 192 + rare x log(64 x 512 /
    rare)) / tokens, nearly the same on every batch (fixed counts, so the
    loss is not Poisson noise), and each rare token's embedding row sees a
    gradient only every ~16 steps (its second moment decays between). A
    hard batch (one step in `hard_every` on average, at seeded random steps
    after warmup) is written in a dialect, a second successor permutation,
    with `hard_rare` rare tokens: its loss is tens of times the usual one
    and it hits every layer with gradients far above its second moment.
    """

    def __init__(self, seed, seq, batch, jumps=8, rare=4, hard_rare=48):
        g = torch.Generator().manual_seed(10_000 + seed)
        self.g = g
        self.seq, self.batch = seq, batch
        self.jumps, self.rare, self.hard_rare = jumps, rare, hard_rare
        self.succ = torch.randperm(COMMON, generator=g)
        self.dialect = torch.randperm(COMMON, generator=g)
        self.rare_succ = torch.randint(0, COMMON, (VOCAB,), generator=g)

    def sample(self, n, hard=False):
        """n sequences of seq + 1 tokens."""
        g = self.g
        succ = self.dialect if hard else self.succ
        length = self.seq + 1
        rare = self.hard_rare if hard else self.rare
        # Positions 1..seq of the flattened batch: `jumps` restarts, then `rare`.
        pos = torch.randperm(n * self.seq, generator=g)[: self.jumps + rare]
        forced = torch.full((n, length), -1, dtype=torch.long)
        rows, cols = pos // self.seq, pos % self.seq + 1
        forced[rows[: self.jumps], cols[: self.jumps]] = torch.randint(
            0, COMMON, (self.jumps,), generator=g)
        forced[rows[self.jumps:], cols[self.jumps:]] = torch.randint(
            COMMON, VOCAB, (rare,), generator=g)
        out = torch.empty(n, length, dtype=torch.long)
        tok = torch.randint(0, COMMON, (n,), generator=g)
        out[:, 0] = tok
        for i in range(1, length):  # vectorised over the batch
            nxt = torch.where(tok < COMMON, succ[tok.clamp(max=COMMON - 1)], self.rare_succ[tok])
            tok = torch.where(forced[:, i] >= 0, forced[:, i], nxt)
            out[:, i] = tok
        return out


# -- the model -----------------------------------------------------------------


class Attention(nn.Module):
    def __init__(self, d, heads, qk_norm):
        super().__init__()
        self.heads, self.hd = heads, d // heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.q_norm = nn.LayerNorm(self.hd) if qk_norm else None
        self.k_norm = nn.LayerNorm(self.hd) if qk_norm else None
        self.max_logit = None

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, self.hd).permute(2, 0, 3, 1, 4)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.hd)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        att = att.masked_fill(mask, float("-inf"))
        self.max_logit = att.detach().amax()
        return self.proj((att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d, heads, qk_norm):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(d, heads, qk_norm)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class LabLM(nn.Module):
    def __init__(self, seq, d=64, heads=4, layers=2, qk_norm=True):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, qk_norm) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB)

    def forward(self, x):
        h = self.tok(x) + self.pos.weight[: x.shape[1]]
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln(h))

    def max_attn_logit(self):
        return torch.stack([b.attn.max_logit for b in self.blocks]).amax()


def _layer_stats_class():
    """trainwatch.torch.LayerStats; without a built binding (offline runs),
    loaded from the source tree, which needs only torch."""
    try:
        from trainwatch.torch import LayerStats
    except ImportError:
        import importlib.util
        import pathlib
        path = pathlib.Path(__file__).resolve().parents[2] / "client/python/trainwatch/torch.py"
        spec = importlib.util.spec_from_file_location("_tw_torch_src", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        LayerStats = mod.LayerStats
    return LayerStats


# -- records -------------------------------------------------------------------


def _num(x):
    """A float for JSON: non-finite values as proto3 JSON strings."""
    x = float(x)
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return x


def run_start_line(run, cfg):
    return {"run_start": {"run_id": run, "rank": 0, "world_size": 1, "precision": "FP32",
                          "max_norm": cfg["max_norm"], "warmup_steps": cfg["warmup"],
                          "adam_eps": cfg["eps"], "adam_beta2": cfg["beta2"],
                          "labels": {"model": "lab-lm", "config": cfg["name"].replace("-", "_")}}}


def lr_at(cfg, step):
    """Linear warmup, then constant, or (decay) cosine to 10% at the end."""
    if step < cfg["warmup"]:  # never with warmup 0
        return cfg["lr"] * (step + 1) / cfg["warmup"]
    if not cfg["decay"]:
        return cfg["lr"]
    frac = (step - cfg["warmup"]) / max(1, cfg["steps"] - cfg["warmup"])
    return cfg["lr"] * (0.1 + 0.45 * (1 + math.cos(math.pi * frac)))


def train(cfg, seed, run, out, server=None, meta=None, batch=16, seq=32, log_every=250):
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    lang = Language(seed, seq, batch, cfg["jumps"], cfg["rare"], cfg["hard_rare"])
    model = LabLM(seq, qk_norm=cfg["qk_norm"])
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"])
    # The hard batches' steps: seeded, about one in hard_every.
    g = torch.Generator().manual_seed(20_000 + seed)
    hard_steps = set((torch.rand(cfg["steps"], generator=g) < 1.0 / cfg["hard_every"])
                     .nonzero().flatten().tolist()) if cfg["hard_every"] else set()
    hard_steps = {s for s in hard_steps if s >= cfg["warmup"]}
    max_norm = cfg["max_norm"]
    clip_at = max_norm if max_norm > 0 else float("inf")

    tw = hook = None
    if server:
        import trainwatch
        from trainwatch.torch import StepHook
        tw = trainwatch.Client(server, run=run, precision="fp32", max_norm=max_norm,
                               warmup_steps=cfg["warmup"], adam_eps=cfg["eps"],
                               adam_beta2=cfg["beta2"],
                               labels={"model": "lab-lm", "config": cfg["name"].replace("-", "_")})
        hook = StepHook(tw, max_norm=max_norm, optimizer=opt, model=model, layer_stats_every=1)
    else:
        stats = _layer_stats_class()(model, opt, every=1)

    f = open(out, "w") if out else None
    if f:
        f.write(json.dumps(run_start_line(run, cfg)) + "\n")
    started = time.monotonic()
    last = 0
    nan_since = None
    for step in range(cfg["steps"]):
        last = step
        for group in opt.param_groups:
            group["lr"] = lr_at(cfg, step)
        hard = step in hard_steps
        corrupt = cfg["corrupt_at"] is not None and step == cfg["corrupt_at"]
        if corrupt:
            x = torch.randint(0, VOCAB, (batch, seq + 1), generator=g)
        else:
            x = lang.sample(batch, hard=hard)
        inp, tgt = x[:, :-1], x[:, 1:]
        logits = model(inp)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tgt.reshape(-1))
        lz = torch.logsumexp(logits.detach(), -1).mean()
        objective = loss
        if cfg["z_loss"]:
            objective = objective + cfg["z_loss"] * torch.logsumexp(logits, -1).pow(2).mean()
        if corrupt:
            objective = objective * cfg["corrupt_scale"]
        opt.zero_grad(set_to_none=True)
        objective.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip_at)
        ids = [step * batch + j for j in range(batch)]
        if hook:
            hook.pre_step(step)
            opt.step()
            hook.post_step(step, norm, loss=loss, log_z=lz, max_attn_logit=model.max_attn_logit(),
                           batch_ids=ids)
            layers = hook.last_layer_stats
        else:
            pre = stats.collect(step)
            opt.step()
            ratios = stats.update_ratios()
            layers = {k: torch.cat([v, ratios[k].reshape(1)]) for k, v in pre.items()}
        if f:
            n = float(norm)
            rec = {"step": step, "grad_norm": _num(n), "loss": _num(loss), "lr": lr_at(cfg, step),
                   "max_attn_logit": _num(model.max_attn_logit()), "log_z": _num(lz),
                   "batch_ids": ids,
                   "layer_stats": {k: {"grad_norm": _num(v[0]), "grad_rms": _num(v[1]),
                                       "g_over_sqrt_v_rms": _num(v[2]),
                                       "update_rms_ratio": _num(v[3])}
                                   for k, v in layers.items()}}
            if max_norm > 0:
                coef = min(1.0, max_norm / (n + 1e-6)) if math.isfinite(n) else 1.0
                rec["clipped"] = coef < 1.0
                rec["clip_coef"] = coef
            f.write(json.dumps(rec) + "\n")
        if log_every and step % log_every == 0:
            print(f"{run} step {step:5d} loss {float(loss):.3f} norm {float(norm):.3g} "
                  f"logit {float(model.max_attn_logit()):.1f} logZ {float(lz):.2f}",
                  flush=True)
        if not math.isfinite(float(loss)):
            # A diverged run stops 20 steps after its loss is lost, as a
            # real job would be stopped; the records say why.
            nan_since = step if nan_since is None else nan_since
            if step - nan_since >= 20:
                break
    if f:
        f.write(json.dumps({"event": {"step": last, "kind": "RUN_FINISHED"}}) + "\n")
        f.close()
    if tw:
        tw.event("run_finished", last)
        tw.flush(timeout=60.0)
        s = tw.stats
        tw.close()
        print(f"{run}: trainwatch recorded {s.recorded}, acked {s.acked}, dropped {s.dropped}",
              flush=True)
    if meta:
        with open(meta, "w") as m:
            json.dump({"run": run, "seed": seed, "config": cfg, "last_step": last,
                       "hard_steps": sorted(hard_steps),
                       "corrupt_step": cfg["corrupt_at"],
                       "seconds": time.monotonic() - started}, m, indent=1)
    print(f"{run}: {last + 1} steps in {time.monotonic() - started:.1f} s", flush=True)
    return last


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, choices=sorted(CONFIGS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--run", default=None, help="run id (default lab/CONFIG/sSEED)")
    ap.add_argument("--server", default=None, help="host:port of trainwatch-server")
    ap.add_argument("--out", default=None, help="JSONL step log to write")
    ap.add_argument("--meta", default=None, help="JSON with the config and injected batches")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--beta2", type=float, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--jumps", type=int, default=None)
    ap.add_argument("--rare", type=int, default=None)
    ap.add_argument("--hard-rare", type=int, default=None)
    ap.add_argument("--hard-every", type=int, default=None)
    args = ap.parse_args(argv)
    cfg = config(args.config, steps=args.steps, lr=args.lr, beta2=args.beta2, warmup=args.warmup,
                 jumps=args.jumps, rare=args.rare, hard_rare=args.hard_rare,
                 hard_every=args.hard_every)
    run = args.run or f"lab/{args.config}/s{args.seed}"
    train(cfg, args.seed, run, args.out, server=args.server, meta=args.meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
