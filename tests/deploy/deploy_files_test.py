#!/usr/bin/python3
"""Checks the deployment files (deploy/, dashboards/) without Docker or a cluster.

  deploy_files_test.py SOURCE_DIR            run every check; exit 1 on any failure
  deploy_files_test.py SOURCE_DIR --write-prometheusrule
                                             regenerate deploy/k8s/prometheusrule.yaml

Runs promtool (check rules, test rules, check config) and amtool check-config:
a missing tool is a failure, not a skip.
"""
import glob, json, os, re, shutil, subprocess, sys, tempfile, time
import yaml

SRC = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../.."))
D = lambda *p: os.path.join(SRC, *p)
failures = []

def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok: failures.append(what)
    return ok

def tool(name):
    p = shutil.which(name) or (f"/usr/bin/{name}" if os.path.exists(f"/usr/bin/{name}") else None)
    if not p:
        check(False, f"{name} not found (install Debian's prometheus / prometheus-alertmanager)")
    return p

def run(argv, cwd=None, what=None):
    t = time.monotonic()
    r = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    ok = check(r.returncode == 0, f"{what or ' '.join(argv)} ({time.monotonic() - t:.2f} s)")
    if not ok: print(r.stdout[-4000:], r.stderr[-4000:], sep="\n")
    return r

def load_yaml_all(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]

def write_prometheusrule():
    rules = load_yaml_all(D("deploy/prometheus/trainwatch-rules.yml"))[0]
    path = D("deploy/k8s/prometheusrule.yaml")
    hdr = "".join(l for l in open(path) if l.startswith("#"))
    doc = load_yaml_all(path)[0]
    doc["spec"] = {"groups": rules["groups"]}
    open(path, "w").write(hdr + yaml.safe_dump(doc, sort_keys=False, width=1000))
    print("wrote", path)

def main():
    if "--write-prometheusrule" in sys.argv:
        write_prometheusrule(); return 0
    promtool, amtool = tool("promtool"), tool("amtool")
    prom_dir = D("deploy/prometheus")
    if promtool:
        run([promtool, "check", "rules", "trainwatch-rules.yml"], cwd=prom_dir, what="promtool check rules")
        run([promtool, "test", "rules", "trainwatch-rules.test.yml"], cwd=prom_dir, what="promtool test rules")
        run([promtool, "check", "config", "prometheus.yml"], cwd=prom_dir, what="promtool check config")
    if amtool:
        run([amtool, "check-config", "alertmanager.yml"], cwd=D("deploy/alertmanager"), what="amtool check-config")

    # Every YAML and JSON file parses.
    ymls = [p for pat in ("deploy/**/*.yml", "deploy/**/*.yaml", "dashboards/**/*.yml", "dashboards/**/*.yaml")
            for p in glob.glob(D(pat), recursive=True)]
    docs = {}
    for p in sorted(set(ymls)):
        try:
            docs[os.path.relpath(p, SRC)] = load_yaml_all(p); check(True, f"parses: {os.path.relpath(p, SRC)}")
        except Exception as e:
            check(False, f"parses: {os.path.relpath(p, SRC)}: {e}")
    dashboards = {}
    for p in sorted(glob.glob(D("dashboards/*.json"))):
        try:
            dashboards[os.path.basename(p)] = json.load(open(p)); check(True, f"parses: dashboards/{os.path.basename(p)}")
        except Exception as e:
            check(False, f"parses: dashboards/{os.path.basename(p)}: {e}")
    check({"trainwatch-run.json", "trainwatch-fleet.json"} <= set(dashboards), "both dashboards present")

    # Rules: every alertname of the catalog has a rule, with the catalog's severity.
    rules = docs.get("deploy/prometheus/trainwatch-rules.yml", [{}])[0]
    by_name = {r["alert"]: r for g in rules.get("groups", []) for r in g["rules"] if "alert" in r}
    cat = open(D("server/health/alert_catalog.cc")).read()
    specs = re.findall(r'\{K::k\w+,\s*"(\w+)",\s*"(\w+)"', cat)
    check(len(specs) >= 17, f"alert_catalog.cc parsed: {len(specs)} alertnames")
    for name, sev in specs:
        r = by_name.get(name)
        if check(r is not None, f"rule for {name}"):
            check(r.get("labels", {}).get("severity") == sev, f"{name}: severity {sev}")
            check(set(r.get("annotations", {})) >= {"summary", "description", "likely_cause", "fix"},
                  f"{name}: annotations summary/description/likely_cause/fix")
            check(f'alertname="{name}"' in r["expr"] and re.search(r"by \(run\)", r["expr"]) is not None,
                  f"{name}: from trainwatch_alert_active, aggregated by (run)")
    check("trainwatch_clip_fraction > 0.05" in by_name.get("ClipFractionHigh", {}).get("expr", ""),
          "ClipFractionHigh carries the explicit rule trainwatch_clip_fraction > 0.05")
    check(list(by_name).count("ClipFractionHigh") == 1, "one ClipFractionHigh rule")
    for name in ("TrainwatchDown", "TrainwatchIngestRejecting", "TrainwatchStoreBackedUp", "TrainwatchStoreErrors",
                 "TrainwatchStoreFailing"):
        check(name in by_name, f"server rule {name}")
    check("trainwatch_last_step_timestamp_seconds" in by_name.get("RunSilent", {}).get("expr", ""),
          "RunSilent uses trainwatch_last_step_timestamp_seconds")
    tests = docs.get("deploy/prometheus/trainwatch-rules.test.yml", [{}])[0]
    tested = {}
    for t in tests.get("tests", []):
        for a in t.get("alert_rule_test", []):
            tested.setdefault(a["alertname"], set()).add(bool(a.get("exp_alerts")))
    for name in by_name:
        check(tested.get(name) == {True, False}, f"promtool tests cover {name} firing and not firing")

    # Kubernetes manifests.
    kinds = {}
    for p, ds in docs.items():
        if p.startswith("deploy/k8s/"):
            for d in ds: kinds.setdefault(d.get("kind"), []).append(d)
    for k in ("StatefulSet", "Service", "ServiceMonitor", "PrometheusRule"):
        check(k in kinds, f"k8s: a {k}")
    for s in kinds.get("StatefulSet", []):
        check(bool(s["spec"].get("volumeClaimTemplates")), "k8s: the StatefulSet has a PVC template")
        args = s["spec"]["template"]["spec"]["containers"][0].get("args", [])
        check("--db" in args and args[args.index("--db") + 1].startswith("/var/lib/trainwatch/"), "k8s: --db on the PVC")
        # The pod's gRPC port is open to the cluster: TLS and tokens, from Secrets.
        mounts = {m["name"]: m["mountPath"] for m in s["spec"]["template"]["spec"]["containers"][0].get("volumeMounts", [])}
        secrets = {v["name"]: v.get("secret", {}).get("secretName") for v in s["spec"]["template"]["spec"].get("volumes", [])}
        for flag in ("--tls-cert", "--tls-key", "--auth-token-file"):
            path = args[args.index(flag) + 1] if flag in args else ""
            vol = next((n for n, m in mounts.items() if path.startswith(m + "/")), None)
            check(vol is not None and bool(secrets.get(vol)), f"k8s: {flag} {path} is in a mounted Secret")
    for pr in kinds.get("PrometheusRule", []):
        check(pr["spec"]["groups"] == rules.get("groups"), "k8s: PrometheusRule groups == trainwatch-rules.yml groups")

    # Dockerfile, compose, systemd.
    dockerfile = open(D("deploy/Dockerfile")).read()
    froms = re.findall(r"^FROM\s+(\S+)", dockerfile, re.M)
    check(len(froms) >= 2 and all(f.startswith("debian:bookworm") for f in froms), f"Dockerfile: >= 2 debian:bookworm stages ({froms})")
    check("cmake" in dockerfile and "COPY --from=" in dockerfile, "Dockerfile: builds with cmake, copies from the build stage")
    compose = docs.get("deploy/docker-compose.yml", [{}])[0]
    svcs = compose.get("services", {})
    check({"trainwatch-server", "prometheus", "alertmanager", "grafana"} <= set(svcs), f"compose: 4 services ({sorted(svcs)})")
    check(svcs.get("grafana", {}).get("image", "").startswith("grafana/grafana-oss"), "compose: grafana/grafana-oss")
    for v in svcs.get("grafana", {}).get("volumes", []) + svcs.get("prometheus", {}).get("volumes", []) + svcs.get("alertmanager", {}).get("volumes", []):
        host = v.split(":")[0]
        if host.startswith("."):
            check(os.path.exists(os.path.normpath(os.path.join(D("deploy"), host))), f"compose: mounted path exists: {host}")
    server = svcs.get("trainwatch-server", {})
    command = server.get("command", [])
    check("--alertmanager-url" in command and command[command.index("--alertmanager-url") + 1] == "http://alertmanager:9093",
          "compose: the server sends alerts to the alertmanager service")
    check(server.get("ports") and all(str(p).startswith("127.0.0.1:") for p in server["ports"]),
          f"compose: the plaintext server is published on loopback only ({server.get('ports')})")
    unit = open(D("deploy/systemd/trainwatch-server.service")).read()
    # Listening beyond loopback: TLS and tokens, handed over as credentials.
    exec_start = re.search(r"^ExecStart=((?:.*\\\n)*.*)$", unit, re.M)
    argv = exec_start.group(1).replace("\\\n", " ").split() if exec_start else []
    listen = argv[argv.index("--listen") + 1] if "--listen" in argv else ""
    check(listen.startswith("0.0.0.0:"), f"systemd unit: gRPC for other machines ({listen})")
    check(argv[argv.index("--metrics-listen") + 1].startswith("127.0.0.1:") if "--metrics-listen" in argv else False,
          "systemd unit: /metrics on loopback")
    for flag, cred in (("--tls-key", "tls.key"), ("--auth-token-file", "tokens")):
        check(flag in argv and argv[argv.index(flag) + 1] == f"%d/{cred}" and f"LoadCredential={cred}:" in unit,
              f"systemd unit: {flag} from the credential {cred}")
    check("--tls-cert" in argv, "systemd unit: --tls-cert")
    for key in ("DynamicUser=yes", "StateDirectory=trainwatch", "--db /var/lib/trainwatch/trainwatch.db", "NoNewPrivileges=yes", "ProtectSystem=strict"):
        check(key in unit, f"systemd unit: {key}")
    sa = shutil.which("systemd-analyze")
    if sa:  # best effort: the unit's binary is not installed here
        r = subprocess.run([sa, "verify", D("deploy/systemd/trainwatch-server.service")], capture_output=True, text=True)
        print("      systemd-analyze verify:", (r.stderr.strip() or "clean")[:500])

    # Dashboards.
    for fname, d in dashboards.items():
        inputs = [i["name"] for i in d.get("__inputs", []) if i.get("type") == "datasource"]
        check(inputs == ["DS_PROMETHEUS"], f"{fname}: __inputs DS_PROMETHEUS")
        uid = "${DS_PROMETHEUS}"
        for p in d.get("panels", []):
            check(p.get("datasource", {}).get("uid") == uid and p.get("targets"), f"{fname}: panel '{p.get('title')}' uses the input")
            for t in p.get("targets", []):
                check(t.get("datasource", {}).get("uid") == uid and t.get("expr", "").strip() != "",
                      f"{fname}: '{p.get('title')}' {t.get('refId')}: datasource and expr")
            check(bool(p.get("fieldConfig", {}).get("defaults", {}).get("unit")), f"{fname}: '{p.get('title')}' has a unit")
        for a in d.get("annotations", {}).get("list", []):
            if not a.get("builtIn"):
                check(a.get("datasource", {}).get("uid") == uid and a.get("expr"), f"{fname}: annotation '{a.get('name')}'")
    run_d = dashboards.get("trainwatch-run.json", {})
    var = {v["name"]: v for v in run_d.get("templating", {}).get("list", [])}
    check("run" in var and "label_values(trainwatch_steps_total, run)" in json.dumps(var["run"].get("query")), "run dashboard: $run from label_values(trainwatch_steps_total, run)")
    exprs = " ".join(t["expr"] for p in run_d.get("panels", []) for t in p.get("targets", []))
    for m in ("trainwatch_grad_norm{", "trainwatch_grad_norm_window", "trainwatch_clip_threshold", "trainwatch_recommended_clip_threshold",
              "trainwatch_clip_fraction", "trainwatch_clip_coefficient", "trainwatch_loss_scale", "trainwatch_skip_fraction",
              "trainwatch_max_attention_logit", "trainwatch_log_z", "trainwatch_loss{", "trainwatch_learning_rate", "trainwatch_alert_active"):
        check(m in exprs, f"run dashboard shows {m.rstrip('{')}")
    check(any("ALERTS" in a.get("expr", "") for a in run_d.get("annotations", {}).get("list", [])), "run dashboard: ALERTS annotations")
    return 1 if failures else 0

if __name__ == "__main__":
    t = time.monotonic()
    rc = main()
    print(f"{len(failures)} failure(s); {time.monotonic() - t:.1f} s")
    for f in failures: print("FAILED:", f)
    sys.exit(rc)
