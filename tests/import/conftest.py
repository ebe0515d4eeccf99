"""Fixtures for the import and report tests: the server fixture of
tests/python (the real trainwatch-server on free loopback ports), and where
the shared test data lives."""

import importlib.util
import os
import pathlib

import pytest

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent

_spec = importlib.util.spec_from_file_location(
    "tw_python_conftest", REPO / "tests" / "python" / "conftest.py")
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)

Server = _base.Server
BUILD_DIR = _base.BUILD_DIR
BIN_DIR = _base.BIN_DIR
SHARED_DIR = pathlib.Path(os.environ.get("TRAINWATCH_SHARED_DIR", REPO.parent / "shared"))


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path)
    yield s
    s.stop()
