#!/usr/bin/python3
"""Checks the deployment files (deploy/, dashboards/) without Docker or a cluster.

  deploy_files_test.py SOURCE_DIR SERVER_BIN run every check; exit 1 on any failure
  deploy_files_test.py SOURCE_DIR SERVER_BIN --write-prometheusrule
                                             regenerate deploy/k8s/prometheusrule.yaml
  deploy_files_test.py SOURCE_DIR SERVER_BIN --write-proxy-configmap
                                             regenerate the nginx configuration in
                                             deploy/k8s/proxy.yaml (render.sh, same arguments)

Runs promtool (check rules, test rules, check config) and amtool check-config:
a missing tool is a failure, not a skip.
"""
import glob, json, os, re, shutil, subprocess, sys, tempfile, time
import yaml

SRC = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../.."))
D = lambda *p: os.path.join(SRC, *p)
# trainwatch-server: the alert catalog, as `--print-catalog json` prints it.
BIN = sys.argv[2] if len(sys.argv) > 2 and not sys.argv[2].startswith("--") else None
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

RENDERED_BY = re.compile(r"^# (deploy/fleet/render\.sh .*)$", re.M)

def render(conf):
    """render.sh's output for the command line recorded in `conf`'s header."""
    m = RENDERED_BY.search(conf)
    if not m: return None
    argv = m.group(1).split()
    r = subprocess.run(["bash", D(argv[0]), *argv[1:]], capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None

def write_proxy_configmap():
    path = D("deploy/k8s/proxy.yaml")
    text = open(path).read()
    conf = load_yaml_all(path)[0]["data"]["trainwatch-fleet.conf"]
    head, _, rest = text.partition("  trainwatch-fleet.conf: |\n")
    tail = rest[rest.index("\n---\n"):]
    body = "".join(("    " + l if l.strip() else l) for l in render(conf).splitlines(True))
    open(path, "w").write(head + "  trainwatch-fleet.conf: |\n" + body.rstrip("\n") + tail)
    print("wrote", path)

def upstream_servers(conf):
    return re.findall(r"^\s*server\s+(\S+?)(?:\s+([^;]*))?;", conf.split("upstream trainwatch_servers", 1)[-1].split("}", 1)[0], re.M)

def check_fleet(docs, kinds):
    """deploy/fleet and the Kubernetes fleet agree with each other and with the clients."""
    channel_h = open(D("client/include/trainwatch/channel.h")).read()
    m = re.search(r'kRunHeader\[\] = "([a-z0-9-]+)"', channel_h)
    header = m.group(1) if m else ""
    check(header == "x-trainwatch-run", f"clients send the run header x-trainwatch-run ({header})")
    nginx_var = "$http_" + header.replace("-", "_")
    render_sh = D("deploy/fleet/render.sh")
    check(os.access(render_sh, os.X_OK), "deploy/fleet/render.sh is executable")
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    check(nginx is not None, "nginx found (Debian's nginx, deploy/install.sh installs it)")
    confs = {"deploy/fleet/trainwatch-fleet.conf": open(D("deploy/fleet/trainwatch-fleet.conf")).read()}
    proxy_cm = [d for d in kinds.get("ConfigMap", []) if d["metadata"]["name"] == "trainwatch-proxy"]
    if check(len(proxy_cm) == 1, "k8s: the proxy's ConfigMap trainwatch-proxy"):
        confs["deploy/k8s/proxy.yaml ConfigMap"] = proxy_cm[0]["data"].get("trainwatch-fleet.conf", "")
    for where, conf in confs.items():
        check(render(conf) == conf, f"{where}: is render.sh's output for the command line in its header")
        check(f"hash {nginx_var} consistent;" in conf, f"{where}: hash {nginx_var} consistent")
        check(re.search(r"grpc_pass grpcs?://trainwatch_servers;", conf) is not None, f"{where}: grpc_pass to the upstream")
        check("grpc_next_upstream off;" in conf, f"{where}: grpc_next_upstream off (no rerouting)")
        servers = upstream_servers(conf)
        check(len(servers) >= 2 and all("max_fails=0" in (opts or "") for _, opts in servers),
              f"{where}: {len(servers)} servers, each max_fails=0 (never taken out of the ring)")
        check("client_max_body_size 0;" in conf and "grpc_read_timeout 1d;" in conf and "client_body_timeout 1d;" in conf,
              f"{where}: no body limit and day-long timeouts for long-lived streams")
        if nginx:
            with tempfile.TemporaryDirectory() as tmp:
                # Stand-ins: loopback for the hosts, a throwaway certificate
                # for the PEM files, /dev/null for the log.
                subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{tmp}/key.pem",
                                "-out", f"{tmp}/cert.pem", "-days", "1", "-subj", "/CN=test"], capture_output=True)
                local = re.sub(r"(server\s+)[^\s:]+:", r"\g<1>127.0.0.1:", conf)
                local = re.sub(r"(_key)\s+/\S+;", rf"\1 {tmp}/key.pem;", local)
                local = re.sub(r"(certificate)\s+/\S+;", rf"\1 {tmp}/cert.pem;", local)
                local = re.sub(r"access_log\s+/\S+", "access_log /dev/null", local)
                open(f"{tmp}/nginx.conf", "w").write(
                    f"pid {tmp}/nginx.pid; error_log {tmp}/error.log; events {{}} http {{ client_body_temp_path {tmp}; {local} }}")
                run([nginx, "-t", "-q", "-c", f"{tmp}/nginx.conf", "-p", tmp, "-e", f"{tmp}/error.log"],
                    what=f"nginx -t: {where}")

    # Kubernetes: replicas == per-pod Services == upstream entries; ports and names agree.
    sts = [s for s in kinds.get("StatefulSet", []) if s["metadata"]["name"] == "trainwatch"]
    if not check(len(sts) == 1 and proxy_cm, "k8s: StatefulSet trainwatch and the proxy"): return
    sts = sts[0]
    replicas = sts["spec"]["replicas"]
    check(replicas >= 2, f"k8s: the StatefulSet has several replicas ({replicas})")
    container = sts["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    args = container["args"]
    check(args[args.index("--listen") + 1].endswith(f":{ports.get('grpc')}"), "k8s: --listen on the grpc containerPort")
    check(args[args.index("--metrics-listen") + 1].endswith(f":{ports.get('metrics')}"), "k8s: --metrics-listen on the metrics containerPort")
    ns = sts["metadata"]["namespace"]
    services = {d["metadata"]["name"]: d for d in kinds.get("Service", [])}
    headless = services.get(sts["spec"]["serviceName"], {})
    check(headless.get("spec", {}).get("clusterIP") == "None", f"k8s: serviceName {sts['spec']['serviceName']} is headless")
    sel = sts["spec"]["selector"]["matchLabels"]
    check(all(headless.get("spec", {}).get("selector", {}).get(k) == v for k, v in sel.items()), "k8s: the headless Service selects the StatefulSet's pods")
    per_pod = sorted(n for n, d in services.items() if d["metadata"].get("labels", {}).get("trainwatch.io/per-pod") == "true")
    want = [f"{sts['metadata']['name']}-{i}" for i in range(replicas)]
    check(per_pod == want, f"k8s: one per-pod Service per replica ({per_pod} == {want})")
    for name in per_pod:
        spec = services[name]["spec"]
        check(spec.get("selector") == {"statefulset.kubernetes.io/pod-name": name}, f"k8s: Service {name} selects pod {name}")
        check(any(p.get("targetPort") in ("grpc", ports.get("grpc")) for p in spec["ports"]), f"k8s: Service {name} targets the grpc port")
    conf = proxy_cm[0]["data"]["trainwatch-fleet.conf"]
    entries = [s for s, _ in upstream_servers(conf)]
    svc_port = {n: next((p["port"] for p in services[n]["spec"]["ports"] if p["name"] == "grpc"), None) for n in per_pod}
    want_entries = [f"{n}.{ns}.svc.cluster.local:{svc_port[n]}" for n in per_pod]
    check(sorted(entries) == sorted(want_entries), f"k8s: the proxy's upstream is the per-pod Services ({entries})")
    deploy = [d for d in kinds.get("Deployment", []) if d["metadata"]["name"] == "trainwatch-proxy"]
    if check(len(deploy) == 1, "k8s: Deployment trainwatch-proxy"):
        pod = deploy[0]["spec"]["template"]["spec"]
        c = pod["containers"][0]
        cm_vol = next((v["name"] for v in pod["volumes"] if v.get("configMap", {}).get("name") == "trainwatch-proxy"), None)
        check(any(m["name"] == cm_vol and m["mountPath"] == "/etc/nginx/conf.d" for m in c["volumeMounts"]),
              "k8s: the proxy mounts the ConfigMap at /etc/nginx/conf.d")
        listen = re.search(r"^\s*listen\s+(?:\S+:)?(\d+)\b", conf, re.M)
        proxy_ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        check(listen and int(listen.group(1)) == proxy_ports.get("grpc"), "k8s: nginx listens on the proxy's grpc containerPort")
        mounts = [m["mountPath"] for m in c["volumeMounts"]]
        for path in re.findall(r"(?:ssl_certificate|ssl_certificate_key|grpc_ssl_trusted_certificate)\s+(\S+);", conf):
            check(any(path.startswith(m + "/") for m in mounts), f"k8s: proxy file {path} is mounted")
        front = services.get("trainwatch", {})
        check(front.get("spec", {}).get("selector") == deploy[0]["spec"]["selector"]["matchLabels"],
              "k8s: Service trainwatch (what trainers dial) selects the proxy")
        check(any(p["port"] == 50051 for p in front.get("spec", {}).get("ports", [])), "k8s: Service trainwatch on 50051")
    m = re.search(r"grpc_ssl_name (\S+);", conf)
    if m: check(m.group(1) == f"{headless['metadata']['name']}.{ns}.svc", f"k8s: the proxy verifies the servers as {m.group(1)}")
    for sm in kinds.get("ServiceMonitor", []):
        sel = sm["spec"]["selector"]
        match = lambda d: all(d["metadata"].get("labels", {}).get(k) == v for k, v in sel.get("matchLabels", {}).items()) and \
            all(e["key"] not in d["metadata"].get("labels", {}) for e in sel.get("matchExpressions", []) if e["operator"] == "DoesNotExist")
        chosen = sorted(n for n, d in services.items() if match(d))
        check(chosen == [headless["metadata"]["name"]],
              f"k8s: the ServiceMonitor scrapes the headless Service only, i.e. every replica once ({chosen})")
        ep = sm["spec"]["endpoints"][0]
        check(any(p["name"] == ep["port"] for p in headless["spec"]["ports"]), "k8s: the ServiceMonitor's port is on the headless Service")
        check(ep.get("scheme") == "https" and "basicAuth" in ep and "tlsConfig" in ep,
              "k8s: the ServiceMonitor scrapes with https, tlsConfig and basicAuth")
    check("--web-config-file" in args, "k8s: the servers serve /metrics with --web-config-file")

SEVERITY_RANK = {"INFO": 0, "WARNING": 1, "CRITICAL": 2}


def alert_catalog():
    """[{name, severity, scope, rule, causes, likely_cause, fix}] from the server's catalog."""
    if BIN is None:
        sys.exit("deploy_files_test.py: give the trainwatch-server binary after SOURCE_DIR")
    r = subprocess.run([BIN, "--print-catalog", "json"], capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def check_inhibitions():
    """One cause, one page: every consequence the catalog names (caused_by)
    is muted by a shipped inhibit rule while its cause fires, unless it is
    the more severe of the two (a critical LossDivergence grown from an info
    LossSpike is the page)."""
    am = yaml.safe_load(open(D("deploy/alertmanager/alertmanager.yml")))

    def names(matchers):
        """Which alertnames one matcher selects: by name, or by severity."""
        m = re.fullmatch(r'(alertname|severity)(=~|=)"(.*)"', matchers[0]) if len(matchers) == 1 else None
        if m is None:
            return lambda n: False
        if m.group(1) == "severity":
            return lambda n: re.fullmatch(m.group(3), catalog[n][0].lower()) is not None
        return lambda n: re.fullmatch(m.group(3), n) is not None

    catalog = {a["name"]: (a["severity"].upper(), a["causes"]) for a in alert_catalog()}
    rules = [(names(r["source_matchers"]), names(r["target_matchers"]), r.get("equal"))
             for r in am.get("inhibit_rules", [])]
    check(len(catalog) >= 30, f"alert catalog parsed ({len(catalog)} alerts)")
    for alert, (severity, causes) in sorted(catalog.items()):
        for cause in causes:
            if SEVERITY_RANK[severity] > SEVERITY_RANK[catalog[cause][0]]:
                continue
            check(any(src(cause) and dst(alert) and eq == ["run"] for src, dst, eq in rules),
                  f"alertmanager inhibits {alert} while its cause {cause} fires (equal: [run])")


def main():
    if "--write-prometheusrule" in sys.argv:
        write_prometheusrule(); return 0
    if "--write-proxy-configmap" in sys.argv:
        write_proxy_configmap(); return 0
    promtool, amtool = tool("promtool"), tool("amtool")
    prom_dir = D("deploy/prometheus")
    if promtool:
        run([promtool, "check", "rules", "trainwatch-rules.yml"], cwd=prom_dir, what="promtool check rules")
        run([promtool, "test", "rules", "trainwatch-rules.test.yml"], cwd=prom_dir, what="promtool test rules")
        run([promtool, "check", "config", "prometheus.yml"], cwd=prom_dir, what="promtool check config")
        # The fleet's config refers to the CA and password files of a real
        # deployment: checked with stand-ins for them.
        with tempfile.TemporaryDirectory() as tmp:
            fleet = yaml.safe_load(open(f"{prom_dir}/prometheus-fleet.yml"))
            fleet["rule_files"] = [f"{prom_dir}/{f}" for f in fleet["rule_files"]]
            job = next(j for j in fleet["scrape_configs"] if j["job_name"] == "trainwatch")
            check(job.get("scheme") == "https" and "basic_auth" in job and len(job["static_configs"][0]["targets"]) >= 2,
                  "prometheus-fleet.yml: several servers, https and basic_auth")
            for section, key in (("tls_config", "ca_file"), ("basic_auth", "password_file")):
                open(f"{tmp}/{key}", "w").write("x")
                job[section][key] = f"{tmp}/{key}"
            yaml.safe_dump(fleet, open(f"{tmp}/prometheus-fleet.yml", "w"))
            run([promtool, "check", "config", f"{tmp}/prometheus-fleet.yml"], what="promtool check config prometheus-fleet.yml")
    if amtool:
        run([amtool, "check-config", "alertmanager.yml"], cwd=D("deploy/alertmanager"), what="amtool check-config")
        # info is recorded, not paged; warning and critical reach a person.
        for labels, receiver in ((["severity=info", "alertname=GradNormSpike"], "trainwatch-record-only"),
                                 (["severity=warning", "alertname=ClipFractionHigh"], "trainwatch-webhook"),
                                 (["severity=critical", "alertname=LossSpike"], "trainwatch-webhook")):
            r = subprocess.run([amtool, "config", "routes", "test", "--config.file=alertmanager.yml", *labels],
                               cwd=D("deploy/alertmanager"), capture_output=True, text=True)
            check(r.stdout.strip() == receiver,
                  f"alertmanager routes {' '.join(labels)} to {receiver} (got {r.stdout.strip()!r} {r.stderr.strip()})")

    check_inhibitions()

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
    specs = [(a["name"], a["severity"]) for a in alert_catalog()]
    check(len(specs) >= 17, f"alert catalog: {len(specs)} alertnames")
    # HostSuspect is the server-wide one: its fleet rule counts hosts over
    # trainwatch_host_incidents_total, across servers (checked below).
    host = dict(specs).get("HostSuspect")
    if check(host is not None and "HostSuspect" in by_name, "HostSuspect in the catalog and the rules"):
        r = by_name["HostSuspect"]
        check(r.get("labels", {}).get("severity") == host, f"HostSuspect: severity {host}")
        check("trainwatch_host_incidents_total" in r["expr"] and "by (host)" in r["expr"],
              "HostSuspect: from trainwatch_host_incidents_total, by host")
    for name, sev in specs:
        if name == "HostSuspect":
            continue
        r = by_name.get(name)
        if check(r is not None, f"rule for {name}"):
            check(r.get("labels", {}).get("severity") == sev, f"{name}: severity {sev}")
            check(set(r.get("annotations", {})) >= {"summary", "description", "likely_cause", "fix"},
                  f"{name}: annotations summary/description/likely_cause/fix")
            check(f'alertname="{name}"' in r["expr"] and re.search(r"by \(run\)", r["expr"]) is not None,
                  f"{name}: from trainwatch_alert_active, aggregated by (run)")
    # The server tells a settling or since-the-start clip from a rise; a bare
    # threshold on the series would page those (docs/detectors.md).
    check("> 0.05" not in by_name.get("ClipFractionHigh", {}).get("expr", ""),
          "ClipFractionHigh is the server's verdict, not a bare trainwatch_clip_fraction > 0.05")
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
    check_fleet(docs, kinds)
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
