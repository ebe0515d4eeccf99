"""The binding and its Python layer (trainwatch.Client)."""

import math
import threading

import numpy as np
import pytest
import torch

import trainwatch

# A port nothing listens on: the client buffers and retries in the background.
NOWHERE = "127.0.0.1:1"


def steps_of(server, run):
    return server.ctl_json("steps", "--run", run)


@pytest.mark.parametrize("kwargs, message", [
    (dict(run=""), "run_id is empty"),
    (dict(run="bad run!"), "invalid character"),
    (dict(run="r", rank=2, world_size=2), "rank 2 is not below world_size 2"),
    (dict(run="r", max_norm=-1.0), "max_norm"),
    (dict(run="r", max_norm=float("nan")), "max_norm"),
    (dict(run="r", precision="fp8"), "precision"),
    (dict(run="r", rank=-1), "rank"),
    (dict(run="r", capacity=0), "capacity"),
    (dict(run="r", labels={"a": 1}), "labels"),
])
def test_client_validates_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        trainwatch.Client(NOWHERE, **kwargs)


def test_record_accepts_floats_numpy_and_cpu_tensors_and_flush_delivers(server):
    run = "py/types"
    with trainwatch.Client(server.address, run=run, max_norm=1.0) as tw:
        assert tw.record(0, 0.5, loss=2.0, lr=1e-3, batch_ids=[1, 2])
        assert tw.record(1, np.float32(2.0), loss=np.float64(1.5), skipped=np.bool_(False),
                         batch_ids=np.array([3, 4]))
        assert tw.record(2, torch.tensor(0.25), loss=torch.tensor(1.25, dtype=torch.bfloat16),
                         clipped=torch.tensor(False), clip_coef=torch.tensor(1.0),
                         log_z=torch.tensor([3.5]), batch_ids=torch.tensor([5, 6]))
        assert tw.record(np.int64(3), 7, max_attn_logit=12, shard_sq_sum=0.04,
                         layer_stats={"blocks.0.attn": (1.0, 0.1, 1.2),
                                      "head": {"grad_norm": 2.0, "grad_rms": 0.2,
                                               "g_over_sqrt_v_rms": 0.9},
                                      "emb": torch.tensor([3.0, 0.3, 1.1])})
        tw.flush(timeout=10)
        s = tw.stats
        assert (s.recorded, s.acked, s.dropped, s.pending) == (4, 4, 0, 0)
    got = {r["step"]: r for r in steps_of(server, run)}
    assert sorted(got) == [0, 1, 2, 3]
    assert got[0]["grad_norm"] == 0.5 and got[0]["batch_ids"] == [1, 2]
    assert got[1]["grad_norm"] == 2.0 and got[1]["batch_ids"] == [3, 4]
    assert got[1]["clipped"] is True  # derived from max_norm
    assert got[2]["grad_norm"] == 0.25 and got[2]["loss"] == 1.25
    assert got[2]["log_z"] == 3.5 and got[2]["batch_ids"] == [5, 6]
    assert got[3]["grad_norm"] == 7 and got[3]["max_attn_logit"] == 12
    layers = got[3]["layer_stats"]
    assert layers["blocks.0.attn"]["g_over_sqrt_v_rms"] == pytest.approx(1.2)
    assert layers["head"]["grad_norm"] == 2.0
    assert layers["emb"]["grad_rms"] == pytest.approx(0.3)
    assert "update_rms_ratio" not in layers["head"]


def test_record_takes_update_rms_ratio_and_fp8_stats(server):
    run = "py/fp8"
    fp8 = {"l0.fc1:input": {"format": "E4M3_FNUZ", "amax": np.float32(3.5), "scale": 64.0,
                            "amax_history_len": 16, "margin": 0, "overflow_fraction": 0.0,
                            "underflow_fraction": torch.tensor(0.25), "amax_group": "tp0"},
           "l0.fc1:grad_output": {"format": 2, "amax": 1e-3, "scale": 5.7e7}}
    with trainwatch.Client(server.address, run=run) as tw:
        assert tw.record(0, 0.5, layer_stats={"a": (1.0, 0.1, 1.2, 2e-3),
                                              "b": torch.tensor([1.0, 0.1, 1.1, 3e-3]),
                                              "c": {"grad_norm": 1.0, "update_rms_ratio": 4e-3}},
                         fp8=fp8)
        assert tw.record(1, 0.5, fp8=None)
        with pytest.raises(ValueError, match=r"fp8\['x'\].format must be one of"):
            tw.record(2, 0.5, fp8={"x": {"format": "E3M4", "amax": 1.0, "scale": 1.0}})
        with pytest.raises(ValueError, match="unknown keys"):
            tw.record(2, 0.5, fp8={"x": {"format": "E4M3", "amx": 1.0}})
        with pytest.raises(ValueError, match="3 or 4 elements"):
            tw.record(2, 0.5, layer_stats={"a": torch.tensor([1.0, 2.0])})
        tw.flush(timeout=10)
    got = {r["step"]: r for r in steps_of(server, run)}
    layers = got[0]["layer_stats"]
    assert layers["a"]["update_rms_ratio"] == pytest.approx(2e-3)
    assert layers["b"]["update_rms_ratio"] == pytest.approx(3e-3)
    assert layers["c"]["update_rms_ratio"] == pytest.approx(4e-3)
    f = got[0]["fp8"]["l0.fc1:input"]
    assert f["format"] == "E4M3_FNUZ" and f["amax"] == 3.5 and f["amax_history_len"] == 16
    assert f["underflow_fraction"] == 0.25 and f["amax_group"] == "tp0"
    g = got[0]["fp8"]["l0.fc1:grad_output"]
    assert g["format"] == "E5M2" and "overflow_fraction" not in g and g["amax_group"] == ""
    assert "fp8" not in got[1]


def test_non_finite_values_are_data(server):
    run = "py/nonfinite"
    with trainwatch.Client(server.address, run=run, precision="fp16", max_norm=1.0) as tw:
        assert tw.record(0, float("inf"), skipped=True, loss_scale=32768.0)
        assert tw.record(1, torch.tensor(float("nan")), loss=float("nan"), skipped=True)
        tw.flush(timeout=10)
    got = {r["step"]: r for r in steps_of(server, run)}
    assert got[0]["skipped"] is True and got[0]["loss_scale"] == 32768
    assert sorted(got) == [0, 1]


def test_record_rejects_what_is_not_a_number():
    with trainwatch.Client(NOWHERE, run="r") as tw:
        with pytest.raises(TypeError, match="grad_norm"):
            tw.record(0, "big")
        with pytest.raises(ValueError, match="step must be >= 0"):
            tw.record(-1, 1.0)
        with pytest.raises(ValueError, match="one element"):
            tw.record(0, torch.ones(3))
        with pytest.raises(ValueError, match="event kind"):
            tw.event("exploded", 0)
        tw.close(timeout=0.1)


def test_stats_count_recorded_and_dropped_without_a_server():
    tw = trainwatch.Client(NOWHERE, run="r", capacity=10)
    results = [tw.record(i, 1.0) for i in range(15)]
    assert results.count(True) == 10 and results.count(False) == 5
    s = tw.stats
    assert isinstance(s, trainwatch.Stats)
    assert (s.recorded, s.acked, s.dropped) == (10, 0, 5)
    assert s._asdict()["recorded"] == 10
    with pytest.raises(TimeoutError, match="flush timed out"):
        tw.flush(timeout=0.2)
    assert tw.close(timeout=0.1) is False  # not acknowledged, but no exception
    assert tw.close() is True  # idempotent
    assert tw.record(99, 1.0) is False  # closed


def test_fast_record_keeps_its_client_alive_and_checks_its_arguments():
    # record()'s C fast path is a builtin bound to the binding's client: it
    # holds a reference, so it works after the Python Client is gone.
    tw = trainwatch.Client(NOWHERE, run="r", capacity=10)
    fast = tw._record
    # One argument a StepRecord field (the binding's table), time included.
    n = len(trainwatch._trainwatch.STEP_FIELDS)
    with pytest.raises(TypeError, match=f"record takes {n} arguments"):
        fast(0, 1.0)
    c = tw._c
    del tw
    import gc
    gc.collect()
    # step, grad_norm, loss, loss_scale, skipped, the optional fields, time
    rest = [None, None, False] + [None] * (n - 6) + [0]
    assert fast(0, 1.0, *rest) == trainwatch._trainwatch.RECORDED
    assert fast(1, "x", *rest) == trainwatch._trainwatch.DEFERRED
    assert c.stats()[0] == 1  # recorded
    with pytest.raises(TimeoutError):  # nothing listens: not acknowledged
        c.close(0.1)


def test_flush_releases_the_gil():
    tw = trainwatch.Client(NOWHERE, run="r")
    tw.record(0, 1.0)
    ticks = []
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks.append(1)

    t = threading.Thread(target=spin)
    t.start()
    try:
        with pytest.raises(TimeoutError):
            tw.flush(timeout=0.5)
    finally:
        stop.set()
        t.join()
        tw.close(timeout=0.1)
    # A flush holding the GIL would leave the other thread a switch interval
    # or two; released, it spins for the whole half second.
    assert len(ticks) > 10000


def test_context_manager_closes_and_reports_a_failed_run(server):
    run = "py/ctx"
    with pytest.raises(RuntimeError, match="boom"):
        with trainwatch.Client(server.address, run=run) as tw:
            tw.record(0, 1.0)
            tw.record(1, 1.1)
            raise RuntimeError("boom")
    assert tw.closed
    assert tw.stats.acked == 2
    runs = {r["run_id"]: r for r in server.ctl_json("runs")}
    assert run in runs
    assert runs[run]["state"] == "failed"  # the block raised: run_failed sent


def test_events_and_recommended_max_norm(server):
    run = "py/events"
    tw = trainwatch.Client(server.address, run=run, max_norm=1.0)
    for i in range(10):
        tw.record(i, 0.5 + 0.01 * i)
    assert tw.event("checkpoint_saved", 9, "ckpt-9")
    assert tw.event("RUN_FINISHED", 9)
    tw.flush(timeout=10)
    rec = tw.recommended_max_norm
    assert rec is None or (isinstance(rec, float) and math.isfinite(rec))
    assert tw.close() is True
    runs = {r["run_id"]: r for r in server.ctl_json("runs")}
    assert runs[run]["state"] == "finished" and runs[run]["last_step"] == 9


def test_cpu_tensor_record_calls_no_cuda_function(monkeypatch):
    """The CPU path never touches torch.cuda (no device query, no sync)."""
    calls = []
    for name in ("synchronize", "is_available", "current_stream", "Event", "device_count",
                 "current_device"):
        if hasattr(torch.cuda, name):
            monkeypatch.setattr(torch.cuda, name,
                                lambda *a, _n=name, **k: calls.append(_n))
    with trainwatch.Client(NOWHERE, run="r") as tw:
        for i in range(5):
            assert tw.record(i, torch.tensor(0.5), loss=torch.tensor(2.0),
                             clipped=torch.tensor(True), batch_ids=torch.arange(4))
        assert tw.stats.recorded == 5 and tw.stats.pending == 0
        tw.close(timeout=0.1)
    assert calls == []


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device: the GPU no-sync test needs one "
                           "(Debian's python3-torch is CPU-only)")
def test_cuda_record_does_not_sync(monkeypatch, server):
    """record() with CUDA tensors: no .item(), .cpu(), .tolist() on a CUDA
    tensor and no synchronize; values arrive once the copies finish."""
    syncs = []
    real_item, real_cpu, real_tolist = torch.Tensor.item, torch.Tensor.cpu, torch.Tensor.tolist

    def guard(real, what):
        def f(self, *a, **k):
            if self.is_cuda:
                syncs.append(what)
            return real(self, *a, **k)
        return f

    monkeypatch.setattr(torch.Tensor, "item", guard(real_item, "item"))
    monkeypatch.setattr(torch.Tensor, "cpu", guard(real_cpu, "cpu"))
    monkeypatch.setattr(torch.Tensor, "tolist", guard(real_tolist, "tolist"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: syncs.append("synchronize"))
    run = "py/cuda"
    dev = torch.device("cuda")
    with trainwatch.Client(server.address, run=run, max_norm=1.0) as tw:
        # Keep the GPU busy so the copies are still in flight.
        a = torch.randn(4096, 4096, device=dev)
        for _ in range(20):
            a = a @ a / 64
        for i in range(8):
            norm = a.norm() * 0 + (i + 1)
            assert tw.record(i, norm, loss=norm * 2, clipped=norm > 1,
                             batch_ids=torch.arange(i, i + 2, device=dev),
                             layer_stats={"l": torch.stack([norm, norm, norm])})
        assert syncs == []
        tw.flush(timeout=30)  # waits for the events, no synchronize()
        assert syncs == []
        assert tw.stats.acked == 8 and tw.stats.pending == 0
    got = {r["step"]: r for r in steps_of(server, run)}
    assert [got[i]["grad_norm"] for i in range(8)] == [float(i + 1) for i in range(8)]
    assert got[3]["batch_ids"] == [3, 4] and got[3]["loss"] == 8.0
    assert got[3]["layer_stats"]["l"]["grad_rms"] == 4.0


def test_a_step_of_minus_one_is_refused_at_record_and_counted(server):
    run = "py/minus-one"
    with trainwatch.Client(server.address, run=run) as tw:
        assert tw.record(0, 0.5)
        assert not tw.record(2**64 - 1, 0.5)
        assert tw.record(1, 0.5)
        tw.flush(timeout=10)
        assert tw.stats.rejected == 1
        assert tw.stats.dropped == 0
    assert [r["step"] for r in steps_of(server, run)] == [0, 1]


def test_set_layer_kinds_sends_the_kind_with_each_layer_stat(server):
    run = "py/kinds"
    with trainwatch.Client(server.address, run=run) as tw:
        tw.set_layer_kinds({"emb": "EMBEDDING", "head": "output"})
        with pytest.raises(ValueError, match="unknown kind"):
            tw.set_layer_kinds({"x": "CONV"})
        assert tw.record(0, 0.5, layer_stats={"emb": (1.0, 0.1, 30.0), "head": (1.0, 0.1, 2.0),
                                              "blocks.0": (1.0, 0.1, 1.0)})
        tw.flush(timeout=10)
    layers = steps_of(server, run)[0]["layer_stats"]
    assert layers["emb"]["kind"] == "EMBEDDING"
    assert layers["head"]["kind"] == "OUTPUT"
    assert "kind" not in layers["blocks.0"]  # the server infers it from the name
