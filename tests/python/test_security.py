"""trainwatch.Client's auth_token and TLS options through the binding, against
the real server with TLS and a token file (docs/security.md). Certificates
are made with the openssl CLI."""

import json
import subprocess
import time

import pytest

import trainwatch
from conftest import Server

WRITER = "python-writer-0123456789"
READER = "python-reader-0123456789"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=tw-python-ca")
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-out", "server.pem", "-extfile", "server.ext")
    tokens = d / "tokens"
    tokens.write_text(f"{WRITER} write:py/\n{READER} read\n")
    tokens.chmod(0o600)
    (d / "reader.token").write_text(READER + "\n")
    return d


@pytest.fixture
def secure_server(tmp_path, pki):
    s = Server(tmp_path, ["--tls-cert", str(pki / "server.pem"),
                          "--tls-key", str(pki / "server.key"),
                          "--auth-token-file", str(pki / "tokens")])
    yield s
    s.stop()


def test_token_and_tls_deliver(secure_server, pki):
    with trainwatch.Client(secure_server.address, run="py/secure", max_norm=1.0,
                           auth_token=WRITER, tls_ca_file=pki / "ca.pem") as tw:
        for step in range(20):
            assert tw.record(step, grad_norm=0.5 + step / 100)
        tw.flush(timeout=30)
        assert tw.stats.acked == 20
        assert tw.refusal is None
    out = secure_server.ctl("steps", "--run", "py/secure", "--json",
                            flags=("--tls-ca", str(pki / "ca.pem"),
                                   "--token-file", str(pki / "reader.token")))
    assert [s["step"] for s in json.loads(out)] == list(range(20))


@pytest.mark.parametrize("token, code", [
    (None, "UNAUTHENTICATED"),
    ("python-wrong-0123456789", "UNAUTHENTICATED"),
    (READER, "PERMISSION_DENIED"),
])
def test_refusal_is_raised_by_flush_and_shown(secure_server, pki, token, code,
                                              monkeypatch):
    monkeypatch.delenv("TRAINWATCH_TOKEN", raising=False)
    tw = trainwatch.Client(secure_server.address, run="py/refused",
                           auth_token=token, tls_ca_file=str(pki / "ca.pem"))
    assert tw.record(0, grad_norm=0.5)
    start = time.monotonic()
    with pytest.raises(PermissionError, match=code):
        tw.flush(timeout=60)
    # The refusal ends the wait, not the 60 s timeout (generous bound).
    assert time.monotonic() - start < 30
    assert tw.refusal.startswith(code)
    assert tw.close(timeout=5) is False


def test_write_token_outside_its_prefix(secure_server, pki):
    tw = trainwatch.Client(secure_server.address, run="other/run",
                           auth_token=WRITER, tls_ca_file=str(pki / "ca.pem"))
    tw.record(0, grad_norm=0.5)
    with pytest.raises(PermissionError, match='run other/run: .* may write only runs under "py/"'):
        tw.flush(timeout=60)
    tw.close(timeout=5)


def test_token_from_the_environment(secure_server, pki, monkeypatch):
    monkeypatch.setenv("TRAINWATCH_TOKEN", WRITER + "\n")
    with trainwatch.Client(secure_server.address, run="py/env",
                           tls_ca_file=str(pki / "ca.pem")) as tw:
        tw.record(0, grad_norm=0.5)
        tw.flush(timeout=30)
        assert tw.stats.acked == 1


def test_tls_files_are_checked_at_construction(tmp_path):
    with pytest.raises(FileNotFoundError, match="TLS CA file .*missing.pem"):
        trainwatch.Client("127.0.0.1:1", run="r", tls_ca_file=tmp_path / "missing.pem")
    (tmp_path / "junk.pem").write_text("junk")
    with pytest.raises(ValueError, match="no PEM data"):
        trainwatch.Client("127.0.0.1:1", run="r", tls_ca_file=tmp_path / "junk.pem")
    with pytest.raises(ValueError, match="certificate and its key go together"):
        trainwatch.Client("127.0.0.1:1", run="r", tls_cert_file=tmp_path / "junk.pem")
    with pytest.raises(ValueError, match="not printable"):
        trainwatch.Client("127.0.0.1:1", run="r", auth_token="two words")
