#!/usr/bin/python3
"""/metrics over TLS with basic auth (--web-config-file, docs/fleet.md), end to
end: the real trainwatch-server with a web config in the exporters' format,
curl, and the real Prometheus (Debian's /usr/bin/prometheus) scraping it with
the job of deploy/prometheus/prometheus-fleet.yml.

  metrics_tls_test.py SOURCE_DIR SERVER_BIN

Checked: with the password, curl gets 200 and the exposition; without it, or
with a wrong one, 401; plain HTTP and an untrusted CA fail; Prometheus with
the fleet job's TLS and basic_auth has the target up (up == 1), and the same
job without basic_auth is refused (up == 0, 401). A web config that is wrong
stops the server at start with "--web-config-file FILE: what is wrong".
Certificates come from the openssl CLI, the bcrypt hash from libcrypt.
A missing tool is a failure, not a skip.
"""
import ctypes, ctypes.util, json, os, shutil, signal, socket, subprocess, sys, tempfile, time
import urllib.parse, urllib.request
import yaml

SRC, SERVER = (os.path.abspath(a) for a in sys.argv[1:3])
sys.path.insert(0, os.path.join(SRC, "tools"))
import tw_harness  # noqa: E402  (the one server launcher)


def start_server(work, web_config, db):
    """trainwatch-server with --web-config-file, by tools/tw_harness.py; its
    process joins `procs` (killed and its log shown on a failure)."""
    os.makedirs(work, exist_ok=True)
    try:
        srv = tw_harness.Server(os.path.dirname(SERVER), work, db=db, timeout=20,
                                args=["--web-config-file", web_config])
    except tw_harness.ServerError as e:
        fatal(str(e))
    srv.proc.log_path = str(srv.log_path); procs.append(srv.proc)
    return srv
PASSWORD = "s3cret-scrape"
procs, failures = [], []


def check(ok, what, detail=""):
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        failures.append(what)
        if detail: print(detail[-3000:])
    return ok


def fatal(msg):
    check(False, msg)
    for p in procs:
        if p.poll() is None: p.kill()
        print(f"--- {p.log_path} ---\n" + open(p.log_path, errors="replace").read()[-3000:])
    sys.exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]


def start(argv, log_path):
    p = subprocess.Popen(argv, stdout=open(log_path, "w"), stderr=subprocess.STDOUT)
    p.log_path = log_path; procs.append(p); return p


def poll(what, fn, timeout=60):
    end, last = time.monotonic() + timeout, None
    while time.monotonic() < end:
        try:
            v = fn()
            if v: return v
        except Exception as e:
            last = e
        time.sleep(0.2)
    fatal(f"timed out after {timeout} s waiting for {what} (last error: {last})")


def bcrypt(password):
    """A $2b$ hash from libcrypt (libxcrypt), as the server checks it."""
    lib = ctypes.CDLL(ctypes.util.find_library("crypt"))
    lib.crypt_gensalt.restype = ctypes.c_char_p
    lib.crypt_gensalt.argtypes = [ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p, ctypes.c_int]
    lib.crypt.restype = ctypes.c_char_p
    lib.crypt.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    salt = lib.crypt_gensalt(b"$2b$", 6, None, 0)
    return lib.crypt(password.encode(), salt).decode()


def openssl(*args, cwd):
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0: fatal(f"openssl {' '.join(args)}: {r.stderr}")


def curl(*args):
    """(exit code, HTTP status or 0, body) of curl."""
    r = subprocess.run(["curl", "-sS", "--max-time", "10", "-o", "-", "-w", "\n%{http_code}", *args],
                       capture_output=True, text=True)
    body, _, code = r.stdout.rpartition("\n")
    return r.returncode, int(code or 0), body + r.stderr


def main():
    prometheus = shutil.which("prometheus") or "/usr/bin/prometheus"
    for b in (prometheus, SERVER, shutil.which("curl"), shutil.which("openssl")):
        if not b or not os.access(b, os.X_OK): fatal(f"missing: {b} (prometheus, curl and openssl come from deploy/install.sh)")
    tmp = tempfile.mkdtemp(prefix="tw-metrics-tls-")
    try:
        # A CA and a certificate for 127.0.0.1 signed by it; a second CA nobody trusts.
        for ca in ("ca", "other-ca"):
            openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.pem",
                    "-days", "2", "-subj", f"/CN=test {ca}", cwd=tmp)
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "metrics.key", "-out", "metrics.csr",
                "-subj", "/CN=127.0.0.1", cwd=tmp)
        open(f"{tmp}/san.ext", "w").write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        openssl("x509", "-req", "-in", "metrics.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", "metrics.pem", "-days", "2", "-extfile", "san.ext", cwd=tmp)
        web = {"tls_server_config": {"cert_file": f"{tmp}/metrics.pem", "key_file": f"{tmp}/metrics.key"},
               "basic_auth_users": {"prometheus": bcrypt(PASSWORD)}}
        yaml.safe_dump(web, open(f"{tmp}/web.yml", "w"))

        # Bad web configs stop the server at start, saying what is wrong where.
        bad = {
            "plain-password": ({"basic_auth_users": {"prometheus": "hunter2"}}, "basic_auth_users.prometheus: want a bcrypt hash"),
            "unknown-key": ({"tls_server_config": {**web["tls_server_config"], "min_version": "TLS13"}},
                            "tls_server_config.min_version: not supported"),
            "no-key": ({"tls_server_config": {"cert_file": f"{tmp}/metrics.pem"}}, "tls_server_config: cert_file and key_file go together"),
            "cert-as-key": ({"tls_server_config": {"cert_file": f"{tmp}/metrics.pem", "key_file": f"{tmp}/metrics.pem"}},
                            "tls_server_config.key_file: " + f"{tmp}/metrics.pem holds no PEM private key"),
        }
        for name, (config, message) in bad.items():
            path = f"{tmp}/bad-{name}.yml"
            yaml.safe_dump(config, open(path, "w"))
            r = subprocess.run([SERVER, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                                "--db", f"{tmp}/bad.db", "--web-config-file", path],
                               capture_output=True, text=True, timeout=30)
            check(r.returncode != 0 and f"--web-config-file {path}: {message}" in r.stderr,
                  f"bad web config ({name}) refused at start: {message}", r.stderr)
        r = subprocess.run([SERVER, "--listen", "127.0.0.1:0", "--db", f"{tmp}/bad.db",
                            "--web-config-file", f"{tmp}/missing.yml"], capture_output=True, text=True, timeout=30)
        check(r.returncode != 0 and f"--web-config-file {tmp}/missing.yml: cannot read" in r.stderr,
              "missing web config refused at start", r.stderr)

        srv = start_server(f"{tmp}/one", f"{tmp}/web.yml", "tw.db")
        addr = srv.metrics_address
        url = srv.metrics_url
        check(url == f"https://{addr}/metrics", "the ready line says https", url)
        print("server /metrics:", url)

        code, status, body = curl("--cacert", f"{tmp}/ca.pem", "-u", f"prometheus:{PASSWORD}", url)
        check(code == 0 and status == 200 and "trainwatch_" in body, "curl with the password: 200 and the exposition",
              body)
        # Again: served from the verified-credentials cache.
        code, status, _ = curl("--cacert", f"{tmp}/ca.pem", "-u", f"prometheus:{PASSWORD}", url)
        check(status == 200, "curl with the password, again: 200")
        code, status, body = curl("--cacert", f"{tmp}/ca.pem", url)
        check(status == 401 and "trainwatch_" not in body, f"curl without credentials: 401 (got {status})", body)
        code, status, body = curl("--cacert", f"{tmp}/ca.pem", "-u", "prometheus:wrong", url)
        check(status == 401 and "trainwatch_" not in body, f"curl with a wrong password: 401 (got {status})", body)
        code, status, body = curl("--cacert", f"{tmp}/ca.pem", "-u", f"nobody:{PASSWORD}", url)
        check(status == 401, f"curl as an unknown user: 401 (got {status})", body)
        code, status, body = curl("--cacert", f"{tmp}/other-ca.pem", "-u", f"prometheus:{PASSWORD}", url)
        check(code != 0 and status == 0, f"curl trusting another CA: TLS failure (curl exit {code})", body)
        code, status, body = curl("-u", f"prometheus:{PASSWORD}", f"http://{addr}/metrics")
        check(status != 200 and "trainwatch_" not in body, f"plain HTTP to the TLS port: refused (curl exit {code}, status {status})", body)

        # Prometheus with the fleet job: TLS and basic_auth, and the same job without credentials.
        cfg = yaml.safe_load(open(f"{SRC}/deploy/prometheus/prometheus-fleet.yml"))
        jobs = [j for j in cfg["scrape_configs"] if j["job_name"] == "trainwatch"]
        if len(jobs) != 1: fatal("prometheus-fleet.yml has no job trainwatch")
        job = jobs[0]
        check(job.get("scheme") == "https" and "basic_auth" in job and "tls_config" in job,
              "prometheus-fleet.yml: the trainwatch job scrapes with https, tls_config and basic_auth")
        check(len(job["static_configs"][0]["targets"]) >= 2, "prometheus-fleet.yml: a list of servers")
        open(f"{tmp}/password", "w").write(PASSWORD)
        job.update(scrape_interval="1s", scrape_timeout="1s", static_configs=[{"targets": [addr]}])
        job["tls_config"]["ca_file"] = f"{tmp}/ca.pem"
        job["basic_auth"]["password_file"] = f"{tmp}/password"
        refused = {k: v for k, v in job.items() if k != "basic_auth"}
        refused["job_name"] = "trainwatch-without-password"
        prom_cfg = {"global": {"scrape_interval": "1s"}, "scrape_configs": [job, refused]}
        yaml.safe_dump(prom_cfg, open(f"{tmp}/prometheus.yml", "w"))
        port = free_port()
        prom = f"http://127.0.0.1:{port}"
        start([prometheus, f"--config.file={tmp}/prometheus.yml", f"--storage.tsdb.path={tmp}/tsdb",
               f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"], f"{tmp}/prometheus.log")
        poll("Prometheus ready", lambda: urllib.request.urlopen(f"{prom}/-/ready", timeout=2).status == 200)

        def targets():
            with urllib.request.urlopen(f"{prom}/api/v1/targets", timeout=5) as r:
                active = json.load(r)["data"]["activeTargets"]
            got = {t["labels"]["job"]: t for t in active}
            return got if all(got.get(j, {}).get("health") in ("up", "down") for j in
                              ("trainwatch", "trainwatch-without-password")) else None
        got = poll("both targets scraped", targets)

        def up(jobname):
            q = urllib.parse.urlencode({"query": f'up{{job="{jobname}"}}'})
            with urllib.request.urlopen(f"{prom}/api/v1/query?{q}", timeout=5) as r:
                res = json.load(r)["data"]["result"]
            return res[0]["value"][1] if res else None
        check(poll("up of the trainwatch job", lambda: up("trainwatch") == "1" or None, timeout=30) == True,
              "Prometheus scrapes over TLS with basic auth: up{job=\"trainwatch\"} == 1")
        check(got["trainwatch-without-password"]["health"] == "down" and up("trainwatch-without-password") == "0" and
              "401" in got["trainwatch-without-password"].get("lastError", ""),
              "Prometheus without the password is refused: up == 0, 401",
              json.dumps(got["trainwatch-without-password"]))
        # Client certificates: client_auth_type RequireAndVerifyClientCert.
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "client.key", "-out", "client.csr",
                "-subj", "/CN=prometheus", cwd=tmp)
        openssl("x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", "client.pem", "-days", "2", cwd=tmp)
        mtls = {"tls_server_config": {**web["tls_server_config"], "client_ca_file": f"{tmp}/ca.pem",
                                      "client_auth_type": "RequireAndVerifyClientCert"}}
        yaml.safe_dump(mtls, open(f"{tmp}/mtls.yml", "w"))
        srv2 = start_server(f"{tmp}/two", f"{tmp}/mtls.yml", "tw2.db")
        url2 = srv2.metrics_url
        code, status, body = curl("--cacert", f"{tmp}/ca.pem", "--cert", f"{tmp}/client.pem", "--key", f"{tmp}/client.key", url2)
        check(status == 200 and "trainwatch_" in body, "client certificate required: curl with one gets 200", body)
        code, status, body = curl("--cacert", f"{tmp}/ca.pem", url2)
        check(status != 200 and "trainwatch_" not in body,
              f"client certificate required: curl without one is refused (curl exit {code})", body)

        q = urllib.parse.urlencode({"query": 'trainwatch_runs_active{job="trainwatch"}'})
        with urllib.request.urlopen(f"{prom}/api/v1/query?{q}", timeout=5) as r:
            check(bool(json.load(r)["data"]["result"]), "the scraped series are in Prometheus")
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try: p.wait(10)
                except subprocess.TimeoutExpired: p.kill()
        if not failures: shutil.rmtree(tmp, ignore_errors=True)
        else: print("kept", tmp)
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
