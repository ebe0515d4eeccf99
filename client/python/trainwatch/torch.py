"""trainwatch.torch: fill trainwatch records from a PyTorch training loop.

    from trainwatch.torch import StepHook, log_z

    hook = StepHook(tw, max_norm=1.0, optimizer=opt, scaler=scaler,
                    model=model, layer_stats_every=100)
    for step, (x, ids) in enumerate(loader):
        logits = model(x)
        loss = F.cross_entropy(...)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        hook.pre_step(step)              # before opt.step(): scale, layer stats
        scaler.step(opt); scaler.update()
        hook.post_step(step, norm, loss=loss, log_z=log_z(logits), batch_ids=ids)
        opt.zero_grad()

Nothing here calls .item() or synchronizes on a CUDA tensor: values stay
tensors and trainwatch.Client copies them to the host asynchronously. The
exceptions are named where they occur (a CUDA-capturable optimizer's step
count, read every layer_stats_every steps only).
"""

import math
import time

import torch
from torch import nn
from torch.nn import functional as F

from . import _trainwatch

__all__ = ["StepHook", "LayerStats", "HostGather", "host_ranks", "log_z", "max_attention_logit",
           "AttentionLogitProbe", "clip_fields"]

_CLIP_EPS = 1e-6  # clip_grad_norm_'s: coef = max_norm / (norm + 1e-6)


def clip_fields(grad_norm, max_norm):
    """(clipped, clip_coef) for a pre-clip norm, as clip_grad_norm_ computes
    them. Tensors in, tensors out (no sync): the same arithmetic on the
    device; floats in, floats out: the C++ client's own definition
    (trainwatch/v1/clipping.h), which the tests check the tensor path against.
    max_norm <= 0 (or inf) is clipping off (the RunStart's "0 = none"):
    never clipped, coefficient 1, not min(1, 0 / norm) = 0 on every step."""
    off = not (0.0 < float(max_norm) < math.inf)
    if isinstance(grad_norm, torch.Tensor):
        if off:
            return (torch.zeros((), dtype=torch.bool, device=grad_norm.device),
                    torch.ones((), device=grad_norm.device))
        coef = torch.clamp(max_norm / (grad_norm.detach().float() + _CLIP_EPS), max=1.0)
        return coef < 1.0, coef
    if off:
        return False, 1.0
    clipped, coef = _trainwatch.clip_fields(float(grad_norm), float(max_norm))
    return clipped, coef


def log_z(logits, dim=-1):
    """Mean log Z (logsumexp over the vocabulary dim) of output logits, detached;
    a 0-d float32 tensor on the logits' device."""
    with torch.no_grad():
        return torch.logsumexp(logits.detach().float(), dim=dim).mean()


def max_attention_logit(q, k, scale=None, mask=None):
    """Largest attention logit max(q @ k^T * scale) for custom attention code,
    detached. q: [..., L, d], k: [..., S, d]; scale defaults to 1/sqrt(d).
    mask (optional, broadcastable to [..., L, S]): bool, True where a pair is
    masked out (PyTorch's attn_mask convention), e.g. the causal future.
    Materialises the [L, S] logits: use it every N steps on long sequences."""
    with torch.no_grad():
        if scale is None:
            scale = 1.0 / math.sqrt(q.shape[-1])
        logits = torch.matmul(q.detach().float(), k.detach().float().transpose(-2, -1)) * scale
        if mask is not None:
            logits = logits.masked_fill(mask, float("-inf"))
        return logits.amax()


def route_counts(topk_indices, num_experts):
    """The routed assignments per expert of one MoE layer in this step, from
    the router's top-k expert indices (any shape, e.g. [tokens, top_k]):
    torch.bincount on the tensor's device, no GPU sync. Pass it as
    record(moe=[{"layer": name, "tokens_per_expert": counts, ...}]); the
    client copies it to the host without a sync. Sum it over data-parallel
    ranks first (all_reduce) for the global batch's counts."""
    return torch.bincount(topk_indices.detach().reshape(-1).to(torch.int64),
                          minlength=num_experts)[:num_experts]


def router_z_loss(router_logits):
    """The router z-loss without its coefficient (mean logsumexp^2 of the
    router logits over the tokens), a 0-dim tensor on their device."""
    return torch.logsumexp(router_logits.detach().float(), dim=-1).square().mean()


class AttentionLogitProbe:
    """Max attention logit of nn.MultiheadAttention modules, by recomputation.

    MHA (fused or not) never exposes its pre-softmax logits, so a forward
    pre-hook recomputes q and k from the module's input projections
    (in_proj_weight, or q/k_proj_weight) and takes max(q_h @ k_h^T)/sqrt(d_h)
    over heads. Limits: inputs must be passed positionally (torch < 2.0
    hooks do not see keyword arguments); masks and add_bias_kv/add_zero_attn
    key columns are ignored (the value is the max over all query/key pairs,
    an upper bound under a mask); it costs one extra Q/K projection and QK^T
    per module per probed forward, so enable it every N steps:

        probe = AttentionLogitProbe(model)
        probe.active = step % 100 == 0
        out = model(x)
        hook.post_step(step, norm, max_attn_logit=probe.pop())
    """

    def __init__(self, model_or_modules, active=True):
        modules = ([m for m in model_or_modules.modules() if isinstance(m, nn.MultiheadAttention)]
                   if isinstance(model_or_modules, nn.Module) else list(model_or_modules))
        if not modules:
            raise ValueError("AttentionLogitProbe: no nn.MultiheadAttention module found")
        self.active = active
        self._max = None
        self._handles = [m.register_forward_pre_hook(self._hook) for m in modules]

    def pop(self):
        """The max logit seen since the last pop (a 0-d tensor), or None."""
        value, self._max = self._max, None
        return value

    def remove(self):
        for h in self._handles:
            h.remove()
        self._handles = []

    def _hook(self, module, args):
        if not self.active or len(args) < 2:
            return
        value = _mha_max_logit(module, args[0], args[1])
        self._max = value if self._max is None else torch.maximum(self._max, value)


def _mha_max_logit(m, query, key):
    with torch.no_grad():
        e, h = m.embed_dim, m.num_heads
        hd = e // h
        if m._qkv_same_embed_dim:
            w_q, w_k = m.in_proj_weight[:e], m.in_proj_weight[e:2 * e]
        else:
            w_q, w_k = m.q_proj_weight, m.k_proj_weight
        b_q = b_k = None
        if m.in_proj_bias is not None:
            b_q, b_k = m.in_proj_bias[:e], m.in_proj_bias[e:2 * e]
        if query.dim() == 2:  # unbatched
            query, key = query.unsqueeze(1), key.unsqueeze(1)
        elif m.batch_first:
            query, key = query.transpose(0, 1), key.transpose(0, 1)
        # [L, N, E] -> [N, H, L, hd]
        q = F.linear(query.float(), w_q.float(), None if b_q is None else b_q.float())
        k = F.linear(key.float(), w_k.float(), None if b_k is None else b_k.float())
        q = q.reshape(q.shape[0], q.shape[1], h, hd).permute(1, 2, 0, 3)
        k = k.reshape(k.shape[0], k.shape[1], h, hd).permute(1, 2, 0, 3)
        return max_attention_logit(q, k)


class LayerStats:
    """Per-layer gradient and update statistics every `every` steps
    (docs/contracts.md layer_stats): for each module that owns parameters,
    by its qualified name, the gradient L2 norm, the gradient RMS, for
    Adam-family optimizers the RMS of g / (sqrt(v_hat) + eps), where v_hat is
    the bias-corrected second moment exp_avg_sq BEFORE this step's update
    (v_{t-1}): about 1 in steady state, far above it when v is out of date
    (NaN where there is no second moment: other optimizers, the first step),
    and update_rms_ratio: the RMS of this step's weight update over the RMS
    of the weights it was applied to (the "update norm" whose spikes precede
    loss spikes).

    Call collect(step) after clip_grad_norm_ (and after scaler.unscale_)
    and BEFORE optimizer.step(): the stats are of the gradients the optimizer
    is about to apply. Call update_ratios() right AFTER optimizer.step() on
    the same step. Steps in between cost one modulo; on a collected step
    the values stay on the device (no sync), except the step count of a
    capturable Adam, which lives on the GPU and is read there as a tensor.

    The update is read back from the optimizer's own state for
    torch.optim.Adam and AdamW (no copy of the weights: the step applied
    lr * m_hat / (sqrt(v_hat) + eps), plus AdamW's decoupled decay
    lr * wd * w); for any other optimizer collect() snapshots the layer's
    weights (one copy, on collected steps only) and the update is the
    difference.
    """

    def __init__(self, model, optimizer=None, every=100, update_ratio=True):
        if every < 1:
            raise ValueError("every must be >= 1")
        self.every = every
        self.optimizer = optimizer
        self.update_ratio = update_ratio
        layers = {}
        for name, p in model.named_parameters():
            if p.requires_grad:
                layers.setdefault(name.rpartition(".")[0] or name, []).append(p)
        self._layers = layers
        self._group_of = {}
        if optimizer is not None:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    self._group_of[p] = group
        self._from_state = (isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW))
                            and not any(g.get("amsgrad", False)
                                        for g in optimizer.param_groups))
        self._armed = None  # set by collect(): what update_ratios() needs

    def kinds(self, model):
        """{layer: kind name} of the layers this collects, from their
        modules (docs/contracts.md LayerStats.kind): nn.Embedding; a Linear
        onto the vocabulary (tied to the token embedding, or as wide as it);
        a norm; an MoE router (a module named router or gate, a Linear
        narrower than its input); other Linear and conv layers dense. A
        module of another type is left out: the server infers it from the
        name."""
        modules = dict(model.named_modules())
        embeddings = [m for m in modules.values() if isinstance(m, torch.nn.Embedding)]
        tied = {id(m.weight) for m in embeddings}
        vocab = max((m.num_embeddings for m in embeddings), default=None)
        out = {}
        for layer in self._layers:
            m = modules.get(layer)
            if m is None:
                continue
            leaf = layer.rpartition(".")[2]
            type_name = type(m).__name__.lower()
            if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
                out[layer] = "EMBEDDING"
            elif isinstance(m, torch.nn.Linear) and (
                    id(m.weight) in tied or (vocab is not None and m.out_features == vocab
                                             and m.out_features > m.in_features)):
                out[layer] = "OUTPUT"
            elif "norm" in type_name:
                out[layer] = "NORM"
            elif "router" in type_name or (
                    isinstance(m, torch.nn.Linear) and leaf in ("router", "gate", "wg")
                    and m.out_features < m.in_features):
                out[layer] = "ROUTER"
            elif isinstance(m, (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d)):
                out[layer] = "DENSE"
        return out

    def due(self, step):
        return step % self.every == 0

    def collect(self, step, force=False):
        """{layer: tensor([grad_norm, grad_rms, g_over_sqrt_v_rms])} on a
        collected step, else None."""
        if not force and step % self.every != 0:
            return None
        out = {}
        with torch.no_grad():
            for layer, params in self._layers.items():
                sq = n = ratio_sq = None
                have_v = True
                for p in params:
                    if p.grad is None:
                        continue
                    g = p.grad.detach().float()
                    s = g.pow(2).sum()
                    sq = s if sq is None else sq + s
                    n = g.numel() if n is None else n + g.numel()
                    r = self._ratio_sq(p, g)
                    if r is None:
                        have_v = False
                    elif have_v:
                        ratio_sq = r if ratio_sq is None else ratio_sq + r
                if sq is None:
                    continue
                gv = (torch.sqrt(ratio_sq / n) if have_v and ratio_sq is not None
                      else torch.full((), float("nan"), device=sq.device))
                out[layer] = torch.stack([torch.sqrt(sq), torch.sqrt(sq / n), gv])
            if self.update_ratio:
                self._arm(out)
        return out

    def update_ratios(self):
        """{layer: 0-d tensor update_rms_ratio} for the layers of the last
        collect(), after optimizer.step(); None when collect() did not
        collect. NaN for a layer whose weights are all zero."""
        armed, self._armed = self._armed, None
        if armed is None:
            return None
        out = {}
        with torch.no_grad():
            for layer, entries in armed.items():
                u2 = w2 = None
                for p, before, lr in entries:
                    if before is None:
                        u, w = self._update_from_state(p, lr)
                        if u is None:
                            u2 = None
                            break
                    else:
                        w = before
                        u = p.detach().float() - before
                    su, sw = u.pow(2).sum(), w.pow(2).sum()
                    u2 = su if u2 is None else u2 + su
                    w2 = sw if w2 is None else w2 + sw
                if u2 is None:
                    continue
                out[layer] = torch.where(w2 > 0, torch.sqrt(u2 / w2),
                                         torch.full_like(w2, float("nan")))
        return out

    def _arm(self, layers):
        """Keeps what update_ratios() needs: each parameter's lr as this
        step applies it and, without usable Adam state, a copy of it."""
        armed = {}
        for layer in layers:
            entries = []
            for p in self._layers[layer]:
                if p.grad is None:
                    continue
                group = self._group_of.get(p)
                lr = group["lr"] if group is not None else None
                before = None
                if not self._from_state or group is None:
                    before = p.detach().float().clone()
                entries.append((p, before, lr))
            armed[layer] = entries
        self._armed = armed

    def _update_from_state(self, p, lr):
        """(update, weights before it) of Adam/AdamW's last step on p, from
        its state after the step; (None, None) without state."""
        state = self.optimizer.state.get(p)
        group = self._group_of[p]
        if not state or "exp_avg_sq" not in state or lr is None:
            return None, None
        beta1, beta2 = group["betas"]
        t = state["step"]
        m = state["exp_avg"].detach().float()
        v = state["exp_avg_sq"].detach().float()
        if isinstance(t, torch.Tensor):
            t = t.to(v.device, torch.float32)
        adam = (m / (1.0 - beta1 ** t)) / (torch.sqrt(v / (1.0 - beta2 ** t)) + group["eps"])
        if group.get("maximize", False):
            adam = -adam
        w_after = p.detach().float()
        wd = group.get("weight_decay", 0.0)
        if isinstance(self.optimizer, torch.optim.AdamW) and wd:
            # w_after = w * (1 - lr wd) - lr adam
            w = (w_after + lr * adam) / (1.0 - lr * wd)
            return w_after - w, w
        return lr * adam, w_after + lr * adam

    def _ratio_sq(self, p, g):
        """sum((g / (sqrt(v_hat) + eps))^2) for p, or None without Adam state."""
        if self.optimizer is None:
            return None
        state = self.optimizer.state.get(p)
        group = self._group_of.get(p)
        if not state or group is None or "exp_avg_sq" not in state or "betas" not in group:
            return None
        t = state.get("step", 0)
        if not isinstance(t, torch.Tensor) and t == 0:
            return None
        beta2 = group["betas"][1]
        eps = group.get("eps", 1e-8)
        v = state["exp_avg_sq"].detach().float()
        if isinstance(t, torch.Tensor):
            t = t.to(v.device, torch.float32)
        correction = 1.0 - beta2 ** t
        denom = torch.sqrt(v / correction) + eps
        return (g / denom).pow(2).sum()


class StepHook:
    """Builds and records one step from what the loop already has.

    client: a trainwatch.Client. max_norm: the clip threshold passed to
    clip_grad_norm_. optimizer: for lr (param_groups[0]["lr"]) and Adam
    state. scaler: a torch.cuda.amp.GradScaler, or any object with
    get_scale() (and optionally a `found_inf` attribute) for a custom
    dynamic loss scaler. model + layer_stats_every: per-layer stats every N
    steps (see LayerStats; 1 sends them every step, which a SpikeHazard
    forecast needs), each (grad_norm, grad_rms, g_over_sqrt_v_rms,
    update_rms_ratio). last_layer_stats holds the latest stats sent (a dict
    of 4-element tensors), for a loop that also logs them itself.

    pre_step(step) goes right before optimizer.step()/scaler.step() (it
    snapshots the loss scale and collects layer stats); post_step(step,
    grad_norm, ...) after scaler.update(). Without a scaler and layer stats,
    post_step alone is enough.

    skipped: the loss scale went down across update() (GradScaler halves it
    exactly when it found inf/NaN and skipped the step), or the scaler's
    found_inf attribute is set. With torch's GradScaler the scale is read
    from its private `_scale` tensor, so it stays on the device; get_scale()
    (which syncs) is the fallback.

    Input-pipeline waits (data_wait_s, for InputPipelineStall): iterate the
    loader through hook.timed(loader), which times each next(); or call
    hook.data_ready() once the step's batch is in hand, which counts the
    time since the previous post_step() as waiting. step_time_s is measured
    by the client (the time between records).

    tokens_per_step: the tokens one optimizer step consumes (global batch x
    sequence length); each record then carries tokens, the running total
    (the first step counts the steps before it, its index x tokens_per_step,
    for a run resumed from a checkpoint), so that the run is compared with
    its baselines by tokens (docs/baselines.md). Set the attribute when the
    batch size changes mid-run; post_step(..., tokens=N) overrides it.
    """

    def __init__(self, client, max_norm, optimizer=None, scaler=None, model=None,
                 layer_stats_every=100, tokens_per_step=None):
        self.client = client
        self.max_norm = float(max_norm)
        self.optimizer = optimizer
        self.scaler = scaler
        self.layer_stats = (LayerStats(model, optimizer, layer_stats_every)
                            if model is not None else None)
        if self.layer_stats is not None and hasattr(client, "set_layer_kinds"):
            # What each layer is, from its module: the server's per-layer
            # rules leave out embeddings and the output head.
            client.set_layer_kinds(self.layer_stats.kinds(model))
        self._scale_before = None
        self._pending_layers = None
        self.last_layer_stats = None
        # False once the client has refused a 4-element layer stat (a
        # binding from before update_rms_ratio): then 3 are sent.
        self._send_update_ratio = True
        self._data_wait = None      # seconds waited for this step's input
        self._last_post = None      # perf_counter() at the previous post_step
        self.tokens_per_step = tokens_per_step
        self._tokens = None         # tokens consumed through the last post_step

    def timed(self, loader):
        """Yields what `loader` yields, adding the time each next() takes to
        the data_wait_s of the step recorded next."""
        it = iter(loader)
        while True:
            t0 = time.perf_counter()
            try:
                item = next(it)
            except StopIteration:
                return
            self._add_wait(time.perf_counter() - t0)
            yield item

    def data_ready(self):
        """The step's input is ready: the time since the previous post_step()
        was spent waiting for it (nothing on the first step)."""
        if self._last_post is not None:
            self._add_wait(time.perf_counter() - self._last_post)
            self._last_post = None

    def _add_wait(self, seconds):
        self._data_wait = seconds if self._data_wait is None else self._data_wait + seconds

    def pre_step(self, step):
        if self.scaler is not None:
            self._scale_before = self._scale()
        if self.layer_stats is not None:
            self._pending_layers = self.layer_stats.collect(step)

    def post_step(self, step, grad_norm, loss=None, lr=None, **fields):
        """Records the step; extra keyword fields (log_z, max_attn_logit,
        batch_ids, shard_sq_sum ...) pass through to Client.record()."""
        clipped, clip_coef = clip_fields(grad_norm, self.max_norm)
        if isinstance(loss, torch.Tensor):
            loss = loss.detach()
        if lr is None and self.optimizer is not None:
            lr = self.optimizer.param_groups[0]["lr"]
        if self.scaler is not None:
            scale = self._scale()
            if scale is not None:
                fields.setdefault("loss_scale", scale)
                fields.setdefault("skipped", self._skipped(scale))
        if self._pending_layers:
            layers = self._with_update_ratios(self._pending_layers, fields.get("skipped"))
            self.last_layer_stats = layers
            fields.setdefault("layer_stats", layers)
        self._pending_layers = None
        self._scale_before = None
        if self._data_wait is not None:
            fields.setdefault("data_wait_s", self._data_wait)
        self._data_wait = None
        if self.tokens_per_step:
            if self._tokens is None:
                self._tokens = int(step) * int(self.tokens_per_step)
            self._tokens += int(self.tokens_per_step)
            fields.setdefault("tokens", self._tokens)
        record = dict(grad_norm=_detach(grad_norm), loss=loss, lr=lr,
                      clipped=clipped, clip_coef=clip_coef, **fields)
        layers = record.get("layer_stats")
        if self._send_update_ratio or not isinstance(layers, dict):
            try:
                ok = self.client.record(step, **record)
            except (ValueError, TypeError):
                if not isinstance(layers, dict) or not self._send_update_ratio:
                    raise
                # A binding that takes (grad_norm, grad_rms,
                # g_over_sqrt_v_rms) only: drop the fourth from now on.
                self._send_update_ratio = False
                ok = self.client.record(step, **_three_layer_stats(record))
        else:
            ok = self.client.record(step, **_three_layer_stats(record))
        self._last_post = time.perf_counter()
        return ok

    def _with_update_ratios(self, layers, skipped):
        """The pre-step stats with this step's update_rms_ratio appended (0
        on a skipped step: nothing was applied; NaN where unknown)."""
        ratios = self.layer_stats.update_ratios() or {}
        out = {}
        for layer, stats in layers.items():
            r = ratios.get(layer)
            if r is None:
                r = torch.full((), float("nan"), device=stats.device)
            elif skipped is not None:
                r = torch.where(torch.as_tensor(skipped, device=r.device),
                                torch.zeros_like(r), r)
            out[layer] = torch.cat([stats, r.reshape(1).to(stats.dtype)])
        return out

    def _scale(self):
        s = self.scaler
        if hasattr(s, "is_enabled") and not s.is_enabled():
            return None
        t = getattr(s, "_scale", None)
        if isinstance(t, torch.Tensor):
            return t.detach().clone().reshape(())
        return float(s.get_scale())

    def _skipped(self, scale_after):
        before = self._scale_before
        found = getattr(self.scaler, "found_inf", None)
        if before is None:
            down = False
        elif isinstance(scale_after, torch.Tensor):
            down = scale_after < before
        else:
            down = scale_after < before
        if found is None:
            return down
        if isinstance(down, torch.Tensor) or isinstance(found, torch.Tensor):
            return torch.logical_or(torch.as_tensor(down), torch.as_tensor(found))
        return bool(down) or bool(found)


def _detach(x):
    return x.detach() if isinstance(x, torch.Tensor) else x


def _three_layer_stats(record):
    """record with each layer stat cut to its first three values."""
    layers = record["layer_stats"]
    return dict(record, layer_stats={k: v[:3] for k, v in layers.items()})


def _plain_value(v):
    """A record's value as plain Python data, to pickle across ranks: a
    tensor read (.item() or .tolist(); a CUDA tensor's read syncs), dicts,
    lists and tuples through."""
    if isinstance(v, torch.Tensor):
        v = v.detach()
        return v.item() if v.numel() == 1 and v.dim() == 0 else v.cpu().tolist()
    if isinstance(v, dict):
        return {k: _plain_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(_plain_value(x) for x in v)
    return v


class HostGather:
    """One Report stream for a host's ranks (docs/python.md, host streams):
    each rank calls record() as it would Client.record(), and every `every`
    calls the host's records are gathered over `group` (a gloo group of the
    host's ranks: the CPU, no GPU collective) to the group's first rank,
    whose Client, made with local_ranks=the group's ranks, sends each with
    its rank. A run of 8 ranks a host then opens a stream a host, and costs
    the server ~5x less CPU a rank-record than a stream a rank.

        # every rank makes every host's group, in the same order
        groups = [dist.new_group(list(range(h * 8, h * 8 + 8)), backend="gloo")
                  for h in range(world // 8)]
        group = groups[rank // 8]
        ranks = host_ranks(group)
        tw = trainwatch.Client(addr, run=..., rank=rank, world_size=world,
                               local_ranks=ranks) if rank == ranks[0] else None
        gather = HostGather(tw, group, every=10)
        hook = StepHook(gather, max_norm=1.0, ...)   # or gather.record(...)
        ...
        gather.close()                  # every rank: the last gather

    Each rank measures its own step_time_s (the time since its previous
    record()) unless given; values that are tensors are read when gathered
    (a CUDA tensor's read syncs: gather every N steps). gather() and close()
    are collectives: every rank of the group calls them in the same order.
    """

    def __init__(self, client, group=None, every=1):
        import torch.distributed as dist
        if not dist.is_initialized():
            raise ValueError("HostGather needs torch.distributed initialised "
                             "(a gloo group of the host's ranks)")
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be an int >= 1, got {every!r}")
        self._dist = dist
        self.group = group
        self.every = every
        self.ranks = host_ranks(group)
        self.leader = self.ranks[0]
        me = dist.get_rank()
        if (me == self.leader) != (client is not None):
            raise ValueError(f"rank {me}: the group's first rank ({self.leader}) gives "
                             "HostGather its Client (local_ranks=the group's ranks), the "
                             "others None")
        if client is not None and sorted(getattr(client, "local_ranks", ())) != \
                sorted(self.ranks):
            raise ValueError(f"the leader's Client must be made with local_ranks="
                             f"{self.ranks}")
        self.client = client
        self._buffer = []
        self._calls = 0
        self._last = None
        self._dropped = 0

    def set_layer_kinds(self, kinds):
        if self.client is not None:
            self.client.set_layer_kinds(kinds)

    def record(self, step, grad_norm, **fields):
        """Queues this rank's step; gathers every `every` calls. Returns
        False when a step the leader sent was dropped."""
        now = time.perf_counter()
        if fields.get("step_time_s") is None and self._last is not None:
            fields["step_time_s"] = now - self._last
        self._last = now
        fields.pop("rank", None)
        self._buffer.append((int(step), _plain_value(grad_norm),
                             {k: _plain_value(v) for k, v in fields.items()}))
        self._calls += 1
        if self._calls % self.every == 0:
            return self.gather()
        return True

    def gather(self):
        """The collective: the group's records to its first rank, which
        records them. Every rank of the group calls it."""
        out = [None] * len(self.ranks) if self.client is not None else None
        self._dist.gather_object(self._buffer, out, dst=self.leader, group=self.group)
        self._buffer = []
        if self.client is None:
            return True
        ok = True
        for rank, records in zip(self.ranks, out):
            for step, grad_norm, fields in records:
                ok &= self.client.record(step, grad_norm, rank=rank, **fields)
        return ok

    def close(self, timeout_s=10.0):
        """Gathers what is left (a collective), then closes the leader's
        Client."""
        self.gather()
        if self.client is not None:
            return self.client.close(timeout_s)
        return True


def host_ranks(group=None):
    """The global ranks of `group` (None: the default group), in order."""
    import torch.distributed as dist
    if group is None:
        return list(range(dist.get_world_size()))
    return [dist.get_global_rank(group, i) for i in range(dist.get_world_size(group))]
