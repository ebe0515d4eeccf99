"""End to end: client/examples/train_tiny_moe.py trains a tiny MoE language
model on CPU (real torch routing, trainwatch.torch.route_counts) against the
real server; a healthy run pages nothing, every step or every 25, and each
injected fault is named by its alert, the others it causes caused_by it."""

import subprocess
import sys

import pytest

import trainwatch
from conftest import REPO

EXAMPLE = REPO / "client" / "examples" / "train_tiny_moe.py"
PAGING = ("warning", "critical")
# The Moe rules judge nothing in the first 200 post-warmup steps (warmup 20).
SETTLED = 220


def train(server, run, *args):
    r = subprocess.run([sys.executable, str(EXAMPLE), "--server", server.address,
                        "--run", run, *args],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "dropped 0" in r.stdout, r.stdout
    return [a for a in server.ctl_json("alerts", "--run", run) if a["severity"] in PAGING]


@pytest.mark.parametrize("args", [(), ("--every", "25", "--steps", "800", "--seed", "1")])
def test_healthy_moe_runs_page_nothing(server, args):
    assert train(server, f"moe/healthy{len(args)}", *args) == []


@pytest.mark.parametrize("fault,alert", [
    ("collapse", "MoeRouterCollapse"),
    ("dead", "MoeDeadExpert"),
    ("drop", "MoeTokensDropped"),
    ("zgrowth", "MoeRouterZLossGrowth"),
    ("biasblind", "MoeExpertBiasDrift"),
])
def test_each_fault_names_its_alert(server, fault, alert):
    alerts = train(server, f"moe/{fault}", "--fault", fault)
    named = [a for a in alerts if a["alertname"] == alert]
    assert len(named) == 1, alerts
    assert SETTLED <= named[0]["started_step"] <= 400
    assert named[0]["caused_by"] in ("", None), named[0]
    # One page per cause: every other alert is this one's consequence. Under
    # the z-growth fault (no z-loss, the router's LR 30x) the LM loss itself
    # leaves its level for good: LossDivergence, critical, pages too, and
    # says the router is its cause.
    for a in alerts:
        if a is not named[0]:
            assert a["caused_by"] == alert, (a["alertname"], a["caused_by"], alerts)
    if fault == "collapse":
        assert named[0]["severity"] == "critical"
    if fault == "dead":
        assert "expert 5" in next(a for a in alerts if a["alertname"] == alert)["description"]


def test_moe_stats_come_back_as_sent(server):
    c = trainwatch.Client(server.address, "moe/wire", precision="fp32",
                          moe={"num_experts": 4, "top_k": 2, "balancing": "aux_free_bias"})
    import torch
    from trainwatch.torch import route_counts
    counts = route_counts(torch.tensor([[0, 1], [1, 3], [1, 0]]), 4)
    assert c.record(0, 0.5, moe=[{"layer": "blocks.0.moe", "tokens_per_expert": counts,
                                  "dropped": 2, "aux_loss": torch.tensor(1.01),
                                  "z_loss": 2.5, "expert_bias": torch.tensor([0.1, -0.1, 0.0, 0.0]),
                                  "router_logit_max": 7.0}])
    assert c.record(1, 0.5, moe={"3": {"tokens_per_expert": [1, 2, 3, 0]}})
    with pytest.raises(ValueError, match="unknown keys"):
        c.record(2, 0.5, moe=[{"tokens_per_expert": [1], "tokens": 3}])
    with pytest.raises(ValueError, match=">= 0"):
        c.record(2, 0.5, moe=[{"tokens_per_expert": [1, -1]}])
    with pytest.raises(ValueError, match="balancing"):
        trainwatch.Client(server.address, "moe/bad", moe={"balancing": "sometimes"})
    c.close()
    steps = server.ctl_json("steps", "--run", "moe/wire")
    layer = steps[0]["moe"]["layers"][0]
    assert layer["layer"] == "blocks.0.moe"
    assert layer["tokens_per_expert"] == [2, 3, 0, 1]
    assert layer["dropped"] == 2 and layer["z_loss"] == 2.5
    assert layer["aux_loss"] == pytest.approx(1.01)
    assert layer["expert_bias"] == pytest.approx([0.1, -0.1, 0.0, 0.0])
    assert steps[1]["moe"]["layers"][0] == {"layer": "3", "tokens_per_expert": [1, 2, 3, 0]}


def test_sparse_reports_name_a_collapse_and_its_consequences_carry_it(server):
    # Every 25 steps: the dead-expert rule (3 reports, 100 steps) names the
    # dead experts before the collapse's level (10 reports) is in; the
    # collapse's onset is its level's first report, so they become its
    # consequences all the same.
    alerts = train(server, "moe/sparse-collapse", "--fault", "collapse", "--every", "25",
                   "--steps", "800")
    by = {a["alertname"]: a for a in alerts}
    assert by["MoeRouterCollapse"]["severity"] == "critical", alerts
    assert by["MoeRouterCollapse"]["onset_step"] <= by["MoeDeadExpert"]["started_step"]
    for name, a in by.items():
        if name != "MoeRouterCollapse":
            assert a["caused_by"] == "MoeRouterCollapse", (name, alerts)
