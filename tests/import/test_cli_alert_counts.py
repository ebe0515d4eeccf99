"""What a new user sees in the CLI for a run with two firing alerts:
`runs` counts them, `health` lists them as `alerts --active` does,
and before the baseline exists `health` says how far along it is instead of
"baseline median 0"."""

import json


def two_alert_run(path):
    lines = [json.dumps({"run_start": {"run_id": "two-alerts", "precision": "BF16",
                                       "max_norm": 1.0}})]
    for s in range(1, 301):
        # Clipped on every step from step 101 (ClipFractionHigh: a rise; the
        # norm's level 1.6x, not a drift) and an attention logit past the cap
        # of 100 (AttentionLogitGrowth); no RUN_FINISHED: both fire on.
        norm = (0.9 if s <= 100 else 1.5) + 0.01 * (s % 5)
        lines.append(json.dumps({"step": s, "grad_norm": norm, "loss": 3.0,
                                 "max_attn_logit": 120.0}))
    path.write_text("\n".join(lines) + "\n")


def test_runs_and_health_show_the_firing_alerts(server, tmp_path):
    log = tmp_path / "run.jsonl"
    two_alert_run(log)
    server.ctl("replay", str(log))
    firing = server.ctl_json("alerts", "--run", "two-alerts", "--active")
    names = sorted(a["alertname"] for a in firing)
    assert names == ["AttentionLogitGrowth", "ClipFractionHigh"], names

    runs = {r["run_id"]: r for r in server.ctl_json("runs")}
    assert runs["two-alerts"]["active_alerts"] == 2
    table = server.ctl("runs").splitlines()
    assert table[0].split()[-1] == "ALERTS"
    row = next(line.split() for line in table[1:] if line.startswith("two-alerts"))
    assert row[-1] == "2"

    health = server.ctl("health", "--run", "two-alerts")
    assert "active alerts  none" not in health
    section = health[health.index("active alerts"):]
    for name in names:
        assert name in section
    health_json = server.ctl_json("health", "--run", "two-alerts")
    assert sorted(a["alertname"] for a in health_json["active_alerts"]) == names

    # 300 post-warmup steps, W = 1000: no baseline yet.
    assert "baseline median 0" not in health
    assert "baseline median not yet: 300" in health
