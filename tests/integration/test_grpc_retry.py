"""Idempotent calls ride out a peer that is restarting: gRPC retries them by service config, within the deadline."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.grpcio import OPTIONS, channel, make_server
from services.common.ports import free_port


def _serve_later(port: int, delay_s: float) -> list:
    started = []

    def start():
        time.sleep(delay_s)
        server, _ = make_server("127.0.0.1", port, "grpc.health.v1.Health")
        server.start()
        started.append(server)

    threading.Thread(target=start, daemon=True).start()
    return started


def _check(ch: grpc.Channel):
    return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)


def test_an_idempotent_call_to_a_peer_that_comes_back_succeeds():
    port = free_port()
    started = _serve_later(port, 0.8)
    with channel(f"127.0.0.1:{port}") as ch:
        assert _check(ch).status == health_pb2.HealthCheckResponse.SERVING
    started[0].stop(0)


def test_without_the_retry_policy_the_same_call_fails_at_once():
    port = free_port()
    started = _serve_later(port, 0.8)
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=OPTIONS) as ch:
        with pytest.raises(grpc.RpcError) as e:
            _check(ch)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    time.sleep(1)
    started[0].stop(0)
