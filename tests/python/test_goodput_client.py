"""The client side of goodput and the restart loop: step times, input-pipeline
waits and the host reach the server; restart_plan and SkipBatches."""

import time

import pytest
import torch

import trainwatch
from trainwatch.torch import StepHook


def test_step_time_data_wait_and_host_reach_the_server(server):
    run = "py/step-times"
    with trainwatch.Client(server.address, run=run) as tw:
        hook = StepHook(tw, max_norm=1.0)

        def slow_loader():
            for i in range(4):
                time.sleep(0.05)  # the input pipeline keeps the step waiting
                yield i

        for step, batch in enumerate(hook.timed(slow_loader())):
            time.sleep(0.02)  # compute
            hook.post_step(step, 0.5, batch_ids=[batch])
        # data_ready(): the time since the previous post_step is the wait.
        time.sleep(0.05)
        hook.data_ready()
        hook.post_step(4, 0.5)
        # An explicit value wins over the measured one.
        tw.record(5, 0.5, step_time_s=7.5, data_wait_s=0.25)
        tw.flush(timeout=10)
    got = {r["step"]: r for r in server.ctl_json("steps", "--run", run)}
    assert sorted(got) == [0, 1, 2, 3, 4, 5]
    assert "step_time_s" not in got[0]  # nothing before the first step
    for s in (1, 2, 3):
        assert got[s]["data_wait_s"] >= 0.045, got[s]
        assert got[s]["step_time_s"] >= got[s]["data_wait_s"] + 0.015, got[s]
        assert got[s]["data_wait_s"] < got[s]["step_time_s"]
    assert got[0]["data_wait_s"] >= 0.045
    assert 0.045 <= got[4]["data_wait_s"] < got[4]["step_time_s"]
    assert (got[5]["step_time_s"], got[5]["data_wait_s"]) == (7.5, 0.25)


def test_host_argument_is_validated_and_accepted(server):
    # The host is not in `steps`: the C++ client test checks the RunStart.
    with pytest.raises(ValueError, match="host"):
        trainwatch.Client(server.address, run="py/host", host=7)
    with trainwatch.Client(server.address, run="py/host", host="gpu-node-9") as tw:
        assert tw.record(0, 1.0)
        tw.flush(timeout=10)


def test_restart_plan_of_a_run_without_spikes_is_none(server):
    run = "py/no-spike"
    with trainwatch.Client(server.address, run=run) as tw:
        tw.record(0, 1.0)
        tw.flush(timeout=10)
    assert trainwatch.restart_plan(server.address, run) is None
    with pytest.raises(FileNotFoundError):
        trainwatch.restart_plan(server.address, "py/never-seen")


def test_skip_batches_drops_listed_ids_from_samplers_and_loaders():
    sampler = trainwatch.SkipBatches(range(10), [3, 7])
    assert list(sampler) == [0, 1, 2, 4, 5, 6, 8, 9]
    assert sampler.skipped == 2 and sampler.dropped_ids == [3, 7]

    batch_sampler = trainwatch.SkipBatches([[0, 1], [2, 3], [4, 5]], [3])
    assert list(batch_sampler) == [[0, 1], [4, 5]]

    # A loader yielding (inputs, ids): the ids are the last element; token
    # values in the inputs that equal a skipped id do not matter.
    loader = [(torch.tensor([[3, 3]]), torch.tensor([10, 11])),
              (torch.tensor([[3, 3]]), torch.tensor([12, 13]))]
    kept = list(trainwatch.SkipBatches(loader, [12]))
    assert len(kept) == 1 and kept[0][1].tolist() == [10, 11]

    # A key for anything else.
    dicts = [{"ids": [1]}, {"ids": [2]}]
    assert list(trainwatch.SkipBatches(dicts, [1], key=lambda b: b["ids"])) == [{"ids": [2]}]
    assert len(trainwatch.SkipBatches(range(4), [])) == 4
