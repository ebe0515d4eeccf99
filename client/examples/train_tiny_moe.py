#!/usr/bin/python3
"""Train a tiny mixture-of-experts language model on CPU and stream its
routing health to trainwatch (docs/detectors.md, the Moe* alerts).

A 2-layer transformer whose feed-forward blocks are MoE layers (8 experts,
top-2, a linear router) learns a synthetic language (each token follows
from the previous one by one of a few rules). Every step each MoE layer's
routed assignments (trainwatch.torch.route_counts: torch.bincount of the
router's top-k indices), the assignments dropped over capacity, the
load-balancing loss without its coefficient (Switch's E x sum f_i P_i: 1.0
at balance), the router z-loss and the largest router logit go to trainwatch
in the step's moe field, with the loss and gradient norm.

Faults to inject (--fault), each named by one alert:
  none       a healthy run (aux loss 1e-2, z-loss 1e-3, dropless): silent
  collapse   no aux loss and a router initialised to prefer two experts:
             every token goes to the same two (MoeRouterCollapse)
  dead       expert 5's router row starts far below the others and no aux
             loss pulls it back: it never gets a token (MoeDeadExpert)
  drop       capacity factor 1.0 under the router's natural skew: tokens over
             an expert's capacity are dropped (MoeTokensDropped)
  zgrowth    no z-loss, no aux loss and, from --fault-at, a router LR 30x the
             rest: the router's logits grow (MoeRouterZLossGrowth)
  biasdrift  aux-loss-free balancing whose bias update raises under-loaded
             experts, never lowers over-loaded ones and is not re-centred:
             the bias's mean drifts away from 0 (MoeExpertBiasDrift)

    build/bin/trainwatch-server &
    PYTHONPATH=build/python /usr/bin/python3 client/examples/train_tiny_moe.py \\
        --server 127.0.0.1:50051 --run moe/demo --fault collapse
    build/bin/trainwatchctl alerts --run moe/demo
"""

import argparse
import math

import torch
from torch import nn
from torch.nn import functional as F

import trainwatch
from trainwatch.torch import route_counts, router_z_loss

VOCAB, SEQ, BATCH, D, EXPERTS, TOP_K, LAYERS = 64, 32, 16, 32, 8, 2, 2


class MoeLayer(nn.Module):
    def __init__(self, capacity_factor, aux_free):
        super().__init__()
        self.router = nn.Linear(D, EXPERTS)
        nn.init.zeros_(self.router.bias)
        self.w1 = nn.Parameter(torch.randn(EXPERTS, D, 2 * D) * 0.1)
        self.w2 = nn.Parameter(torch.randn(EXPERTS, 2 * D, D) * 0.1)
        self.capacity_factor = capacity_factor
        # The aux-loss-free bias (DeepSeek-V3): added to the scores for the
        # choice of experts only, updated outside the optimizer.
        self.register_buffer("bias", torch.zeros(EXPERTS))
        self.aux_free = aux_free
        self.stats = None

    def forward(self, x):
        tokens = x.reshape(-1, D)
        logits = self.router(tokens)
        probs = logits.softmax(-1)
        choice = probs + self.bias if self.aux_free else probs
        top = choice.topk(TOP_K, dim=-1).indices                     # [T, k]
        gates = probs.gather(1, top)
        gates = gates / gates.sum(-1, keepdim=True)
        counts = route_counts(top, EXPERTS)                          # before drops
        out = torch.zeros_like(tokens)
        dropped = 0
        cap = None
        if self.capacity_factor > 0:
            cap = int(math.ceil(self.capacity_factor * tokens.shape[0] * TOP_K / EXPERTS))
        for e in range(EXPERTS):
            rows, slot = (top == e).nonzero(as_tuple=True)
            if cap is not None and rows.numel() > cap:
                dropped += rows.numel() - cap
                rows, slot = rows[:cap], slot[:cap]
            if rows.numel() == 0:
                continue
            h = F.gelu(tokens[rows] @ self.w1[e]) @ self.w2[e]
            out.index_add_(0, rows, h * gates[rows, slot].unsqueeze(-1))
        # Switch's load-balancing loss without its coefficient: E x sum of
        # (share of assignments) x (mean router probability); 1.0 at balance.
        share = counts.float() / counts.sum()
        aux = EXPERTS * (share * probs.mean(0)).sum()
        self.stats = {"counts": counts, "dropped": dropped, "aux": aux,
                      "z": router_z_loss(logits), "logit_max": logits.detach().max(),
                      "z_loss": torch.logsumexp(logits, -1).square().mean()}
        return out.reshape(x.shape)


class Block(nn.Module):
    def __init__(self, capacity_factor, aux_free):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = nn.MultiheadAttention(D, 2, batch_first=True)
        self.moe = MoeLayer(capacity_factor, aux_free)

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.moe(self.ln2(x))


class TinyMoe(nn.Module):
    def __init__(self, capacity_factor=0.0, aux_free=False):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.pos = nn.Parameter(torch.randn(SEQ, D) * 0.02)
        self.blocks = nn.ModuleList(Block(capacity_factor, aux_free) for _ in range(LAYERS))
        self.head = nn.Linear(D, VOCAB)
        self.register_buffer("mask", torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), 1))

    def forward(self, ids):
        x = self.emb(ids) + self.pos[: ids.shape[1]]
        for b in self.blocks:
            x = b(x, self.mask)
        return self.head(x)


def batch(gen):
    """A synthetic language: each token is the previous one plus one of a
    few steps (mod VOCAB), the step chosen by the sequence."""
    start = torch.randint(0, VOCAB, (BATCH, 1), generator=gen)
    stride = torch.randint(1, 4, (BATCH, 1), generator=gen)
    ids = (start + stride * torch.arange(SEQ + 1)) % VOCAB
    return ids[:, :-1], ids[:, 1:]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--server", required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--fault", choices=("none", "collapse", "dead", "drop", "zgrowth",
                                       "biasdrift"), default="none")
    p.add_argument("--fault-at", type=int, default=250, help="zgrowth: the router LR rises here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--every", type=int, default=1, help="send the moe stats every N steps")
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    fault = args.fault
    aux_coeff = 0.0 if fault in ("collapse", "dead", "zgrowth", "biasdrift") else 1e-2
    z_coeff = 0.0 if fault in ("zgrowth", "collapse") else 1e-3
    capacity = 1.0 if fault == "drop" else 0.0
    aux_free = fault == "biasdrift"
    model = TinyMoe(capacity, aux_free)
    routers = [b.moe.router for b in model.blocks]
    with torch.no_grad():
        for r in routers:
            if fault == "collapse":
                r.bias[:2] = 5.0  # experts 0 and 1 win for every token
            if fault == "dead":
                r.bias[5] = -20.0  # no token ever prefers expert 5
    router_params = [q for r in routers for q in (r.weight, r.bias)]
    rest = [q for q in model.parameters() if all(q is not w for w in router_params)]
    lr = args.lr
    router_lr = lr * (30 if fault == "zgrowth" else 1)
    opt = torch.optim.AdamW([{"params": rest, "lr": lr},
                             {"params": router_params, "lr": router_lr}],
                            betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    warmup = 20
    balancing = "AUX_FREE_BIAS" if aux_free else ("AUX_LOSS" if aux_coeff else "NO_BALANCING")
    tw = trainwatch.Client(args.server, run=args.run, precision="fp32", max_norm=1.0,
                           warmup_steps=warmup, adam_eps=1e-8, adam_beta2=0.95,
                           labels={"model": "tiny-moe", "fault": fault},
                           moe={"num_experts": EXPERTS, "top_k": TOP_K, "ep_size": 1,
                                "balancing": balancing, "aux_loss_coeff": aux_coeff,
                                "z_loss_coeff": z_coeff, "bias_update_rate": 1e-3,
                                "capacity_factor": capacity})
    try:
        for step in range(args.steps):
            scale = min(1.0, (step + 1) / warmup)
            opt.param_groups[0]["lr"] = lr * scale
            late = fault != "zgrowth" or step >= args.fault_at
            opt.param_groups[1]["lr"] = (router_lr if late else lr) * scale
            x, y = batch(gen)
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
            stats = [b.moe.stats for b in model.blocks]
            total = loss
            if aux_coeff:
                total = total + aux_coeff * sum(s["aux"] for s in stats)
            if z_coeff:
                total = total + z_coeff * sum(s["z_loss"] for s in stats)
            opt.zero_grad(set_to_none=True)
            total.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if aux_free:
                # The aux-free update, with the fault's bug: it raises an
                # under-loaded expert's bias but never lowers an over-loaded
                # one's, and never re-centres, so the mean climbs (the
                # correct update also lowers and subtracts the mean).
                with torch.no_grad():
                    for b, s in zip(model.blocks, stats):
                        load = s["counts"].float()
                        b.moe.bias += 1e-3 * (load < load.mean()).float()
            moe = None
            if step % args.every == 0:
                moe = [{"layer": str(i), "tokens_per_expert": s["counts"],
                        "dropped": s["dropped"] if capacity else None,
                        "aux_loss": s["aux"].detach(), "z_loss": s["z"],
                        "router_logit_max": s["logit_max"],
                        "expert_bias": model.blocks[i].moe.bias.clone() if aux_free else None}
                       for i, s in enumerate(stats)]
            tw.record(step, norm, loss=loss.detach(), lr=opt.param_groups[0]["lr"], moe=moe)
    finally:
        tw.close()
    s = tw.stats
    print(f"trained {args.steps} steps, fault {fault}; loss {loss.item():.3f}; "
          f"acked {s.acked}, dropped {s.dropped}")


if __name__ == "__main__":
    main()
