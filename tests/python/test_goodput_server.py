"""Goodput, stragglers and lemon hosts through the real server: trainwatchctl
replay of step logs and the Python client, checked with trainwatchctl and
/metrics."""

import json
import re
import urllib.request

import trainwatch
from conftest import Server, eventually

SEC = 10**9
T0 = 1_767_225_600 * SEC


def write_log(path, start, steps):
    with open(path, "w") as f:
        f.write(json.dumps({"run_start": start}) + "\n")
        for s in steps:
            f.write(json.dumps(s) + "\n")


def alerts_once(fn, ok, what):
    """fn()'s alerts once ok(them) holds: they are raised as the records
    arrive, before the ack, and stored just after (eventually())."""
    return eventually(lambda: (lambda a: a if ok(a) else None)(fn()), what=what)


def metrics(server):
    return urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()


def test_goodput_counts_skips_and_a_rewind_to_the_step(server, tmp_path):
    run = "goodput/rewind"
    start = {"run_id": run, "precision": "BF16", "max_norm": 1.0}
    # Attempt 0: steps 1..300, 1 s each; steps 50, 51 and 120 skipped.
    a0 = [{"step": s, "grad_norm": 0.5, "skipped": s in (50, 51, 120),
           "step_time_s": 1.0, "time_unix_nanos": T0 + s * SEC,
           "batch_ids": [s]} for s in range(1, 301)]
    # The job dies; 600 s later attempt 1 resumes from the checkpoint at 200:
    # steps 201..300 are redone; step 350 is skipped.
    t1 = T0 + 300 * SEC + 600 * SEC
    a1 = [{"step": s, "grad_norm": 0.5, "skipped": s == 350,
           "time_unix_nanos": t1 + (s - 201) * SEC, "batch_ids": [s]}
          for s in range(201, 401)]
    for s in a1[1:]:
        s["step_time_s"] = 1.0
    write_log(tmp_path / "a0.jsonl", dict(start, attempt=0), a0)
    write_log(tmp_path / "a1.jsonl", dict(start, attempt=1), a1)
    server.ctl("replay", str(tmp_path / "a0.jsonl"))
    server.ctl("replay", str(tmp_path / "a1.jsonl"))
    health = server.ctl_json("health", "--run", run)
    g = health["goodput"]
    assert g["skipped_steps"] == 4, g
    assert g["rewound_steps"] == 100, g
    assert g["productive_steps"] == 500 - 104, g
    assert abs(g["silent_seconds"] - 599) < 1e-6, g
    assert abs(g["wall_seconds"] - (299 + 600 + 199)) < 1e-6, g
    assert abs(g["ratio"] - (1098 - 4 - 100 - 599) / 1098) < 1e-6, g
    text = metrics(server)
    assert f'trainwatch_lost_steps_total{{cause="rewound",run="{run}"}} 100' in text
    assert f'trainwatch_lost_steps_total{{cause="skipped",run="{run}"}} 4' in text
    m = re.search(rf'trainwatch_goodput_ratio{{run="{run}"}} (\S+)', text)
    assert m and abs(float(m.group(1)) - g["ratio"]) < 1e-9, text
    out = server.ctl("health", "--run", run)
    assert "goodput        36.0% of 1098 s wall time; lost: 4 skipped steps" in out, out


def test_straggler_named_with_its_host_and_no_per_rank_series(server):
    run = "goodput/straggler"
    clients = [trainwatch.Client(server.address, run=run, rank=r, world_size=8,
                                 host=f"node-{r // 4}") for r in range(8)]
    import random
    rng = random.Random(7)
    for step in range(400):
        for r, tw in enumerate(clients):
            t = 0.5 * rng.uniform(0.9, 1.1) * (1.3 if r == 6 and step >= 200 else 1.0)
            tw.record(step, 0.5, step_time_s=t, data_wait_s=0.01 * t)
    for tw in clients:
        tw.close(timeout=20)
    alerts = alerts_once(lambda: server.ctl_json("alerts", "--run", run),
                         lambda a: any(x["alertname"] == "RankStraggler" for x in a),
                         "a RankStraggler alert")
    stragglers = [a for a in alerts if a["alertname"] == "RankStraggler"]
    assert len(stragglers) == 1, alerts
    a = stragglers[0]
    assert a["rank"] == 6 and a["host"] == "node-1", a
    assert 200 <= a["started_step"] <= 300, a
    assert "rank 6 on host node-1" in a["description"] and "loses" in a["description"], a
    assert [x for x in alerts if x["alertname"] != "RankStraggler"] == [], alerts
    health = server.ctl_json("health", "--run", run)
    assert health["slowest_ranks"][0]["rank"] == 6
    assert health["slowest_ranks"][0]["host"] == "node-1"
    assert 1.2 < health["slowest_ranks"][0]["ratio_to_median"] < 1.4
    assert 0.15 < health["window"]["straggler_lost_fraction"] < 0.3
    text = metrics(server)
    assert f'trainwatch_step_seconds{{run="{run}",stat="median"}}' in text
    assert f'trainwatch_straggler_lost_fraction{{run="{run}"}}' in text
    assert not re.search(r'^trainwatch_\w+\{[^}]*rank=', text, re.M)


def nonfinite_run(server, tmp_path, run, host):
    start = {"run_id": run, "precision": "BF16", "max_norm": 1.0, "host": host}
    steps = [{"step": s, "grad_norm": "NaN" if s == 20 else 0.5,
              "time_unix_nanos": T0 + s * SEC} for s in range(1, 40)]
    path = tmp_path / f"{run.replace('/', '_')}.jsonl"
    write_log(path, start, steps)
    server.ctl("replay", str(path))


def test_host_suspect_from_two_runs_remembered_across_a_restart(tmp_path):
    server = Server(tmp_path)
    try:
        nonfinite_run(server, tmp_path, "lemon/run-a", "gpu-node-13")
        alerts = alerts_once(lambda: server.ctl_json("alerts", "--run", "lemon/run-a"),
                             lambda a: len(a) > 0, "run-a's alert")
        assert [(a["alertname"], a["host"]) for a in alerts] == [
            ("NonFiniteUpdate", "gpu-node-13")], alerts
        assert ('trainwatch_host_incidents_total{alertname="NonFiniteUpdate",'
                'host="gpu-node-13"} 1') in metrics(server)
    finally:
        server.stop()
    # A restart: the incident of run-a is read back from the database.
    server = Server(tmp_path)
    try:
        nonfinite_run(server, tmp_path, "lemon/run-b", "gpu-node-13")
        nonfinite_run(server, tmp_path, "lemon/run-c", "gpu-node-99")
        alerts = alerts_once(lambda: server.ctl_json("alerts"),
                             lambda a: any(x["alertname"] == "HostSuspect" for x in a),
                             "a HostSuspect alert")
        suspects = [a for a in alerts if a["alertname"] == "HostSuspect"]
        assert len(suspects) == 1, alerts
        s = suspects[0]
        assert s["host"] == "gpu-node-13" and s["run"] == "lemon/run-b", s
        assert "lemon/run-a, lemon/run-b" in s["description"], s
    finally:
        server.stop()
