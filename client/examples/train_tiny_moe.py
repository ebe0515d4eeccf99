#!/usr/bin/python3
"""Train a tiny mixture-of-experts language model on CPU and stream its
routing health to trainwatch (docs/detectors.md, the Moe* alerts).

A transformer whose feed-forward blocks are MoE layers (by default 2 layers,
8 experts, top-2, a linear router) learns a synthetic language (each token
follows from the previous one by one of a few rules). Every step each MoE
layer's routed assignments (trainwatch.torch.route_counts: torch.bincount of
the router's top-k indices), the assignments dropped over capacity, the
load-balancing loss without its coefficient (Switch's E x sum f_i P_i: 1.0
at balance), the router z-loss and the largest router logit go to trainwatch
in the step's moe field, with the loss and gradient norm; with --log-jsonl
they are also (or, without --server, only) written as a JSONL step log for
`trainwatchctl replay` (docs/contracts.md).

Faults to inject (--fault), each named by one alert:
  none       a healthy run (aux loss 1e-2, z-loss 1e-3, dropless; with
             --balancing bias, DeepSeek-V3's aux-loss-free bias): silent
  collapse   no aux loss and a router initialised (or, with --fault-at,
             pushed there) to prefer two experts: every token goes to the
             same two (MoeRouterCollapse)
  dead       expert 5's router row starts (or, with --fault-at, is pushed)
             far below the others and no aux loss pulls it back: it never
             gets a token (MoeDeadExpert)
  drop       capacity factor 1.0 under the router's natural skew: tokens over
             an expert's capacity are dropped (MoeTokensDropped)
  zgrowth    no z-loss, no aux loss and, from --fault-at (250), a router LR
             30x the rest: the router's logits grow (MoeRouterZLossGrowth)
  biasdrift  aux-loss-free balancing whose bias update (from the start or
             from --fault-at) raises under-loaded experts, never lowers
             over-loaded ones and is not re-centred: the bias's mean drifts
             away from 0. That is a half-rate sign update plus a shift of
             every bias, which changes no choice of experts: named
             (MoeExpertBiasDrift) only once the load goes uneven too
  biasblind  aux-loss-free balancing with DeepSeek-V3's sign update, not
             re-centred (Megatron-Core's), whose counts (from the start or
             from --fault-at) miss the last two experts: it reads them as
             idle and raises their biases every step, so they take more and
             more tokens while every bias climbs (MoeExpertBiasDrift)
  imbalance  from --fault-at (250) the aux loss is computed on detached
             router probabilities (it no longer pulls the router) and the
             router LR is 10x: the load drifts to the data's skew
             (MoeImbalanceHigh)

--aux-loss, --z-loss and --router-lr change a run's balancing coefficients
and its router's LR (x the rest's); --schedule cosine decays the LR after
warmup; --data mixed draws each sequence from one of five domains of
Zipfian weights (a natural skew).

    build/bin/trainwatch-server &
    PYTHONPATH=build/python /usr/bin/python3 client/examples/train_tiny_moe.py \\
        --server 127.0.0.1:50051 --run moe/demo --fault collapse
    build/bin/trainwatchctl alerts --run moe/demo
"""

import argparse
import json
import math
import os
import time

# One OpenBLAS kernel on every x86-64 machine (it picks SkylakeX on AVX-512
# Intel, Haswell on AMD EPYC: other sums, another trajectory), so a seed's
# run is the same everywhere.
os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")

import torch  # noqa: E402
from torch import nn
from torch.nn import functional as F

from trainwatch.torch import route_counts, router_z_loss

VOCAB, SEQ, BATCH = 64, 32, 16
FAULTS = ("none", "collapse", "dead", "drop", "zgrowth", "biasdrift", "biasblind",
          "imbalance")
DEAD_EXPERT = 5


class MoeLayer(nn.Module):
    def __init__(self, d, experts, top_k, capacity_factor, aux_free):
        super().__init__()
        self.d, self.experts, self.top_k = d, experts, top_k
        self.router = nn.Linear(d, experts)
        nn.init.zeros_(self.router.bias)
        self.w1 = nn.Parameter(torch.randn(experts, d, 2 * d) * 0.1)
        self.w2 = nn.Parameter(torch.randn(experts, 2 * d, d) * 0.1)
        self.capacity_factor = capacity_factor
        # The aux-loss-free bias (DeepSeek-V3): added to the scores for the
        # choice of experts only, updated outside the optimizer.
        self.register_buffer("bias", torch.zeros(experts))
        self.aux_free = aux_free
        self.detach_aux = False
        self.stats = None

    def forward(self, x):
        tokens = x.reshape(-1, self.d)
        # The router in fp32 (under autocast too): its softmax decides.
        with torch.autocast("cpu", enabled=False):
            logits = self.router(tokens.float())
        probs = logits.softmax(-1)
        choice = probs + self.bias if self.aux_free else probs
        top = choice.topk(self.top_k, dim=-1).indices                # [T, k]
        gates = probs.gather(1, top)
        gates = gates / gates.sum(-1, keepdim=True)
        counts = route_counts(top, self.experts)                     # before drops
        out = torch.zeros_like(tokens)
        dropped = 0
        cap = None
        if self.capacity_factor > 0:
            cap = int(math.ceil(self.capacity_factor * tokens.shape[0] * self.top_k
                                / self.experts))
        for e in range(self.experts):
            rows, slot = (top == e).nonzero(as_tuple=True)
            if cap is not None and rows.numel() > cap:
                dropped += rows.numel() - cap
                rows, slot = rows[:cap], slot[:cap]
            if rows.numel() == 0:
                continue
            h = F.gelu(tokens[rows] @ self.w1[e]) @ self.w2[e]
            out.index_add_(0, rows, (h * gates[rows, slot].unsqueeze(-1)).to(out.dtype))
        # Switch's load-balancing loss without its coefficient: E x sum of
        # (share of assignments) x (mean router probability); 1.0 at balance.
        share = counts.float() / counts.sum()
        mean_probs = probs.mean(0)
        aux = self.experts * (share * (mean_probs.detach() if self.detach_aux
                                       else mean_probs)).sum()
        self.stats = {"counts": counts, "dropped": dropped, "aux": aux,
                      "z": router_z_loss(logits), "logit_max": logits.detach().max(),
                      "z_loss": torch.logsumexp(logits, -1).square().mean()}
        return out.reshape(x.shape)


class Block(nn.Module):
    def __init__(self, d, experts, top_k, capacity_factor, aux_free):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, 2, batch_first=True)
        self.moe = MoeLayer(d, experts, top_k, capacity_factor, aux_free)

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.moe(self.ln2(x))


class TinyMoe(nn.Module):
    def __init__(self, layers=2, d=32, experts=8, top_k=2, capacity_factor=0.0, aux_free=False):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.pos = nn.Parameter(torch.randn(SEQ, d) * 0.02)
        self.blocks = nn.ModuleList(Block(d, experts, top_k, capacity_factor, aux_free)
                                    for _ in range(layers))
        self.head = nn.Linear(d, VOCAB)
        self.register_buffer("mask", torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), 1))

    def forward(self, ids):
        x = self.emb(ids) + self.pos[: ids.shape[1]]
        for b in self.blocks:
            x = b(x, self.mask)
        return self.head(x)


# "mixed": the domains' sizes (each cycles through the first `size` tokens)
# and their Zipfian weights (1/rank).
DOMAINS = (4, 8, 16, 32, 64)


def batch(gen, data="uniform"):
    """A synthetic language: each token is the previous one plus one of a
    few steps (mod VOCAB), the step chosen by the sequence. "skewed": three
    sequences in four cycle through the first 16 tokens only, so a few
    tokens dominate every batch (still learnable, as single-domain data).
    "mixed": each sequence is one of five domains that cycle through the
    first 4, 8, 16, 32 or 64 tokens, drawn with weights 1, 1/2, .., 1/5:
    token frequencies fall with the token's index, a natural skew that
    changes from batch to batch."""
    start = torch.randint(0, VOCAB, (BATCH, 1), generator=gen)
    stride = torch.randint(1, 4, (BATCH, 1), generator=gen)
    ids = (start + stride * torch.arange(SEQ + 1)) % VOCAB
    if data == "skewed":
        small = torch.rand(BATCH, 1, generator=gen) < 0.75
        ids = torch.where(small, ids % 16, ids)
    elif data == "mixed":
        weights = torch.tensor([1.0 / (i + 1) for i in range(len(DOMAINS))])
        domain = torch.multinomial(weights, BATCH, replacement=True, generator=gen)
        ids = ids % torch.tensor(DOMAINS)[domain].unsqueeze(1)
    return ids[:, :-1], ids[:, 1:]


def _num(x):
    x = float(x)
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return x


def jsonl_step(step, norm, loss, lr, moe):
    """A step line of the JSONL step log (docs/contracts.md)."""
    rec = {"step": step, "grad_norm": _num(norm), "loss": _num(loss), "lr": lr}
    if moe is not None:
        layers = []
        for m in moe:
            layer = {"layer": m["layer"], "tokens_per_expert": m["tokens_per_expert"].tolist(),
                     "aux_loss": _num(m["aux_loss"]), "z_loss": _num(m["z_loss"]),
                     "router_logit_max": _num(m["router_logit_max"])}
            if m["dropped"] is not None:
                layer["dropped"] = int(m["dropped"])
            if m["expert_bias"] is not None:
                layer["expert_bias"] = m["expert_bias"].tolist()
            layers.append(layer)
        rec["moe"] = {"layers": layers}
    return rec


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--server", default=None, help="stream to this trainwatch server")
    p.add_argument("--log-jsonl", default=None,
                   help="also write the steps here as a JSONL step log (`trainwatchctl replay`)")
    p.add_argument("--run", required=True)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--fault", choices=FAULTS, default="none")
    p.add_argument("--fault-at", type=int, default=None,
                   help="zgrowth, imbalance: the step the fault begins (250); collapse, dead, "
                        "biasdrift, biasblind: from the start unless given")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--every", type=int, default=1, help="send the moe stats every N steps")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--d", type=int, default=32, help="model width")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="bf16: autocast on CPU (the router stays fp32)")
    p.add_argument("--data", choices=("uniform", "skewed", "mixed"), default="uniform")
    p.add_argument("--balancing", choices=("aux", "bias"), default="aux",
                   help="a healthy run's balancing: Switch's aux loss or the aux-loss-free bias")
    p.add_argument("--aux-loss", type=float, default=None,
                   help="the aux loss's coefficient where the run has one (default 1e-2)")
    p.add_argument("--z-loss", type=float, default=None,
                   help="the router z-loss's coefficient where the run has one (default "
                        "1e-3; 0: none)")
    p.add_argument("--router-lr", type=float, default=1.0,
                   help="the router's LR x the rest's, from the start (a fault's own "
                        "multiple replaces it from the fault on)")
    p.add_argument("--schedule", choices=("const", "cosine"), default="const",
                   help="after warmup: constant, or cosine to 10%% of the peak at the end")
    p.add_argument("--capacity-factor", type=float, default=None,
                   help="tokens an expert takes per step, x its even share (0: dropless; "
                        "default 1.0 with --fault drop, else 0)")
    args = p.parse_args(argv)
    if not args.server and not args.log_jsonl:
        p.error("give --server, --log-jsonl or both")
    return args


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    fault = args.fault
    fault_at = args.fault_at
    if fault_at is None and fault in ("zgrowth", "imbalance"):
        fault_at = 250
    late_fault = fault_at is not None
    aux_free = fault in ("biasdrift", "biasblind") or (fault == "none" and args.balancing == "bias")
    # collapse and dead from the start never had an aux loss; from
    # --fault-at they switch off the aux loss and z-loss of a run that was
    # balanced until then.
    from_start = fault in ("collapse", "dead") and not late_fault
    switches_off = fault in ("collapse", "dead") and late_fault
    aux = 1e-2 if args.aux_loss is None else args.aux_loss
    aux_coeff = 0.0 if aux_free or fault == "zgrowth" or from_start else aux
    z = 1e-3 if args.z_loss is None else args.z_loss
    z_coeff = 0.0 if fault == "zgrowth" or (fault == "collapse" and from_start) else z
    capacity = args.capacity_factor
    if capacity is None:
        capacity = 1.0 if fault == "drop" else 0.0
    E, K = args.experts, args.top_k
    model = TinyMoe(args.layers, args.d, E, K, capacity, aux_free)
    routers = [b.moe.router for b in model.blocks]

    def break_router():
        with torch.no_grad():
            for r in routers:
                if fault == "collapse":
                    r.bias[:2] += 5.0  # experts 0 and 1 win for every token
                if fault == "dead":
                    r.bias[DEAD_EXPERT] = -20.0  # no token ever prefers it
    if not late_fault:
        break_router()
    router_params = [q for r in routers for q in (r.weight, r.bias)]
    rest = [q for q in model.parameters() if all(q is not w for w in router_params)]
    lr = args.lr
    base_router_lr = lr * args.router_lr
    router_lr = lr * {"zgrowth": 30, "imbalance": 10}.get(fault, args.router_lr)
    opt = torch.optim.AdamW([{"params": rest, "lr": lr},
                             {"params": router_params, "lr": router_lr}],
                            betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    warmup = 20
    bias_rate = 1e-3
    balancing = "AUX_FREE_BIAS" if aux_free else ("AUX_LOSS" if aux_coeff else "NO_BALANCING")
    precision = args.precision.upper()
    moe_config = {"num_experts": E, "top_k": K, "ep_size": 1, "balancing": balancing,
                  "aux_loss_coeff": aux_coeff, "z_loss_coeff": z_coeff,
                  "bias_update_rate": bias_rate, "capacity_factor": capacity}
    labels = {"model": "tiny-moe", "fault": fault}
    tw = None
    if args.server:
        import trainwatch
        tw = trainwatch.Client(args.server, run=args.run, precision=args.precision,
                               max_norm=1.0, warmup_steps=warmup, adam_eps=1e-8,
                               adam_beta2=0.95, labels=labels, moe=moe_config)
    log = open(args.log_jsonl, "w") if args.log_jsonl else None
    if log:
        log.write(json.dumps({"run_start": {
            "run_id": args.run, "rank": 0, "world_size": 1, "precision": precision,
            "max_norm": 1.0, "warmup_steps": warmup, "adam_eps": 1e-8, "adam_beta2": 0.95,
            "labels": labels, "moe": moe_config}}) + "\n")
    started = time.monotonic()
    try:
        for step in range(args.steps):
            faulty = not late_fault or step >= fault_at
            if late_fault and step == fault_at:
                break_router()
            if fault == "imbalance":
                for b in model.blocks:
                    b.moe.detach_aux = faulty
            scale = min(1.0, (step + 1) / warmup)
            if args.schedule == "cosine" and step >= warmup:
                done = (step - warmup) / max(1, args.steps - warmup)
                scale = 0.1 + 0.45 * (1 + math.cos(math.pi * done))
            opt.param_groups[0]["lr"] = lr * scale
            opt.param_groups[1]["lr"] = (router_lr if faulty else base_router_lr) * scale
            x, y = batch(gen, args.data)
            with torch.autocast("cpu", dtype=torch.bfloat16,
                                enabled=args.precision == "bf16"):
                logits = model(x).float()
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
            stats = [b.moe.stats for b in model.blocks]
            total = loss
            balanced = not (switches_off and faulty)
            if aux_coeff and balanced:
                total = total + aux_coeff * sum(s["aux"] for s in stats)
            if z_coeff and balanced:
                total = total + z_coeff * sum(s["z_loss"] for s in stats)
            opt.zero_grad(set_to_none=True)
            total.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if aux_free:
                with torch.no_grad():
                    for b, s in zip(model.blocks, stats):
                        load = s["counts"].float()
                        if fault == "biasdrift" and faulty:
                            # The fault's bug: it raises an under-loaded
                            # expert's bias but never lowers an over-loaded
                            # one's, and never re-centres, so the mean climbs.
                            b.moe.bias += bias_rate * (load < load.mean()).float()
                        elif fault == "biasblind" and faulty:
                            # The fault's bug: the gathered counts miss the
                            # last two experts (their slots never written),
                            # against the mean load the batch implies; the
                            # update is not re-centred.
                            seen = load.clone()
                            seen[-2:] = 0
                            mean = load.sum() / load.numel()
                            b.moe.bias += bias_rate * torch.sign(mean - seen)
                        else:
                            # DeepSeek-V3's update, re-centred.
                            b.moe.bias += bias_rate * torch.sign(load.mean() - load)
                            b.moe.bias -= b.moe.bias.mean()
            moe = None
            if step % args.every == 0:
                moe = [{"layer": str(i), "tokens_per_expert": s["counts"],
                        "dropped": s["dropped"] if capacity else None,
                        "aux_loss": s["aux"].detach(), "z_loss": s["z"],
                        "router_logit_max": s["logit_max"],
                        "expert_bias": model.blocks[i].moe.bias.clone() if aux_free else None}
                       for i, s in enumerate(stats)]
            step_lr = opt.param_groups[0]["lr"]
            if tw:
                tw.record(step, norm, loss=loss.detach(), lr=step_lr, moe=moe)
            if log:
                log.write(json.dumps(jsonl_step(step, norm, loss, step_lr, moe)) + "\n")
        if log:
            log.write(json.dumps({"event": {"step": args.steps - 1,
                                            "kind": "RUN_FINISHED"}}) + "\n")
    finally:
        if tw:
            tw.close()
        if log:
            log.close()
    acked = f"; acked {tw.stats.acked}, dropped {tw.stats.dropped}" if tw else ""
    print(f"trained {args.steps} steps, fault {fault}; loss {loss.item():.3f}; "
          f"{time.monotonic() - started:.1f} s{acked}")


if __name__ == "__main__":
    main()
