"""The MoE lab's quick part in ctest (label `moe_lab`): real CPU MoE runs
(client/examples/train_tiny_moe.py, families of tools/lab/moe_lab.py,
shortened to 400 steps), labelled from their routing records by
tools/lab/moe_labeller.py and replayed through a real server.

What must hold (docs/lab.md, "MoE lab, held out by family"): a healthy
run carries no label and pages nobody; a collapse, drops and a z-loss rise
are labelled, and each is named by its alert inside the label's window.
About a minute on one core.
"""

import os
import pathlib
import sys

import torch  # noqa: F401  (the runs need it: fail here, loudly, without it)

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "tools" / "lab"))
import moe_lab  # noqa: E402
import moe_labeller  # noqa: E402

BUILD_DIR = pathlib.Path(os.environ.get("TRAINWATCH_BUILD_DIR", HERE.parent.parent / "build"))
STEPS = 400


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """{family: (label dict, [alert])} of four short runs, one server."""
    tmp = tmp_path_factory.mktemp("moe-lab")
    runs = tmp / "runs"
    runs.mkdir()
    fams = ("healthy-e8k2-l2", "collapse-init-e8k2", "drop-cap1-e8k2", "zgrowth-e8k2")
    for name in fams:
        moe_lab.train(runs, name, 0, STEPS)
    by_run = moe_lab.replay(BUILD_DIR, [(n, 0) for n in fams], runs, tmp)
    return {n: (moe_labeller.label_file(moe_lab.stem(runs, n, 0).with_suffix(".jsonl")),
                by_run.get(moe_lab.run_id(n, 0), [])) for n in fams}


def kinds(label):
    return {e["kind"] for e in label["events"]}


def test_healthy_run_has_no_label_and_pages_nobody(lab):
    label, alerts = lab["healthy-e8k2-l2"]
    assert label["steps"] == STEPS
    assert label["events"] == []
    pages = [a for a in alerts if moe_lab._is_page(a)]
    assert not pages, pages


@pytest.mark.parametrize("family,kind,alertname", [
    ("collapse-init-e8k2", "collapse", "MoeRouterCollapse"),
    ("drop-cap1-e8k2", "drops", "MoeTokensDropped"),
    ("zgrowth-e8k2", "z_growth", "MoeRouterZLossGrowth"),
])
def test_failure_is_labelled_and_named_by_its_alert(lab, family, kind, alertname):
    label, alerts = lab[family]
    assert kind in kinds(label), label
    fired = [a for a in alerts if a["alertname"] == alertname]
    assert fired, (label, alerts)
    named = [moe_lab.names_label(a, label["events"]) for a in fired]
    assert all(e is not None and e["kind"] == kind for e in named), (fired, label)


def test_z_growth_onset_is_where_the_router_lr_rises(lab):
    # zgrowth raises the router LR 30x at step 250: the labeller, which sees
    # only the z-loss, must put the rise's beginning there.
    label, _ = lab["zgrowth-e8k2"]
    onsets = [e["onset"] for e in label["events"] if e["kind"] == "z_growth"]
    assert onsets and 240 <= onsets[0] <= 280, label
