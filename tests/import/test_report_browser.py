"""trainwatchctl report, opened in a real browser.

A scenario run with alerts and a spike is replayed through the real server;
the report is written and opened in Debian's headless Chromium. From the DOM
after the page's script ran: every chart drew (data-drawn, data-points equal
to the series' point counts) and the alert spans are there. The screenshot is
kept in BUILD_DIR/test-artifacts/report.png.
"""

import html.parser
import json
import math
import random
import shutil
import subprocess

import pytest

from conftest import BIN_DIR, BUILD_DIR

STEPS = 1500


def chromium():
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("chromium not found: install Debian's chromium (deploy/install.sh)")


def scenario(path):
    """An fp16 run: a gradient spike with a loss spike at 900, clipping on
    most steps from 1000, the attention logit passing 100 near 1300, a few
    overflow skips, checkpoints every 200 steps."""
    rnd = random.Random(7)
    lines = [json.dumps({"run_start": {"run_id": "report-demo", "precision": "FP16",
                                       "max_norm": 1.0, "warmup_steps": 50,
                                       "labels": {"model": "tiny"}}})]
    scale = 65536.0
    for s in range(1, STEPS + 1):
        norm = math.exp(rnd.gauss(math.log(0.5), 0.12))
        if s >= 1000:
            norm *= 3.0
        loss = 4.0 * math.exp(-s / 2000) + rnd.gauss(0, 0.01)
        skipped = s in (300, 301, 700)
        if s == 900:
            norm = 40.0
        if 900 <= s < 906:
            loss *= 3.0
        if skipped:
            scale /= 2
            norm = float("inf")
        rec = {"step": s, "grad_norm": norm if math.isfinite(norm) else "Infinity",
               "loss": loss, "lr": 3e-4 * min(1.0, s / 50), "loss_scale": scale,
               "skipped": skipped, "max_attn_logit": 20 + 80 * (s / 1300) ** 3,
               "log_z": 4.0 + 0.001 * s, "batch_ids": [2 * s, 2 * s + 1]}
        lines.append(json.dumps(rec))
        if s % 200 == 0:
            lines.append(json.dumps({"event": {"step": s, "kind": "CHECKPOINT_SAVED",
                                               "detail": f"ckpt-{s}"}}))
    lines.append(json.dumps({"event": {"step": STEPS, "kind": "RUN_FINISHED"}}))
    path.write_text("\n".join(lines) + "\n")


FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--no-first-run", "--virtual-time-budget=10000"]


def dump_dom(page):
    """The page's DOM after its script ran, in headless Chromium."""
    dom = subprocess.run([chromium(), *FLAGS, "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr
    return dom


def screenshot(page, name, height):
    """A 1200 px wide screenshot of the page into BUILD_DIR/test-artifacts."""
    artifacts = BUILD_DIR / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    png = artifacts / name
    if png.exists():
        png.unlink()
    shot = subprocess.run([chromium(), *FLAGS, "--hide-scrollbars", f"--window-size=1200,{height}",
                           f"--screenshot={png}", page.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert shot.returncode == 0, shot.stderr
    assert png.exists() and png.stat().st_size > 20_000
    return png


class ChartParser(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.charts = {}
        self.spans = []
        self.body = {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.body = a
        if tag == "div" and "chart" in a.get("class", "").split():
            self.charts[a.get("data-chart")] = a
        if tag == "rect" and "alert-span" in a.get("class", ""):
            self.spans.append(a.get("data-alert"))


def test_report_draws_every_chart_in_chromium(server, tmp_path):
    log = tmp_path / "run.jsonl"
    scenario(log)
    server.ctl("replay", str(log))
    names = {a["alertname"] for a in server.ctl_json("alerts", "--run", "report-demo")}
    assert {"ClipFractionHigh", "AttentionLogitGrowth", "GradNormSpike"} <= names, names

    page = tmp_path / "report.html"
    out = server.ctl("report", "--run", "report-demo", "--out", str(page))
    assert "wrote" in out
    text = page.read_text()
    assert "Verdict" in text

    dom = dump_dom(page)
    parser = ChartParser()
    parser.feed(dom.stdout)

    expected = {"grad_norm": STEPS, "clip_fraction": STEPS - 50, "loss_scale": STEPS,
                "max_attn_logit": STEPS, "log_z": STEPS, "loss": STEPS, "lr": STEPS}
    assert set(parser.charts) == set(expected)
    assert parser.body.get("data-charts-drawn") == str(len(expected))
    for chart, points in expected.items():
        attrs = parser.charts[chart]
        assert attrs.get("data-drawn") == "1", chart
        # Finite points: the three skipped steps have no finite norm.
        want = points - 3 if chart == "grad_norm" else points
        assert int(attrs.get("data-points")) == want, (chart, attrs)
    assert "ClipFractionHigh" in parser.spans
    assert "AttentionLogitGrowth" in parser.spans
    assert int(parser.charts["clip_fraction"]["data-alert-spans"]) >= 1
    # The spike's restart plan and its batch ids are in the page.
    assert "1800, 1801" in dom.stdout
    assert "ckpt-800" in dom.stdout

    png = screenshot(page, "report.png", 2600)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


FP8_STEPS = 1500


def fp8_scenario(path):
    """An FP8 run as a step log: four tensors under delayed scaling
    (trainwatch.fp8.DelayedScaling, every step), reported every 10 steps;
    from step 300 an outlier feature of fc1's input grows 1% a step, so its
    amax runs away and, hundreds of steps later, its bulk underflows."""
    import numpy as np
    from trainwatch import fp8
    rng = np.random.default_rng(5)
    recipes = {n: fp8.DelayedScaling("E4M3", amax_history_len=16)
               for n in ("fc1:input", "fc1:weight", "fc2:input", "fc2:weight")}
    lines = [json.dumps({"run_start": {"run_id": "report-fp8", "precision": "BF16",
                                       "max_norm": 1.0}})]
    for s in range(FP8_STEPS):
        stats = {}
        for name, recipe in recipes.items():
            x = rng.standard_normal(2048).astype(np.float32) * (0.05 if "weight" in name else 1.0)
            if name == "fc1:input" and s >= 300:
                x[:32] = 4.0 * 1.01 ** (s - 300)
            _, stats[name] = recipe.quantize(x)
        rec = {"step": s, "grad_norm": 0.5 + 0.05 * rng.standard_normal(), "loss": 2.0}
        if s % 10 == 0:
            rec["fp8"] = stats
        lines.append(json.dumps(rec))
    path.write_text("\n".join(lines) + "\n")


def test_fp8_report_draws_the_scaling_charts_in_chromium(server, tmp_path):
    log = tmp_path / "fp8.jsonl"
    fp8_scenario(log)
    server.ctl("replay", str(log))
    alerts = {a["alertname"]: a for a in server.ctl_json("alerts", "--run", "report-fp8")}
    assert {"Fp8AmaxGrowth", "Fp8Underflow"} <= set(alerts), alerts
    assert alerts["Fp8Underflow"]["started_step"] >= alerts["Fp8AmaxGrowth"]["started_step"] + 500

    page = tmp_path / "report-fp8.html"
    server.ctl("report", "--run", "report-fp8", "--out", str(page))
    dom = dump_dom(page)
    parser = ChartParser()
    parser.feed(dom.stdout)
    reports = FP8_STEPS // 10
    for chart, points in (("fp8_scaled", 4 * reports), ("fp8_shares", 2 * reports)):
        attrs = parser.charts[chart]
        assert attrs.get("data-drawn") == "1", chart
        assert int(attrs.get("data-points")) == points, (chart, attrs)
    assert "Fp8AmaxGrowth" in parser.spans and "Fp8Underflow" in parser.spans
    assert "fc1:input" in dom.stdout

    screenshot(page, "report-fp8.png", 2450)


def baseline_run(path, run, seed, shift_from=None, baselines=None, steps=800):
    """A power-law loss in tokens with 2% lognormal noise, seeded; 1.15x from
    `shift_from` on."""
    rnd = random.Random(seed)
    start = {"run_id": run, "precision": "BF16", "max_norm": 1.0, "warmup_steps": 50}
    if baselines:
        start["baselines"] = [{"run": r, "attempt": 0} for r in baselines]
    lines = [json.dumps({"run_start": start})]
    for s in range(steps):
        tokens = (s + 1) * 4096
        loss = 8.0 * tokens ** -0.12 * math.exp(rnd.gauss(0, 0.02))
        if shift_from is not None and s >= shift_from:
            loss *= 1.15
        lines.append(json.dumps({"step": s, "grad_norm": math.exp(rnd.gauss(math.log(0.5), 0.1)),
                                 "loss": loss, "tokens": tokens}))
    path.write_text("\n".join(lines) + "\n")


def test_report_draws_the_baseline_band_under_the_loss_in_chromium(server, tmp_path):
    for seed in (1, 2):
        log = tmp_path / f"ref{seed}.jsonl"
        baseline_run(log, f"recipe/s{seed}", seed)
        server.ctl("replay", str(log))
    log = tmp_path / "shifted.jsonl"
    baseline_run(log, "recipe/shifted", 3, shift_from=500,
                 baselines=["recipe/s1", "recipe/s2"])
    server.ctl("replay", str(log))
    alerts = [a for a in server.ctl_json("alerts", "--run", "recipe/shifted")
              if a["alertname"] == "BaselineDeviation"]
    assert alerts and alerts[0]["severity"] in ("warning", "critical"), alerts
    assert 490 <= alerts[0]["onset_step"] <= 560, alerts  # the bin of 490-509 holds 500

    page = tmp_path / "report-baseline.html"
    server.ctl("report", "--run", "recipe/shifted", "--out", str(page))
    dom = dump_dom(page)
    parser = ChartParser()
    parser.feed(dom.stdout)
    loss = parser.charts["loss"]
    assert loss.get("data-drawn") == "1"
    # A bin every 20 post-warmup steps: (800 - 50) / 20 of them.
    assert int(loss.get("data-ref-bins", "0")) == (800 - 50) // 20, loss
    assert "Loss, over the band of recipe/s1@0, recipe/s2@0 (by tokens)" in dom.stdout
    assert "BaselineDeviation" in parser.spans
    screenshot(page, "report-baseline.png", 1400)

    # A run without baselines gets no band, and the report still writes.
    page2 = tmp_path / "report-plain.html"
    server.ctl("report", "--run", "recipe/s1", "--out", str(page2))
    plain = ChartParser()
    plain.feed(dump_dom(page2).stdout)
    assert plain.charts["loss"].get("data-drawn") == "1"
    assert "data-ref-bins" not in plain.charts["loss"]
