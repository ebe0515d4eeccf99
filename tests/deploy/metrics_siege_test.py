#!/usr/bin/python3
"""/metrics under siege (docs/security.md, "Exposed edges"), plain and HTTPS
with basic auth, against the real trainwatch-server:

  metrics_siege_test.py SOURCE_DIR SERVER_BIN

For 15 s, 64 idle TCP connections and 32 slow ones (a byte a second) are
held open while a scrape is made every half second: every scrape must get
200 within 5 s. Then: a connection that keeps sending a byte a second is
cut by the whole-request deadline; a request head over 16 KiB gets 431 and
a malformed one 400, each with a status line; the basic-auth scheme is
case-insensitive; a password with a NUL suffix is refused; a wrong-password
flood from 8 threads is answered 429 once past the per-address limit, a
right password still scrapes, and the server CPU the flood cost is printed
(measured, not asserted). The certificates and the bcrypt hash come from
metrics_tls_test.py's helpers.
"""
import base64, os, re, socket, ssl, subprocess, sys, tempfile, threading, time
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import metrics_tls_test as tls  # noqa: E402  (reads SOURCE_DIR SERVER_BIN too)

SERVER = tls.SERVER
IDLE, SLOW, SECONDS = 64, 32, 15


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def request(host, port, head, tls_ctx=None, timeout=5.0):
    """(status code or 0, seconds, raw response head) of one request."""
    start = time.monotonic()
    s = socket.create_connection((host, port), timeout=timeout)
    try:
        if tls_ctx is not None: s = tls_ctx.wrap_socket(s, server_hostname="127.0.0.1")
        s.sendall(head)
        data = b""
        while b"\r\n\r\n" not in data and b"\n\n" not in data:
            chunk = s.recv(65536)
            if not chunk: break
            data += chunk
        m = re.match(rb"HTTP/1\.[01] (\d{3})", data)
        return (int(m.group(1)) if m else 0), time.monotonic() - start, data[:200]
    except OSError as e:
        return 0, time.monotonic() - start, repr(e).encode()
    finally:
        s.close()


def basic(user, password, scheme="Basic"):
    token = base64.b64encode(f"{user}:{password}".encode("latin-1")).decode()
    return f"Authorization: {scheme} {token}\r\n"


def get(path="/metrics", auth=""):
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Connection: close\r\n\r\n".encode()


class Siege:
    """IDLE connections that send nothing and SLOW ones that send a byte a
    second, reopened when the server closes them, until stop()."""

    def __init__(self, host, port):
        self.host, self.port, self.stopped = host, port, threading.Event()
        self.idle = [socket.create_connection((host, port)) for _ in range(IDLE)]
        self.threads = [threading.Thread(target=self.slow, daemon=True) for _ in range(SLOW)]
        for t in self.threads: t.start()

    def slow(self):
        head = get()
        while not self.stopped.is_set():
            try:
                s = socket.create_connection((self.host, self.port), timeout=5)
                for b in head:
                    if self.stopped.wait(1.0): break
                    s.send(bytes([b]))
                s.close()
            except OSError:
                self.stopped.wait(0.5)

    def stop(self):
        self.stopped.set()
        for s in self.idle: s.close()
        for t in self.threads: t.join(timeout=5)


def siege(name, host, port, head, ctx):
    s = Siege(host, port)
    results = []
    end = time.monotonic() + SECONDS
    while time.monotonic() < end:
        results.append(request(host, port, head, ctx))
        time.sleep(0.5)
    s.stop()
    ok = [r for r in results if r[0] == 200 and r[1] < 5.0]
    worst = max(r[1] for r in results)
    tls.check(len(ok) == len(results) and len(results) >= 20,
              f"{name}: {len(ok)} of {len(results)} scrapes got 200 within 5 s under {IDLE} idle and "
              f"{SLOW} slow connections (slowest {worst * 1000:.0f} ms)",
              repr([r for r in results if r not in ok][:3]))


def edges(name, host, port, auth, ctx):
    # The whole-request deadline: a byte a second is cut (10 s; idle timeout 10 s).
    s = socket.create_connection((host, port), timeout=30)
    if ctx is not None: s = ctx.wrap_socket(s, server_hostname="127.0.0.1")
    start, cut = time.monotonic(), False
    try:
        for b in get() * 4:
            s.send(bytes([b]))
            time.sleep(1.0)
            if time.monotonic() - start > 25: break
    except OSError:
        cut = True
    if not cut:
        try:
            cut = s.recv(1) == b""
        except OSError:
            cut = True
    tls.check(cut and time.monotonic() - start < 20,
              f"{name}: a client sending a byte a second is cut by the request deadline "
              f"(after {time.monotonic() - start:.0f} s)")
    s.close()
    code, _, raw = request(host, port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: " +
                           b"a" * 20000 + b"\r\n\r\n", ctx)
    tls.check(code == 431, f"{name}: a 20 KB request head gets 431 with a status line (got {code})", repr(raw))
    for bad in (b"GET /metrics HTTP/1.1\r\nNoColonHere\r\n\r\n", b"GET /metrics FOO/1.1\r\n\r\n"):
        code, _, raw = request(host, port, bad, ctx)
        tls.check(code == 400, f"{name}: a malformed request ({bad[:24]!r}) gets 400 with a status line "
                  f"(got {code})", repr(raw))
    code, _, raw = request(host, port, f"GET /metrics HTTP/1.1\nHost: x\n{auth.strip()}\nConnection: close\n\n".encode(), ctx)
    tls.check(code in (200, 400), f"{name}: a bare-LF request gets a status line (got {code})", repr(raw))


def main():
    tmp = tempfile.mkdtemp(prefix="tw-metrics-siege-")
    for ca in ("ca",):
        tls.openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.pem",
                    "-days", "2", "-subj", f"/CN=test {ca}", cwd=tmp)
    tls.openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "metrics.key", "-out", "metrics.csr",
                "-subj", "/CN=127.0.0.1", cwd=tmp)
    open(f"{tmp}/san.ext", "w").write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    tls.openssl("x509", "-req", "-in", "metrics.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", "metrics.pem", "-days", "2", "-extfile", "san.ext", cwd=tmp)
    password = "s3cret-scrape"
    web = {"tls_server_config": {"cert_file": f"{tmp}/metrics.pem", "key_file": f"{tmp}/metrics.key"},
           "basic_auth_users": {"prometheus": tls.bcrypt(password)}}
    yaml.safe_dump(web, open(f"{tmp}/web.yml", "w"))
    ctx = ssl.create_default_context(cafile=f"{tmp}/ca.pem")

    for name, extra, scheme in (("plain", [], "http"), ("https", ["--web-config-file", f"{tmp}/web.yml"], "https")):
        srv = tls.start([SERVER, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                         "--db", f"{tmp}/{name}.db", *extra], f"{tmp}/{name}.log")
        m = tls.poll("the server's ports",
                     lambda: re.search(rf"/metrics on {scheme}://([^/\s]+):(\d+)/metrics", open(srv.log_path).read()),
                     timeout=20)
        host, port = m.group(1), int(m.group(2))
        auth = basic("prometheus", password) if name == "https" else ""
        c = ctx if name == "https" else None
        siege(name, host, port, get(auth=auth), c)
        edges(name, host, port, auth, c)
        if name == "https":
            code, _, _ = request(host, port, get(auth=basic("prometheus", password, "bAsIc")), c)
            tls.check(code == 200, f"https: the basic-auth scheme is case-insensitive (got {code})")
            code, _, _ = request(host, port, get(auth=basic("prometheus", password + "\0junk")), c)
            tls.check(code == 401, f"https: a password with a NUL suffix is refused (got {code})")
            # The flood: wrong passwords from 8 threads for 3 s.
            counts, lock = {}, threading.Lock()
            before = cpu_seconds(srv.pid)

            def flood(i):
                end, n = time.monotonic() + 3, 0
                while time.monotonic() < end:
                    code, _, _ = request(host, port, get(auth=basic("prometheus", f"wrong-{i}-{n}")), c)
                    n += 1
                    with lock: counts[code] = counts.get(code, 0) + 1

            threads = [threading.Thread(target=flood, args=(i,)) for i in range(8)]
            for t in threads: t.start()
            for t in threads: t.join()
            cpu = cpu_seconds(srv.pid) - before
            attempts = sum(counts.values())
            code, _, _ = request(host, port, get(auth=auth), c)
            tls.check(code == 200, f"https: right after the flood, the right password still scrapes (got {code})")
            print(f"bench wrong-password flood: {attempts} attempts in 3 s from 8 threads, "
                  f"{counts.get(401, 0)} x 401, {counts.get(429, 0)} x 429; server CPU {cpu:.2f} s "
                  f"({1e3 * cpu / max(attempts, 1):.2f} ms an attempt, TLS included)", flush=True)
            tls.check(counts.get(429, 0) > 0 and counts.get(401, 0) <= 2 * 10,
                      f"https: past the per-address limit the flood gets 429 ({counts})")
        srv.terminate()
        srv.wait(timeout=30)
    print(f"{len(tls.failures)} failed" if tls.failures else "all checks passed")
    return 1 if tls.failures else 0


if __name__ == "__main__":
    sys.exit(main())
