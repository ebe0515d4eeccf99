"""Fixtures for the Python tests: the real trainwatch-server on free loopback
ports with a temporary database, and trainwatchctl.

TRAINWATCH_BUILD_DIR names the CMake build directory (its bin/ holds the
binaries, its python/ the trainwatch package); default: ../../build from this
file. ctest sets it, and PYTHONPATH, to the build being tested.
"""

import os
import pathlib
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
BUILD_DIR = pathlib.Path(os.environ.get("TRAINWATCH_BUILD_DIR", REPO / "build")).resolve()
BIN_DIR = BUILD_DIR / "bin"

# Import the package from the build tree when PYTHONPATH does not say.
if str(BUILD_DIR / "python") not in sys.path:
    sys.path.append(str(BUILD_DIR / "python"))

# The one server launcher (tools/tw_harness.py), shared with the labs.
sys.path.insert(0, str(REPO / "tools"))
import tw_harness  # noqa: E402

eventually = tw_harness.eventually


class Server(tw_harness.Server):
    """One trainwatch-server process of the build under test; a launch that
    fails, or a trainwatchctl that does, fails the test."""

    def __init__(self, tmp_path, extra_args=()):
        try:
            super().__init__(BIN_DIR, tmp_path, args=extra_args)
        except tw_harness.ServerError as e:
            pytest.fail(f"{e} (TRAINWATCH_BUILD_DIR: {BUILD_DIR})")

    def ctl(self, *args, check=True, flags=(), timeout=60):
        try:
            return super().ctl(*args, check=check, flags=flags, timeout=timeout)
        except tw_harness.ServerError as e:
            raise AssertionError(str(e)) from None

    def stop(self, graceful=False):
        super().stop(graceful=graceful)


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def build_dir():
    return BUILD_DIR
