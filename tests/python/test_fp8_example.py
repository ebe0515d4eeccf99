"""End to end: client/examples/train_fp8.py trains a small model through
emulated FP8 linears (trainwatch.fp8, delayed scaling) against the real
server; a healthy run stays silent and each injected fault is named by its
alert within its budget (docs/fp8.md)."""

import subprocess
import sys
import urllib.request

import pytest

from conftest import REPO

EXAMPLE = REPO / "client" / "examples" / "train_fp8.py"
PAGING = ("warning", "critical")
EVERY = 10  # the example's --fp8-every


def train(server, run, *args):
    r = subprocess.run([sys.executable, str(EXAMPLE), "--server", server.address,
                        "--run", run, *args],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "dropped 0" in r.stdout, r.stdout
    return server.ctl_json("alerts", "--run", run)


def by_name(alerts):
    out = {}
    for a in alerts:
        out.setdefault(a["alertname"], []).append(a)
    return out


@pytest.mark.parametrize("args", [(), ("--tp", "2", "--seed", "1"), ("--steps", "1500", "--seed", "2")])
def test_healthy_fp8_runs_page_nothing(server, args):
    alerts = train(server, f"fp8/healthy{len(args)}", *args)
    assert [a for a in alerts if a["severity"] in PAGING] == [], alerts


def test_overflow_is_named_within_twenty_reports(server):
    alerts = by_name(train(server, "fp8/overflow", "--fault", "overflow", "--fault-at", "100"))
    over = alerts.get("Fp8Overflow")
    assert over and len(over) == 1, alerts
    assert 100 <= over[0]["started_step"] <= 100 + 20 * EVERY
    assert "fc1:input" in over[0]["description"]
    assert "Fp8ScaleMismatch" not in alerts and "Fp8AmaxDesync" not in alerts


def test_wrong_format_max_is_named_at_the_first_report(server):
    alerts = by_name(train(server, "fp8/mismatch", "--fault", "mismatch"))
    mm = alerts.get("Fp8ScaleMismatch")
    assert mm and mm[0]["severity"] == "critical", alerts
    # Step 0 casts with the recipe's initial scale (1): the first report
    # with a scale from an amax is the next one.
    assert mm[0]["started_step"] == EVERY
    assert "E4M3_FNUZ" in mm[0]["description"] and "448/240" in mm[0]["description"]
    for a in alerts.get("Fp8Overflow", []):
        assert a["caused_by"] == "Fp8ScaleMismatch"


def test_unsynchronised_amax_across_ranks_is_named_at_the_first_report(server):
    alerts = by_name(train(server, "fp8/desync", "--fault", "desync"))
    ds = alerts.get("Fp8AmaxDesync")
    assert ds and len(ds) == 1 and ds[0]["severity"] == "critical", alerts
    assert ds[0]["started_step"] == 0 and ds[0]["state"] == "firing"
    assert "amax_group tp0" in ds[0]["description"]


def test_growth_is_forecast_500_steps_before_the_underflow(server):
    run = "fp8/growth"
    alerts = by_name(train(server, run, "--fault", "growth", "--fault-at", "200",
                           "--steps", "1500"))
    growth, under = alerts.get("Fp8AmaxGrowth"), alerts.get("Fp8Underflow")
    assert growth and under, alerts
    assert under[0]["started_step"] >= growth[0]["started_step"] + 500
    assert under[0]["caused_by"] == "Fp8AmaxGrowth"
    # The stats come back as sent, and the worst tensor is exported.
    step = server.ctl_json("steps", "--run", run, "--from", "1400", "--to", "1400")[0]
    fc1 = step["fp8"]["fc1:input"]
    assert fc1["format"] == "E4M3" and fc1["amax_history_len"] == 16
    assert fc1["underflow_fraction"] > 0.1
    # Growing 1% a step, it casts 1% past 448 with a one-step-old scale: still
    # below 464, the first value that rounds past E4M3's max, so nothing
    # saturates.
    assert 448 < fc1["amax"] * fc1["scale"] < 464 and fc1["overflow_fraction"] == 0
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    line = next(l for l in text.splitlines()
                if l.startswith(f'trainwatch_fp8_underflow_fraction{{run="{run}"}}'))
    assert float(line.split()[-1]) > 0.1
