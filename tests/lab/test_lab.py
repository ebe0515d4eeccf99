"""The lab's subset in ctest: real PyTorch runs (tools/lab/lab_lm.py), judged
against the labeller (tools/lab/labeller.py) through a real server.

What trainwatch must do on the lab (docs/lab.md, "Judged on the lab"):
a healthy run pages nobody, whatever its layers are called; a loss spike
that the labeller marks is named as a LossSpike within a few steps of its
onset; a slow divergence gets a critical alert within 100 steps of its
onset. About 3 minutes on one core.
"""

import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
LAB = HERE.parent.parent / "tools" / "lab"
sys.path.insert(0, str(LAB))
import bench_lab  # noqa: E402
import labeller  # noqa: E402

BUILD_DIR = pathlib.Path(os.environ.get("TRAINWATCH_BUILD_DIR", HERE.parent.parent / "build"))
MAX_DELAY = 5  # steps from the labelled onset to LossSpike's started_step
ENV = dict(os.environ, OPENBLAS_NUM_THREADS="1")


@pytest.fixture
def server(tmp_path):
    s = bench_lab.Server(BUILD_DIR / "bin", tmp_path)
    yield s
    s.stop()


def lab_lm(*args):
    r = subprocess.run([sys.executable, str(LAB / "lab_lm.py"), *map(str, args)],
                       capture_output=True, text=True, timeout=600, env=ENV)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def train(server, tmp_path, config, seed, steps=None):
    """A fit configuration, streamed live through the Python client."""
    run = bench_lab.run_id(config, seed)
    out = tmp_path / f"{config}-{seed}.jsonl"
    stdout = lab_lm("--config", config, "--seed", seed, "--run", run, "--server",
                    server.address, "--out", out, *(("--steps", steps) if steps else ()))
    assert "dropped 0" in stdout, stdout
    return run, labeller.label_file(out)


def train_and_replay(server, tmp_path, family, seed, steps=None):
    """A held-out family (tools/lab/lab_lm.py FAMILIES: written to JSONL
    only), replayed through the server with `trainwatchctl replay`."""
    run = f"lab/{family}/s{seed}"
    out = tmp_path / f"{family}-{seed}.jsonl"
    lab_lm("--config", family, "--seed", seed, "--run", run, "--out", out,
           *(("--steps", steps) if steps else ()))
    server.ctl("replay", str(out), "--run", run)
    return run, labeller.label_file(out)


def pages(alerts):
    return [a for a in alerts if bench_lab._is_page(a)]


def describe(alerts):
    return "; ".join(f"{a['alertname']}@{a['started_step']} ({a['severity']}): "
                     f"{a['description']}" for a in alerts)


def test_healthy_run_pages_nobody(server, tmp_path):
    run, lab = train(server, tmp_path, "healthy", 0, steps=600)
    assert not [e for e in lab["events"] if e["kind"] not in ("norm_spike", "hard_batch")], \
        lab["events"]
    got = pages(server.alerts(run))
    assert not got, "a healthy lab run paged: " + describe(got)


def test_healthy_hf_parameter_names_page_nobody(server, tmp_path):
    # HF parameter names (model.embed_tokens.weight, lm_head.weight,
    # model.layers.0.self_attn.q_proj.weight), no `kind` in the log: the
    # server must tell the embedding and the head from the dense layers by
    # name (a rare token's embedding row meets a stale v on every run).
    run, lab = train_and_replay(server, tmp_path, "healthy-hf", 0, steps=400)
    assert not [e for e in lab["events"] if e["kind"] not in ("norm_spike", "hard_batch")], \
        lab["events"]
    got = pages(server.alerts(run))
    assert not got, "a healthy HF-named lab run paged: " + describe(got)


def test_loss_spike_is_named_within_a_few_steps_of_its_onset(server, tmp_path):
    run, lab = train(server, tmp_path, "spike", 1, steps=420)
    # A labelled spike is >= 1.5x on >= 3 of 5 steps; this seed's 2-step
    # jump at ~301 (4.4x) is a hard_batch, as two hard batches in a row on a
    # healthy run must not page (docs/lab.md, "The lab's labels").
    spikes = [e for e in lab["events"] if e["kind"] == "spike"]
    assert len(spikes) >= 2, lab["events"]  # this seed spikes at 249, 367
    alerts = server.alerts(run)
    named = [a["started_step"] for a in alerts if a["alertname"] == "LossSpike"]
    missed = [e for e in spikes
              if not any(0 <= s - e["onset"] <= MAX_DELAY for s in named)]
    assert not missed, (f"LossSpike missed labelled spikes {missed}; "
                        f"LossSpike fired at {named}; all alerts: {describe(alerts)}")


def test_slow_divergence_gets_a_critical_alert(server, tmp_path):
    # Seed 1 (OpenBLAS's Haswell kernel, lab_lm.py): the level leaves its
    # best at ~208 and doubles at ~411, no single step a spike; seed 0's
    # attention logits blow up first (a divergence, not a slow one).
    run, lab = train_and_replay(server, tmp_path, "slowdiv-hf", 1)
    slow = [e for e in lab["events"] if e["kind"] == "slow_divergence"]
    assert slow, lab["events"]
    e = slow[0]
    alerts = server.alerts(run)
    # Within 100 steps of where the climb began, not of where it doubled
    # (a best set in the loss's steep early fall once put the 2x line at
    # 4.6x it: named at 491).
    lo, hi = e["onset"] - 10, e["onset"] + 100
    critical = [a for a in alerts if a["severity"] == "critical" and lo <= a["started_step"] <= hi]
    assert critical, (f"no critical alert in [{lo}, {hi}] for the slow divergence {e}; "
                      f"alerts: {describe(alerts)}")
