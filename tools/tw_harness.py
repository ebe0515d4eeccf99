"""The one trainwatch-server launcher of the Python tests and tools
(tests/python, tests/import, tests/deploy, tools/lab, tools/scenario_delays):
the real server on free loopback ports (127.0.0.1:0; its ready line says
where it listens), a database in a work directory, trainwatchctl against it,
and a poll that waits for a condition instead of sleeping.

    server = Server(build / "bin", workdir, args=["--config", "x.yaml"])
    server.ctl("replay", "run.jsonl")
    alerts = server.alerts(run="r")
    server.stop()

Errors are ServerError (a RuntimeError): pytest fixtures turn them into
failures, tools into exits.
"""

import json
import pathlib
import re
import subprocess
import time

# trainwatch-server's ready line (server/main.cc).
READY = re.compile(r"gRPC on ([^:\s]+):(\d+), /metrics on (https?)://([^/\s]+)/metrics")


class ServerError(RuntimeError):
    pass


def eventually(fn, timeout=30.0, interval=0.05, what="the condition"):
    """Calls fn until it returns a true value (returned) or `timeout`
    seconds pass (ServerError naming `what` and the last value)."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise ServerError(f"{what} did not hold within {timeout:g} s (last: {value!r})")
        time.sleep(interval)


class Server:
    """One trainwatch-server process; `args` are its flags after --listen,
    --metrics-listen and --db (a later --listen wins: a restart on the same
    address), `config` a --config file."""

    def __init__(self, bin_dir, workdir, args=(), config=None, db="trainwatch.db", timeout=30.0):
        self.bin_dir = pathlib.Path(bin_dir)
        workdir = pathlib.Path(workdir)
        self.db = workdir / db
        self.log_path = workdir / "server.log"
        for name in ("trainwatch-server", "trainwatchctl"):
            if not (self.bin_dir / name).exists():
                raise ServerError(f"{self.bin_dir / name} not found: build it, or point at the "
                                  "build directory that has it")
        self._log = open(self.log_path, "w+")
        self.proc = subprocess.Popen(
            [str(self.bin_dir / "trainwatch-server"), "--listen", "127.0.0.1:0",
             "--metrics-listen", "127.0.0.1:0", "--db", str(self.db),
             *(("--config", str(config)) if config else ()), *args],
            stdout=self._log, stderr=subprocess.STDOUT)
        try:
            m = eventually(lambda: self.proc.poll() is not None or READY.search(self.log()),
                           timeout, what="trainwatch-server's ready line")
        except ServerError:
            m = None
        if not isinstance(m, re.Match):
            self.stop()
            raise ServerError(f"trainwatch-server did not start:\n{self.log()}")
        self.address = f"{m.group(1)}:{m.group(2)}"
        self.metrics_address = m.group(4)
        self.metrics_url = f"{m.group(3)}://{m.group(4)}/metrics"

    def log(self):
        return self.log_path.read_text()

    def ctl(self, *args, check=True, flags=(), timeout=300):
        """Runs trainwatchctl against this server (`flags` before the
        command); returns stdout, or raises ServerError when it fails and
        `check`."""
        r = subprocess.run([str(self.bin_dir / "trainwatchctl"), "--server", self.address,
                            *flags, *args], capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise ServerError(f"trainwatchctl {' '.join(args)} exited {r.returncode}: "
                              f"{r.stderr}{r.stdout}")
        return r.stdout

    def ctl_json(self, *args):
        return json.loads(self.ctl(*args, "--json"))

    def alerts(self, run=None):
        return self.ctl_json("alerts", *(("--run", run) if run else ()))

    def stop(self, graceful=True):
        """SIGTERM (the server drains and exits 0) and, after 10 s, SIGKILL;
        graceful=False kills at once."""
        if self.proc.poll() is None:
            if graceful:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            else:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()
