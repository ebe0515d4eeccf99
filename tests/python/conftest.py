"""Fixtures for the Python tests: the real trainwatch-server on free loopback
ports with a temporary database, and trainwatchctl.

TRAINWATCH_BUILD_DIR names the CMake build directory (its bin/ holds the
binaries, its python/ the trainwatch package); default: ../../build from this
file. ctest sets it, and PYTHONPATH, to the build being tested.
"""

import json
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
BUILD_DIR = pathlib.Path(os.environ.get("TRAINWATCH_BUILD_DIR", REPO / "build")).resolve()
BIN_DIR = BUILD_DIR / "bin"

# Import the package from the build tree when PYTHONPATH does not say.
if str(BUILD_DIR / "python") not in sys.path:
    sys.path.append(str(BUILD_DIR / "python"))

_READY = re.compile(r"gRPC on ([^:\s]+):(\d+), /metrics on http://([^/\s]+)/metrics")


def _binary(name):
    path = BIN_DIR / name
    if not path.exists():
        pytest.fail(f"{path} not found: build it (cmake --build {BUILD_DIR}) "
                    f"or set TRAINWATCH_BUILD_DIR")
    return str(path)


class Server:
    """One trainwatch-server process."""

    def __init__(self, tmp_path, extra_args=()):
        self.db = tmp_path / "trainwatch.db"
        self.log_path = tmp_path / "server.log"
        self._log = open(self.log_path, "w+")
        self.proc = subprocess.Popen(
            [_binary("trainwatch-server"), "--listen", "127.0.0.1:0",
             "--metrics-listen", "127.0.0.1:0", "--db", str(self.db),
             *extra_args],
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            text = self.log_path.read_text()
            m = _READY.search(text)
            if m:
                self.address = f"{m.group(1)}:{m.group(2)}"
                self.metrics_url = f"http://{m.group(3)}/metrics"
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"trainwatch-server did not start:\n{text}")
            time.sleep(0.05)

    def ctl(self, *args, check=True, flags=()):
        """Runs trainwatchctl against this server (`flags` before the
        command); returns stdout."""
        r = subprocess.run([_binary("trainwatchctl"), "--server", self.address,
                            *flags, *args],
                           capture_output=True, text=True, timeout=60)
        if check and r.returncode != 0:
            raise AssertionError(f"trainwatchctl {' '.join(args)} exited {r.returncode}: "
                                 f"{r.stderr}{r.stdout}")
        return r.stdout

    def ctl_json(self, *args):
        return json.loads(self.ctl(*args, "--json"))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log.close()


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def build_dir():
    return BUILD_DIR
