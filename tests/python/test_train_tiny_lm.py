"""End to end: the example trains a real (tiny) PyTorch LM against the real
server, a corrupted batch is injected, and the server raises GradNormSpike
naming that batch's ids."""

import re
import subprocess
import sys

from conftest import REPO, eventually

EXAMPLE = REPO / "client" / "examples" / "train_tiny_lm.py"


def test_corrupted_batch_raises_grad_norm_spike_with_its_batch_ids(server):
    run = "e2e/tiny-lm"
    # The spike detector trusts its EMA after 100 post-warmup steps.
    r = subprocess.run(
        [sys.executable, str(EXAMPLE), "--server", server.address, "--run", run,
         "--steps", "170", "--warmup-steps", "10", "--corrupt-batch-at", "150",
         "--checkpoint-every", "25", "--threads", "2"],
        capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"CORRUPTED step=150 batch_ids=([\d,]+)", r.stdout)
    assert m, r.stdout
    corrupted = [int(x) for x in m.group(1).split(",")]
    assert "acked 170, dropped 0" in r.stdout, r.stdout

    def spike_alerts():
        alerts = server.ctl_json("alerts", "--run", run)
        return alerts if any(a["alertname"] == "GradNormSpike" for a in alerts) else None

    # Alerts are evaluated as records arrive; allow for commit lag.
    alerts = eventually(spike_alerts, what="a GradNormSpike alert")
    spikes = [a for a in alerts if a["alertname"] == "GradNormSpike"]
    assert len(spikes) == 1, alerts
    assert spikes[0]["started_step"] == 150
    assert spikes[0]["batch_ids"] == corrupted

    listed = server.ctl_json("spikes", "--run", run)
    assert [s["step"] for s in listed] == [150]
    assert listed[0]["skip_batch_ids"] == corrupted
    # The restart plan points at the last checkpoint >= 100 steps before.
    assert listed[0]["restart_from_step"] == 50

    runs = {x["run_id"]: x for x in server.ctl_json("runs")}
    assert runs[run]["state"] == "finished" and runs[run]["steps"] == 170
    step = server.ctl_json("steps", "--run", run, "--from", "100", "--to", "100")[0]
    assert step["batch_ids"] == list(range(800, 808))
    assert step["max_attn_logit"] > 0 and step["log_z"] > 0 and step["lr"] > 0
    assert len(step["layer_stats"]) >= 10  # every 50 steps, by module name


def test_auto_restart_follows_the_plan_and_the_spike_is_recovered(server):
    """The restart loop on a real PyTorch run: a corrupted batch at step 150
    spikes; attempt 0 stops at 160, asks for the plan, reloads the step-50
    checkpoint (the last one >= 100 steps before the spike), skips the
    batch's ids and finishes as attempt 1; the server sees the replay skip
    them without a new spike and marks the spike recovered."""
    run = "e2e/tiny-lm-restart"
    r = subprocess.run(
        [sys.executable, str(EXAMPLE), "--server", server.address, "--run", run,
         "--steps", "220", "--warmup-steps", "10", "--corrupt-batch-at", "150",
         "--checkpoint-every", "25", "--threads", "2", "--auto-restart"],
        capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"CORRUPTED step=150 batch_ids=([\d,]+)", r.stdout)
    assert m, r.stdout
    corrupted = [int(x) for x in m.group(1).split(",")]
    assert r.stdout.count("CORRUPTED") == 1, r.stdout  # not replayed
    plan = re.search(r"PLAN spike_step=150 checkpoint=ckpt-50 restart_from_step=50 "
                     r"skip=([\d,]+)", r.stdout)
    assert plan, r.stdout
    assert [int(x) for x in plan.group(1).split(",")] == corrupted
    assert "OUTCOME recovered batches_skipped=True" in r.stdout, r.stdout

    spikes = server.ctl_json("spikes", "--run", run)
    assert [(s["step"], s["outcome"], s["batches_skipped"]) for s in spikes] == [
        (150, "recovered", True)], spikes
    assert "recovered (batches skipped)" in server.ctl("spikes", "--run", run)
    plan = server.ctl_json("plan", "--run", run)
    assert plan["outcome"] == "recovered" and plan["skip_batch_ids"] == corrupted
    runs = {x["run_id"]: x for x in server.ctl_json("runs")}
    assert runs[run]["state"] == "finished" and runs[run]["attempt"] == 1
    # Healthy at the end: the spike's alert resolved by the recovery, and
    # nothing started in attempt 1 (steps 51..219 after attempt 0's 160).
    health = server.ctl_json("health", "--run", run)
    assert "GradNormSpike" not in [a["alertname"] for a in health["active_alerts"]]
    assert health["goodput"]["rewound_steps"] == 110  # 51..160 redone
    alerts = server.ctl_json("alerts", "--run", run)
    spike_alerts = [a for a in alerts if a["alertname"] == "GradNormSpike"]
    assert [(a["started_step"], a["state"]) for a in spike_alerts] == [
        (150, "resolved")], alerts
    assert all(a["started_unix_nanos"] < spike_alerts[0]["resolved_unix_nanos"]
               for a in alerts), alerts
    # Attempt 1 trained on other batches from step 150 on.
    step = server.ctl_json("steps", "--run", run, "--from", "150", "--to", "150")
    replayed = [s for s in step if s["attempt"] == 1]
    assert replayed and not set(replayed[0]["batch_ids"]) & set(corrupted)
