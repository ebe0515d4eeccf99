#!/usr/bin/python3
"""Train a small model with emulated FP8 matmuls on CPU and stream its FP8
scaling health to trainwatch (docs/fp8.md).

A 2-layer MLP classifies a synthetic task; both linears cast their input and
weight to FP8 (E4M3 by default) with per-tensor delayed scaling
(trainwatch.fp8.DelayedScaling: amax history, margin, "max"), quantize-
dequantize in numpy, bit-exact. Every --fp8-every steps the tensors' stats
(format, amax, scale, history length, margin, overflow and underflow shares)
go to trainwatch in the step's fp8 map, with the loss and gradient norm.

Faults to inject (--fault), each named by one alert:
  none       a healthy run: silent
  overflow   fc1's input gets an outlier feature growing 5% a step for 100
             steps from --fault-at: the delayed scale lags one step behind
             the amax and the feature saturates (Fp8Overflow)
  mismatch   tensors reported as E4M3_FNUZ (max 240) scaled with the E4M3
             max (448): every scale 1.87x too large (Fp8ScaleMismatch)
  desync     two tensor-parallel ranks (world_size 2) hold halves of each
             weight and reduce nothing: their amax and scale differ within
             amax_group tp0 (Fp8AmaxDesync); without the fault they reduce
             the amax over the group and agree
  growth     an outlier feature growing 1% a step from --fault-at: the amax
             forecast to reach 100x its baseline (Fp8AmaxGrowth) hundreds of
             steps before the bulk of the tensor underflows (Fp8Underflow)

    build/bin/trainwatch-server &
    PYTHONPATH=build/python /usr/bin/python3 client/examples/train_fp8.py \\
        --server 127.0.0.1:50051 --run fp8/demo --fault mismatch
    build/bin/trainwatchctl alerts --run fp8/demo
"""

import argparse
import sys
from collections import OrderedDict

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

import trainwatch
from trainwatch.fp8 import DelayedScaling, FP8StatsHook, emulate_fp8

FEATURES, HIDDEN, CLASSES = 32, 64, 8


def batches(seed, batch):
    """An endless synthetic task: the class is the argmax of a fixed linear
    map of Gaussian features (learnable, with noise)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(FEATURES, CLASSES, generator=g)
    while True:
        x = torch.randn(batch, FEATURES, generator=g)
        y = (x @ w + 0.5 * torch.randn(batch, CLASSES, generator=g)).argmax(-1)
        yield x, y


class OutlierFeature:
    """Feature 0 of fc1's input, replaced by a nearly constant magnitude that
    grows by `rate` a step from step `start` for `steps` steps, then holds
    (an outlier feature). fc1's weights for it are held at zero, so it
    changes the FP8 cast (its amax, hence every other value's scale) and
    nothing else of the model."""

    def __init__(self, start, rate, steps=None):
        self.start, self.rate, self.steps, self.step = start, rate, steps, 0

    def __call__(self, x):
        if self.step < self.start:
            return x
        grown = self.step - self.start + 1
        if self.steps is not None:
            grown = min(grown, self.steps)
        g = (1 + self.rate) ** grown
        x = x.clone()
        x[:, 0] = g * (4.0 + 0.01 * torch.randn(x.shape[0]))
        return x


def shard_stats(lin, name, recipes, sync):
    """Tensor-parallel weight shards (two column halves of `lin.weight`),
    each cast with its rank's recipe: with `sync`, both take the group's
    amax (the max over the shards), as a reduction over tp0 would give."""
    w = lin.weight.detach().numpy()
    halves = (w[:, : w.shape[1] // 2], w[:, w.shape[1] // 2:])
    group_amax = max(float(np.abs(h).max()) for h in halves)
    out = []
    for rank, half in enumerate(halves):
        _, stats = recipes[rank].quantize(half, amax=group_amax if sync else None)
        out.append({f"{name}:weight": stats})
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--server", required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--fault", choices=("none", "overflow", "mismatch", "desync", "growth"),
                   default="none")
    p.add_argument("--fault-at", type=int, default=100)
    p.add_argument("--fp8-every", type=int, default=10)
    p.add_argument("--history", type=int, default=16, help="amax_history_len")
    p.add_argument("--margin", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--tp", type=int, choices=(1, 2), default=1,
                   help="tensor-parallel ranks (desync: 2)")
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    model = nn.Sequential(OrderedDict(fc1=nn.Linear(FEATURES, HIDDEN), act=nn.GELU(),
                                      fc2=nn.Linear(HIDDEN, CLASSES)))
    fmt, fmt_max = ("E4M3_FNUZ", 448.0) if args.fault == "mismatch" else ("E4M3", None)
    linears = emulate_fp8(model, fmt=fmt, fmt_max=fmt_max, amax_history_len=args.history,
                          margin=args.margin)
    hook = FP8StatsHook(linears, every=args.fp8_every)
    outlier = None
    if args.fault in ("overflow", "growth"):
        # overflow: 5% a step for 100 steps (x131), then flat; growth: 1% a
        # step until the end.
        outlier = (OutlierFeature(args.fault_at, 0.05, steps=100) if args.fault == "overflow"
                   else OutlierFeature(args.fault_at, 0.01))
        linears["fc1"].input_hook = outlier
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)

    world = 2 if args.fault == "desync" else args.tp
    clients = [trainwatch.Client(args.server, run=args.run, rank=r, world_size=world,
                                 precision="bf16", max_norm=1.0, host=f"tp-host-{r}")
               for r in range(world)]
    shard_recipes = None
    if world == 2:
        shard_recipes = {n: [DelayedScaling("E4M3", args.history, args.margin,
                                            amax_group="tp0") for _ in range(2)]
                         for n in ("fc1", "fc2")}

    data = batches(args.seed, 256)
    for step in range(args.steps):
        if outlier is not None:
            outlier.step = step
        x, y = next(data)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        if outlier is not None:
            model.fc1.weight.grad[:, 0] = 0
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if outlier is not None:
            with torch.no_grad():
                model.fc1.weight[:, 0] = 0
        fp8 = hook.collect(step)
        per_rank = [fp8] * world
        if shard_recipes is not None:
            # Each rank reports its own shard's weight stats (the recipes
            # update every step, reported or not).
            shards = [shard_stats(getattr(model, n), n, shard_recipes[n],
                                  sync=args.fault != "desync")
                      for n in ("fc1", "fc2")]
            if fp8 is not None:
                per_rank = [dict(fp8, **shards[0][r], **shards[1][r]) for r in range(world)]
        for rank, tw in enumerate(clients):
            tw.record(step, grad_norm=float(norm), loss=float(loss), lr=args.lr,
                      fp8=per_rank[rank])
    for tw in clients:
        tw.event("run_finished", args.steps - 1)
        tw.close()
    s = clients[0].stats
    print(f"trained {args.steps} steps, fault {args.fault}; acked {s.acked}, dropped {s.dropped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
