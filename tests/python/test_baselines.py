"""Reference runs through a real server (docs/baselines.md): tokens and
baselines from the Python client, `baseline set|show|clear`, BaselineDeviation
and `compare --json`."""

import math
import random

import pytest

import trainwatch


def send_run(server, run, seed, steps=800, factor=1.0, from_step=10**9,
             tokens_per_step=1024, baselines=None, warmup=50, lr=3e-4):
    """A synthetic run of one recipe: a power-law loss in tokens with 2%
    lognormal noise; `factor` times it from `from_step` on; a constant LR."""
    rng = random.Random(seed)
    offset = 0.003 * (seed % 3 - 1)
    with trainwatch.Client(server.address, run=run, warmup_steps=warmup,
                           baselines=baselines) as tw:
        for step in range(steps):
            tokens = (step + 1) * tokens_per_step
            loss = (2.0 + 3.0 * (1 + tokens / 20000) ** -0.5) * math.exp(
                offset + rng.gauss(0, 0.02))
            if step >= from_step:
                loss *= factor
            tw.record(step, grad_norm=0.5 * math.exp(rng.gauss(0, 0.05)), loss=loss,
                      tokens=tokens, lr=lr)
        tw.flush()


def two_seeds(server, recipe):
    """Seeds 1 and 2 of the recipe sent as `recipe`/s1 and /s2: the
    references of the runs that follow, as RunStart.baselines names them."""
    send_run(server, f"{recipe}/s1", seed=1)
    send_run(server, f"{recipe}/s2", seed=2)
    return [f"{recipe}/s1@0", f"{recipe}/s2@0"]


def fired(server, run, name="BaselineDeviation"):
    return [a for a in server.ctl_json("alerts", "--run", run) if a["alertname"] == name]


def test_tokens_and_baselines_reach_the_server(server):
    send_run(server, "ref/a", seed=1, steps=60)
    send_run(server, "run/b", seed=2, steps=60, baselines=["ref/a@0", ("ref/a", 0)])
    steps = server.ctl_json("steps", "--run", "run/b")
    assert [s["tokens"] for s in steps[:3]] == [1024, 2048, 3072]
    shown = server.ctl_json("baseline", "show", "--run", "run/b", "--json")
    assert shown["source"] == "run_start"
    assert [(b["run"], b["attempt"]) for b in shown["baselines"]] == [("ref/a", 0)] * 2


def test_baseline_set_show_clear(server):
    shown = server.ctl_json("baseline", "show", "--run", "x/new")
    assert shown == {"run": "x/new", "source": "none", "baselines": []}
    set_ = server.ctl_json("baseline", "set", "--run", "x/new", "--ref", "ref/a@2",
                           "--ref", "ref/b")
    assert set_["source"] == "set"
    assert [(b["run"], b["attempt"]) for b in set_["baselines"]] == [("ref/a", 2), ("ref/b", 0)]
    assert server.ctl_json("baseline", "show", "--run", "x/new") == set_
    cleared = server.ctl_json("baseline", "clear", "--run", "x/new")
    assert cleared["source"] == "none" and cleared["baselines"] == []
    with pytest.raises(AssertionError, match="bad run!"):
        server.ctl("baseline", "set", "--run", "x/new", "--ref", "bad run!")


def test_a_healthy_seed_raises_nothing_a_shifted_one_is_named_and_compared(server):
    refs = two_seeds(server, "recipe")
    send_run(server, "recipe/s3", seed=3, baselines=refs)
    assert fired(server, "recipe/s3") == []
    # From step 400 the loss is 10% above the recipe's.
    send_run(server, "recipe/bad", seed=4, factor=1.10, from_step=400, baselines=refs)
    alerts = fired(server, "recipe/bad")
    assert len(alerts) == 1, alerts
    a = alerts[0]
    assert 380 <= a["onset_step"] <= 420, a
    assert a["started_step"] - 400 <= 100, a
    assert "vs baseline" in a["description"] and "by tokens" in a["description"]
    assert a["severity"] == "critical"

    out = server.ctl_json("compare", "--run", "recipe/bad", "--json")
    assert out["axis"] == "tokens" and out["metric"] == "loss"
    assert out["refs"] == refs
    assert len(out["bins"]) == (800 - 50) // 20
    assert out["left_band"] is True
    assert 380 <= out["first_step_outside"] <= 420
    b = out["bins"][-1]
    assert b["outside"] and b["value"] > b["hi"] > b["ref_median"] > b["lo"]
    healthy = server.ctl_json("compare", "--run", "recipe/s3", "--ref", "recipe/s1@0",
                              "--ref", "recipe/s2@0", "--json")
    assert healthy["left_band"] is False and healthy["first_step_outside"] is None


def test_another_lr_whose_loss_moved_is_named_with_its_ratio(server):
    # 1.5% above the recipe is within what a seed may sit at; at ten times
    # the recipe's LR the run is not a seed of it, and it is named.
    refs = two_seeds(server, "lr")
    send_run(server, "lr/same", seed=4, factor=1.015, from_step=0, baselines=refs)
    assert fired(server, "lr/same") == []
    send_run(server, "lr/hot", seed=4, factor=1.015, from_step=0, baselines=refs, lr=3e-3)
    alerts = fired(server, "lr/hot")
    assert len(alerts) == 1, alerts
    assert "lr 10x the baseline's" in alerts[0]["description"], alerts[0]
    out = server.ctl_json("compare", "--run", "lr/hot", "--json")
    assert all(abs(b["lr_ratio"] - 10) < 1e-6 for b in out["bins"]), out["bins"][:2]
    same = server.ctl_json("compare", "--run", "lr/same", "--json")
    assert all(abs(b["lr_ratio"] - 1) < 1e-6 for b in same["bins"])
    table = server.ctl("compare", "--run", "lr/hot")
    assert " LR" in table.splitlines()[1] and "10x" in table.splitlines()[2], table


def test_another_batch_size_is_named_by_step_not_by_tokens(server):
    refs = two_seeds(server, "bs")
    send_run(server, "bs/big", seed=3, steps=400, tokens_per_step=2048, baselines=refs)
    assert fired(server, "bs/big") == []
    by_step = server.ctl_json("compare", "--run", "bs/big", "--axis", "step", "--json")
    assert by_step["left_band"] is True


def test_step_hook_fills_tokens_from_tokens_per_step():
    import trainwatch.torch as twt

    class Recorder:
        def __init__(self):
            self.tokens = []

        def record(self, step, **fields):
            self.tokens.append(fields.get("tokens"))
            return True

    client = Recorder()
    hook = twt.StepHook(client, max_norm=1.0, tokens_per_step=512)
    for step in range(10, 13):
        hook.post_step(step, grad_norm=0.5, loss=2.0)
    hook.tokens_per_step = 1024  # the batch doubled
    hook.post_step(13, grad_norm=0.5, loss=2.0)
    assert client.tokens == [11 * 512, 12 * 512, 13 * 512, 13 * 512 + 1024]
