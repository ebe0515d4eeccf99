"""The lab's subset in ctest: a real PyTorch run per case, streamed through
the Python client into a real server, judged against the labeller.

What trainwatch must do on the lab (docs/detectors.md, "Judged on the lab"):
a healthy run pages nobody, and a loss spike that the labeller marks is
named as a LossSpike within a few steps of its onset.
"""

import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_lab  # noqa: E402
import labeller  # noqa: E402

BUILD_DIR = pathlib.Path(os.environ.get("TRAINWATCH_BUILD_DIR", HERE.parent.parent / "build"))
MAX_DELAY = 5  # steps from the labelled onset to LossSpike's started_step


@pytest.fixture
def server(tmp_path):
    s = bench_lab.Server(BUILD_DIR / "bin", tmp_path)
    yield s
    s.stop()


def train(server, tmp_path, config, seed, steps=None):
    run = bench_lab.run_id(config, seed)
    out = tmp_path / f"{config}-{seed}.jsonl"
    cmd = [sys.executable, str(HERE / "lab_lm.py"), "--config", config, "--seed", str(seed),
           "--run", run, "--server", server.address, "--out", str(out)]
    if steps:
        cmd += ["--steps", str(steps)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "dropped 0" in r.stdout, r.stdout
    return run, labeller.label_file(out)


def pages(alerts):
    return [a for a in alerts if bench_lab._is_page(a)]


def describe(alerts):
    return "; ".join(f"{a['alertname']}@{a['started_step']} ({a['severity']}): "
                     f"{a['description']}" for a in alerts)


def test_healthy_run_pages_nobody(server, tmp_path):
    run, lab = train(server, tmp_path, "healthy", 0, steps=800)
    assert not [e for e in lab["events"] if e["kind"] != "norm_spike"], lab["events"]
    got = pages(server.alerts(run))
    assert not got, "a healthy lab run paged: " + describe(got)


def test_loss_spike_is_named_within_a_few_steps_of_its_onset(server, tmp_path):
    run, lab = train(server, tmp_path, "spike", 1, steps=420)
    # LossSpike needs 3 high steps in a row (stay_steps): a spike the
    # labeller ends within 3 steps (this seed's at ~301, 4.4x for 2 steps)
    # is left to GradNormSpike and SpikeHazard, as two hard batches in a row
    # on a healthy run must not page (docs/detectors.md, "Judged on the lab").
    spikes = [e for e in lab["events"] if e["kind"] == "spike" and e["end"] - e["onset"] >= 3]
    assert len(spikes) >= 2, lab["events"]  # this seed spikes at ~249, ~367
    alerts = server.alerts(run)
    named = [a["started_step"] for a in alerts if a["alertname"] == "LossSpike"]
    missed = [e for e in spikes
              if not any(0 <= s - e["onset"] <= MAX_DELAY for s in named)]
    assert not missed, (f"LossSpike missed labelled spikes {missed}; "
                        f"LossSpike fired at {named}; all alerts: {describe(alerts)}")
