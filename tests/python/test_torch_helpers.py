"""trainwatch.torch: the values its helpers compute, against direct math."""

import math

import pytest
import torch
from torch import nn

import trainwatch
from trainwatch.torch import (AttentionLogitProbe, LayerStats, StepHook, clip_fields,
                              log_z, max_attention_logit)


def test_clip_fields_match_clip_grad_norm():
    p = nn.Parameter(torch.zeros(10))
    p.grad = torch.full((10,), 2.0)
    norm = torch.nn.utils.clip_grad_norm_([p], 1.0)
    clipped, coef = clip_fields(norm, 1.0)
    assert bool(clipped) and float(coef) == pytest.approx(1.0 / (math.sqrt(40) + 1e-6))
    assert p.grad.norm().item() == pytest.approx(1.0, rel=1e-5)
    assert clip_fields(0.5, 1.0) == (False, 1.0)


def test_clip_fields_tensor_path_is_the_cpp_definition_at_the_boundary():
    # One definition of "clipped" (trainwatch/v1/clipping.h): the float path
    # is the C++ client's; the tensor path (torch arithmetic, no sync) must
    # agree with it at max_norm, just under it (within clip_grad_norm_'s
    # 1e-6) and just over, and on 0, +Inf and NaN norms. The tensor path
    # computes in float32 as clip_grad_norm_ does on float32 grads: its
    # coefficient is the double one to float32's precision, and only a norm
    # within a float32 ulp of max_norm - 1e-6 could be judged apart (none
    # here).
    max_norm = 1.0
    norms = [max_norm + d for d in (-2e-6, -5e-7, -1e-7, 0.0, 1e-7, 1e-6)]
    norms += [0.0, 0.5, 2.0, math.inf, math.nan]
    for norm in norms:
        c_clipped, c_coef = trainwatch._trainwatch.clip_fields(norm, max_norm)
        f_clipped, f_coef = clip_fields(norm, max_norm)
        assert (f_clipped, f_coef) == (c_clipped, c_coef) or math.isnan(norm)
        t_clipped, t_coef = clip_fields(torch.tensor(norm, dtype=torch.float64), max_norm)
        assert bool(t_clipped) == c_clipped, norm
        if not math.isnan(norm):
            assert float(t_coef) == pytest.approx(c_coef, rel=1e-6, abs=0), norm
    # Within 1e-6 under max_norm clip_grad_norm_ scales the gradients (by
    # less than a part in 10^6): clipped, on both sides.
    assert trainwatch._trainwatch.clip_fields(max_norm - 5e-7, max_norm)[0]
    assert not trainwatch._trainwatch.clip_fields(math.nan, max_norm)[0]
    assert trainwatch._trainwatch.clip_fields(math.inf, max_norm) == (True, 0.0)


def test_clip_fields_with_clipping_off_never_clip():
    # max_norm 0 is "no clipping" in the RunStart; min(1, 0 / norm) would
    # report every step clipped with coefficient 0 (ClipFractionHigh at 100%).
    for off in (0.0, math.inf):
        assert clip_fields(3.0, off) == (False, 1.0)
        clipped, coef = clip_fields(torch.tensor(3.0), off)
        assert not bool(clipped) and float(coef) == 1.0


def test_log_z_is_mean_logsumexp_detached():
    logits = torch.randn(2, 5, 7, requires_grad=True)
    z = log_z(logits)
    assert not z.requires_grad and z.dim() == 0
    expect = torch.log(torch.exp(logits.detach()).sum(-1)).mean()
    assert float(z) == pytest.approx(float(expect), rel=1e-5)


def test_max_attention_logit_with_and_without_mask():
    q, k = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 4, 8)
    scores = q @ k.transpose(-2, -1) / math.sqrt(8)
    assert float(max_attention_logit(q, k)) == pytest.approx(float(scores.max()), rel=1e-5)
    mask = torch.ones(4, 4, dtype=torch.bool).triu(1)
    expect = scores.masked_fill(mask, -math.inf).max()
    assert float(max_attention_logit(q, k, mask=mask)) == pytest.approx(float(expect), rel=1e-5)


@pytest.mark.parametrize("batch_first", [False, True])
def test_attention_probe_recomputes_mha_logits(batch_first):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4, batch_first=batch_first).eval()
    x = torch.randn(5, 2, 16)  # [L, N, E]
    inp = x.transpose(0, 1) if batch_first else x
    probe = AttentionLogitProbe(nn.Sequential(mha))
    mha(inp, inp, inp)
    got = probe.pop()
    assert probe.pop() is None
    # Reference: the projections by hand, per head.
    w, b = mha.in_proj_weight, mha.in_proj_bias
    q = (x @ w[:16].T + b[:16]).reshape(5, 2, 4, 4).permute(1, 2, 0, 3)
    k = (x @ w[16:32].T + b[16:32]).reshape(5, 2, 4, 4).permute(1, 2, 0, 3)
    expect = (q @ k.transpose(-2, -1) / 2.0).max()
    assert float(got) == pytest.approx(float(expect), rel=1e-5)
    probe.active = False
    mha(inp, inp, inp)
    assert probe.pop() is None
    probe.remove()


def test_layer_stats_g_over_sqrt_v_uses_bias_corrected_previous_v():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, betas=(0.9, 0.99), eps=1e-8)
    stats = LayerStats(model, opt, every=2)

    def backward():
        opt.zero_grad()
        model(torch.randn(8, 4)).pow(2).sum().backward()

    backward()
    first = stats.collect(0)
    assert set(first) == {"0", "1"}
    assert math.isnan(float(first["0"][2]))  # no second moment yet
    opt.step()
    backward()
    assert stats.collect(1) is None  # not a collected step
    opt.step()
    backward()
    got = stats.collect(2)  # before the third step: v after two updates
    params = list(model[0].parameters())
    g = torch.cat([p.grad.reshape(-1) for p in params])
    v = torch.cat([opt.state[p]["exp_avg_sq"].reshape(-1) for p in params])
    v_hat = v / (1 - 0.99 ** 2)
    expect = torch.sqrt(((g / (v_hat.sqrt() + 1e-8)) ** 2).mean())
    assert float(got["0"][0]) == pytest.approx(float(g.norm()), rel=1e-5)
    assert float(got["0"][1]) == pytest.approx(float(g.norm() / math.sqrt(g.numel())), rel=1e-5)
    assert float(got["0"][2]) == pytest.approx(float(expect), rel=1e-4)


class FakeClient:
    def __init__(self):
        self.records = []

    def record(self, step, **fields):
        self.records.append((step, fields))
        return True


class HalvingScaler:
    """GradScaler-shaped: a CPU `_scale` tensor, halved on inf."""

    def __init__(self):
        self._scale = torch.tensor(1024.0)

    def is_enabled(self):
        return True

    def update(self, found_inf):
        if found_inf:
            self._scale = self._scale * 0.5


def test_step_hook_fills_clip_scale_and_skipped():
    tw = FakeClient()
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = HalvingScaler()
    hook = StepHook(tw, max_norm=1.0, optimizer=opt, scaler=scaler)
    for step, found_inf in enumerate([False, True, False]):
        hook.pre_step(step)
        scaler.update(found_inf)
        hook.post_step(step, torch.tensor(3.0 if found_inf else 0.5), loss=torch.tensor(1.0))
    skipped = [bool(f["skipped"]) for _, f in tw.records]
    scales = [float(f["loss_scale"]) for _, f in tw.records]
    assert skipped == [False, True, False]
    assert scales == [1024.0, 512.0, 512.0]
    step1 = tw.records[1][1]
    assert bool(step1["clipped"]) and float(step1["clip_coef"]) == pytest.approx(1 / 3, rel=1e-5)
    assert step1["lr"] == 0.1


def test_step_hook_records_through_a_real_client():
    tw = trainwatch.Client("127.0.0.1:1", run="r", max_norm=1.0)
    model = nn.Linear(3, 3)
    opt = torch.optim.AdamW(model.parameters())
    hook = StepHook(tw, max_norm=1.0, optimizer=opt, model=model, layer_stats_every=1)
    model(torch.randn(4, 3)).sum().backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    hook.pre_step(0)
    opt.step()
    assert hook.post_step(0, norm, loss=torch.tensor(2.0), log_z=torch.tensor(1.0),
                          batch_ids=[1, 2])
    assert tw.stats.recorded == 1
    tw.close(timeout=0.1)


@pytest.mark.parametrize("make_opt", [
    lambda p: torch.optim.AdamW(p, lr=3e-2, betas=(0.9, 0.99), weight_decay=0.1),
    lambda p: torch.optim.Adam(p, lr=3e-2, betas=(0.9, 0.99), weight_decay=0.1),
    lambda p: torch.optim.SGD(p, lr=0.5, momentum=0.9),
], ids=["adamw-from-state", "adam-from-state", "sgd-snapshot"])
def test_layer_stats_update_rms_ratio_is_the_applied_update_over_the_weights(make_opt):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    opt = make_opt(model.parameters())
    stats = LayerStats(model, opt, every=1)
    for step in range(3):
        opt.zero_grad()
        model(torch.randn(8, 4)).pow(2).sum().backward()
        before = [p.detach().clone() for p in model[1].parameters()]
        stats.collect(step)
        opt.step()
        got = stats.update_ratios()
        after = list(model[1].parameters())
        du = sum(((a - b) ** 2).sum() for a, b in zip(after, before))
        w = sum((b ** 2).sum() for b in before)
        assert float(got["1"]) == pytest.approx(float(torch.sqrt(du / w)), rel=1e-4)
    assert stats.update_ratios() is None  # only right after a collect()


def test_step_hook_sends_four_layer_stats_every_step_or_three_to_an_older_binding():
    class ThreeOnly(FakeClient):
        def record(self, step, **fields):
            if any(len(v) != 3 for v in fields.get("layer_stats", {}).values()):
                raise ValueError("layer_stats must have 3 elements")
            return super().record(step, **fields)

    for tw, width in ((FakeClient(), 4), (ThreeOnly(), 3)):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 3))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        hook = StepHook(tw, max_norm=1.0, optimizer=opt, model=model, layer_stats_every=1)
        for step in range(3):
            opt.zero_grad()
            model(torch.randn(4, 3)).sum().backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            hook.pre_step(step)
            opt.step()
            assert hook.post_step(step, norm)
        assert len(tw.records) == 3
        sent = [f["layer_stats"]["0"] for _, f in tw.records]
        assert all(len(s) == width for s in sent)
        assert hook.last_layer_stats["0"].numel() == 4
        ratio = float(hook.last_layer_stats["0"][3])
        assert 0 < ratio < 1  # one AdamW step of lr 1e-2 moves a Linear by ~1e-2 of its RMS


class _TinyLm(nn.Module):
    """An embedding, a norm, a block and a head tied to the embedding."""

    def __init__(self, tied):
        super().__init__()
        self.tok = nn.Embedding(50, 8)
        self.pos = nn.Embedding(16, 8)
        self.ln = nn.LayerNorm(8)
        self.mlp = nn.Linear(8, 8)
        self.lm_head = nn.Linear(8, 50, bias=False)
        if tied:
            self.lm_head.weight = self.tok.weight


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_layer_stats_kinds_come_from_the_modules(tied):
    model = _TinyLm(tied)
    kinds = LayerStats(model, None, every=1).kinds(model)
    assert kinds["tok"] == "EMBEDDING" and kinds["pos"] == "EMBEDDING"
    assert kinds["ln"] == "NORM" and kinds["mlp"] == "DENSE"
    # Tied: the head's weight is the embedding's, listed once, under it.
    if tied:
        assert "lm_head" not in kinds
    else:
        assert kinds["lm_head"] == "OUTPUT"


def test_step_hook_tells_the_client_the_layer_kinds():
    class Recorder:
        def __init__(self):
            self.kinds = None

        def set_layer_kinds(self, kinds):
            self.kinds = kinds

    model = _TinyLm(tied=False)
    client = Recorder()
    StepHook(client, max_norm=1.0, optimizer=torch.optim.AdamW(model.parameters()),
             model=model, layer_stats_every=1)
    assert client.kinds["tok"] == "EMBEDDING" and client.kinds["lm_head"] == "OUTPUT"
