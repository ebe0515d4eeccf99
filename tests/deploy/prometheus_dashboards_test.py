#!/usr/bin/python3
"""End to end: the real trainwatch-server, the real Prometheus (Debian's
/usr/bin/prometheus) with deploy/prometheus/trainwatch-rules.yml, an unhealthy
run replayed with trainwatchctl, then every query of every dashboard must
return data, the rules must load and evaluate cleanly, and ClipFractionHigh
must fire in Prometheus with exactly the labels {alertname, run, severity}.

  prometheus_dashboards_test.py SOURCE_DIR SERVER_BIN CTL_BIN

Test copy of prometheus.yml: scrape_interval and evaluation_interval 1s, the
target is the server's /metrics, no Alertmanager. Prints the latency from the
ack of the bad steps to the alert firing in /api/v1/alerts (at 1 s intervals).
Loopback only. A missing prometheus is a failure, not a skip.
"""
import json, math, os, random, shutil, signal, socket, subprocess, sys, tempfile, time
import urllib.parse, urllib.request
import yaml

SRC, SERVER, CTL = (os.path.abspath(a) for a in sys.argv[1:4])
sys.path.insert(0, os.path.join(SRC, "tools"))
import tw_harness  # noqa: E402  (the one server launcher)
RUN = "deploy-test/unhealthy"
REF = "deploy-test/reference"
DEADLINE_S = 60
procs = []

def fail(msg):
    print("FAIL:", msg, flush=True)
    for p in procs:
        if p.poll() is None: p.kill()
    for p in procs:
        if hasattr(p, "log_path"):
            print(f"--- {p.log_path} (tail) ---\n" + open(p.log_path, errors="replace").read()[-3000:])
    sys.exit(1)

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]

def start(argv, log_path):
    log = open(log_path, "w")
    p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    p.log_path = log_path; procs.append(p); return p

def get_json(url, params=None):
    if params: url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)

def poll(what, fn, timeout=DEADLINE_S, interval=0.2):
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        try:
            v = fn()
            if v: return v
        except Exception as e:
            last = e
        time.sleep(interval)
    fail(f"timed out after {timeout} s waiting for {what} (last error: {last})")

def replay(path):
    r = subprocess.run([CTL, "--server", grpc_addr, "replay", path], capture_output=True, text=True, timeout=60)
    if r.returncode != 0: fail(f"replay {path}: {r.returncode}\n{r.stdout}\n{r.stderr}")
    return time.monotonic()

def step_line(rng, step, clipped):
    norm = 1.6 if clipped else 0.5 * math.exp(rng.gauss(0, 0.1))
    rec = {"step": step, "grad_norm": norm, "loss_scale": 32768.0, "max_attn_logit": 15 + rng.gauss(0, 0.2),
           "log_z": 10.8 + rng.gauss(0, 0.02), "loss": 10.0 - step * 0.01, "lr": 3e-4 * min(1, step / 10),
           "batch_ids": [2 * step, 2 * step + 1]}
    if step % 10 == 0:  # healthy FP8 stats, for the FP8 panels
        rec["fp8"] = {"l0.fc1:input": {"format": "E4M3", "amax": 3.0 * math.exp(rng.gauss(0, 0.05)),
                                       "scale": 448 / 3.3, "amax_history_len": 16, "margin": 0,
                                       "overflow_fraction": 0, "underflow_fraction": 0.001}}
        # and a healthy MoE routing report, for the MoE panels.
        rec["moe"] = {"layers": [{"layer": str(l), "tokens_per_expert": [rng.randint(900, 1100) for _ in range(8)],
                                  "dropped": 2, "aux_loss": 1.01, "z_loss": 2.5} for l in range(2)]}
    return json.dumps(rec)

def main():
    global grpc_addr
    prometheus = shutil.which("prometheus") or "/usr/bin/prometheus"
    for b, what in ((prometheus, "prometheus (Debian package prometheus)"), (SERVER, "trainwatch-server"), (CTL, "trainwatchctl")):
        if not os.access(b, os.X_OK): fail(f"{what} not found at {b}")
    tmp = tempfile.mkdtemp(prefix="tw-deploy-test-")
    t0 = time.monotonic()
    try:
        # 1. trainwatch-server on free loopback ports.
        try:
            srv = tw_harness.Server(os.path.dirname(SERVER), tmp, db="tw.db", timeout=15)
        except tw_harness.ServerError as e:
            fail(str(e))
        srv.proc.log_path = str(srv.log_path); procs.append(srv.proc)
        grpc_addr, metrics_addr = srv.address, srv.metrics_address
        print(f"server: gRPC {grpc_addr}, metrics {metrics_addr}")

        # 2. Prometheus with a test copy of the shipped config and the real rules.
        cfg = yaml.safe_load(open(f"{SRC}/deploy/prometheus/prometheus.yml"))
        cfg["global"]["scrape_interval"] = cfg["global"]["evaluation_interval"] = "1s"
        cfg["rule_files"] = [f"{SRC}/deploy/prometheus/{f}" for f in cfg["rule_files"]]
        cfg.pop("alerting", None)  # no Alertmanager here
        jobs = [j for j in cfg["scrape_configs"] if j["job_name"] == "trainwatch"]
        if len(jobs) != 1: fail("prometheus.yml has no job trainwatch")
        jobs[0]["scrape_interval"] = "1s"; jobs[0]["scrape_timeout"] = "1s"
        jobs[0]["static_configs"] = [{"targets": [metrics_addr]}]
        cfg["scrape_configs"] = jobs
        yaml.safe_dump(cfg, open(f"{tmp}/prometheus.yml", "w"))
        prom_port = free_port()
        prom = f"http://127.0.0.1:{prom_port}"
        start([prometheus, f"--config.file={tmp}/prometheus.yml", f"--storage.tsdb.path={tmp}/tsdb",
               f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"], f"{tmp}/prometheus.log")
        poll("Prometheus ready", lambda: urllib.request.urlopen(f"{prom}/-/ready", timeout=2).status == 200, timeout=30)
        print(f"prometheus: {prom} ({time.monotonic() - t0:.1f} s since start)")

        # 3. Part 1: a healthy-looking fp16 start (every gauge set, no clipping),
        # judged against a reference run of the same recipe replayed first (the
        # baseline panel).
        rng = random.Random(4)
        run_start = {"run_id": REF, "world_size": 1, "precision": "FP16", "max_norm": 1.0,
                 "warmup_steps": 10, "labels": {"model": "test"}, "moe": {"num_experts": 8, "top_k": 2}}
        with open(f"{tmp}/reference.jsonl", "w") as f:
            print(json.dumps({"run_start": run_start}), file=f)
            for s in range(1, 401): print(step_line(random.Random(s), s, False), file=f)
        replay(f"{tmp}/reference.jsonl")
        start_line = json.dumps({"run_start": dict(run_start, run_id=RUN,
                                                   baselines=[{"run": REF, "attempt": 0}])})
        with open(f"{tmp}/part1.jsonl", "w") as f:
            print(start_line, file=f)
            for s in range(1, 201): print(step_line(rng, s, False), file=f)
        replay(f"{tmp}/part1.jsonl")
        poll("the run scraped", lambda: get_json(f"{prom}/api/v1/query", {"query": f'trainwatch_steps_total{{run="{RUN}"}} >= 200'})["data"]["result"])
        firing = get_json(f"{prom}/api/v1/alerts")["data"]["alerts"]
        if any(a["labels"].get("alertname") == "ClipFractionHigh" for a in firing):
            fail("ClipFractionHigh fires before any step was clipped")

        # 4. Part 2: every other step clipped (clip fraction ~20% of the window) and a
        # 40x spike; the ack of this replay starts the latency clock.
        with open(f"{tmp}/part2.jsonl", "w") as f:
            print(start_line, file=f)
            for s in range(201, 301):
                line = json.loads(step_line(rng, s, s % 2 == 0))
                if s == 290: line["grad_norm"] = 20.0
                print(json.dumps(line), file=f)
        acked = replay(f"{tmp}/part2.jsonl")
        def clip_alert():
            for a in get_json(f"{prom}/api/v1/alerts")["data"]["alerts"]:
                if a["labels"].get("alertname") == "ClipFractionHigh" and a["labels"].get("run") == RUN and a["state"] == "firing":
                    return a
        alert = poll("ClipFractionHigh firing in /api/v1/alerts", clip_alert, interval=0.05)
        latency = time.monotonic() - acked
        print(f"MEASURED: ack of the bad steps -> ClipFractionHigh firing in Prometheus: {latency:.2f} s "
              f"(scrape 1 s + evaluation 1 s, no for:)")
        if set(alert["labels"]) != {"alertname", "run", "severity"} or alert["labels"]["severity"] != "warning":
            fail(f"ClipFractionHigh labels {alert['labels']} != {{alertname, run, severity=warning}}")
        print(f"ok    ClipFractionHigh firing with labels {alert['labels']}, value {alert['value']}")

        # 5. Rules loaded and evaluated without errors.
        catalog = json.loads(subprocess.run([SERVER, "--print-catalog", "json"], capture_output=True,
                                             text=True, check=True).stdout)
        want = {a["name"] for a in catalog} | {"TrainwatchDown", "TrainwatchIngestRejecting",
                                                                 "TrainwatchStoreBackedUp", "TrainwatchStoreErrors"}
        def rules_ok():
            groups = get_json(f"{prom}/api/v1/rules")["data"]["groups"]
            rules = [r for g in groups for r in g["rules"]]
            if not all(r.get("lastEvaluation", "").startswith("20") for r in rules): return None
            return rules
        rules = poll("every rule evaluated", rules_ok)
        names = {r["name"] for r in rules}
        if not want <= names: fail(f"rules missing in Prometheus: {sorted(want - names)}")
        bad = [(r["name"], r.get("lastError")) for r in rules if r.get("health") != "ok"]
        if bad: fail(f"rules with evaluation errors: {bad}")
        print(f"ok    {len(rules)} rules loaded, all health ok")
        firing_now = sorted({(a["labels"]["alertname"], a["state"]) for a in get_json(f"{prom}/api/v1/alerts")["data"]["alerts"]})
        print(f"      alerts in Prometheus: {firing_now}")

        # 6. Every dashboard query returns data (instant query, variables substituted).
        subst = {"$__rate_interval": "1m", "$__interval": "1s", "$__range": "5m", "${run}": RUN, "$run": RUN}
        n = 0
        for fname in ("trainwatch-run.json", "trainwatch-fleet.json"):
            d = json.load(open(f"{SRC}/dashboards/{fname}"))
            queries = [(p["title"], t["refId"], t["expr"]) for p in d["panels"] for t in p.get("targets", [])]
            queries += [(f"annotation {a['name']}", "-", a["expr"]) for a in d["annotations"]["list"] if a.get("expr")]
            for title, ref, expr in queries:
                q = expr
                for k in sorted(subst, key=len, reverse=True): q = q.replace(k, subst[k])
                if "$" in q: fail(f"{fname} '{title}' {ref}: unsubstituted variable in {q}")
                def has_data():
                    r = get_json(f"{prom}/api/v1/query", {"query": q})
                    return r["status"] == "success" and r["data"]["result"]
                res = poll(f"data for {fname} '{title}' {ref}: {q}", has_data, timeout=20)
                n += 1
                print(f"ok    {fname} '{title}' {ref}: {len(res)} series")
        # The run variable's query.
        vals = get_json(f"{prom}/api/v1/label/run/values", {"match[]": "trainwatch_steps_total"})["data"]
        if RUN not in vals: fail(f"label_values(trainwatch_steps_total, run) lacks {RUN}: {vals}")
        print(f"ok    {n} dashboard queries returned data; $run values {vals}")
        print(f"PASS in {time.monotonic() - t0:.1f} s")
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try: p.wait(10)
                except subprocess.TimeoutExpired: p.kill(); p.wait()
        shutil.rmtree(tmp, ignore_errors=True)

if __name__ == "__main__":
    main()
