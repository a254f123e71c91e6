"""run.tls on a real gRPC server: the run's certificate opens it; plaintext, another run's certificate and a client
without one do not get past the handshake. The files are private, complete and the run's own."""

from __future__ import annotations

import os
import shutil

import grpc
import pytest

from services.common import tls
from services.common.grpcio import channel, make_server, wait_healthy


@pytest.fixture
def server(tmp_path):
    creds = tls.load(tls.ensure(tmp_path / "run").parent)
    tls.set_current(creds)
    try:
        srv, port = make_server("127.0.0.1", 0, "grpo.v1.Coordinator", secret="0" * 64)
        srv.start()
    finally:
        tls.set_current(None)
    yield f"127.0.0.1:{port}", creds
    srv.stop(0)


def _healthy(address: str, creds: tls.Credentials | None) -> bool:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with channel(address, creds=creds) as ch:
        try:
            health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
            return True
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE, e  # refused in the handshake, not by a servicer
            return False


def test_only_the_runs_certificate_gets_through(server, tmp_path):
    address, creds = server
    assert _healthy(address, creds)
    assert not _healthy(address, None)  # plaintext
    other = tls.load(tls.ensure(tmp_path / "other").parent)
    assert not _healthy(address, other)  # another run's: its CA does not know ours, nor ours its
    assert not _healthy(address, tls.Credentials(creds.ca, b"", b""))  # the CA alone: no client certificate
    tls.set_current(creds)  # as a service of the run: this process's credentials
    try:
        wait_healthy(address, 10)
    finally:
        tls.set_current(None)


def test_the_files_are_private_kept_and_the_ca_key_is_not(tmp_path):
    folder = tls.ensure(tmp_path / "run")
    assert sorted(os.listdir(folder)) == sorted([tls.CA, tls.CERT, tls.KEY])
    assert all((folder / n).stat().st_mode & 0o077 == 0 for n in os.listdir(folder))
    first = tls.load(folder.parent)
    assert tls.load(tls.ensure(tmp_path / "run").parent) == first  # a resumed run keeps its own
    assert tls.load(tmp_path / "none") is None


def test_a_readable_key_or_a_certificate_of_another_ca_is_refused(tmp_path):
    folder = tls.ensure(tmp_path / "run")
    (folder / tls.KEY).chmod(0o644)
    with pytest.raises(tls.TLSError, match="readable by others"):
        tls.load(folder.parent)
    (folder / tls.KEY).chmod(0o600)
    shutil.copy(tls.ensure(tmp_path / "other") / tls.CERT, folder / tls.CERT)
    with pytest.raises(tls.TLSError, match="not signed by"):
        tls.load(folder.parent)
    (folder / tls.CA).unlink()
    with pytest.raises(tls.TLSError, match="lacks ca.pem"):
        tls.ensure(folder.parent)
