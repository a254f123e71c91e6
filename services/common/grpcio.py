"""gRPC plumbing every service shares: servers with health checking, channels, error mapping."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from concurrent import futures

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

log = logging.getLogger(__name__)

# Batches of token ids exceed gRPC's 4 MiB default; weights never travel here.
MAX_MESSAGE_BYTES = 256 * 2**20
OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]

IDEMPOTENT = {
    "grpo.v1.Coordinator": ("GetStatus",),
    "grpo.v1.Rollout": ("Info",),
    "grpo.v1.Trainer": ("ComputeLogprobs",),
    "grpo.v1.WeightSync": ("RegisterEndpoint", "Layout", "Status"),
    "grpc.health.v1.Health": ("Check",),
}
"""Calls that may run twice with the same effect: gRPC retries them (within their deadline) when the peer is
UNAVAILABLE, a restarting service or a dropped connection. The others (Train, StartRun, a refit) are never
retried behind the caller's back: the caller decides."""

SERVICE_CONFIG = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{"service": service, "method": m} for service, methods in IDEMPOTENT.items() for m in methods],
                "retryPolicy": {
                    "maxAttempts": 5,
                    "initialBackoff": "0.2s",
                    "maxBackoff": "3s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)


class PreconditionError(RuntimeError):
    """The call is well-formed but the service is not in a state to serve it."""


class _RejectMalformed(grpc.ServerInterceptor):
    """Parse unary requests ourselves so undecodable bytes get INVALID_ARGUMENT, not INTERNAL."""

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None or handler.request_deserializer is None:
            return handler
        parse, behavior = handler.request_deserializer, handler.unary_unary

        def checked(raw: bytes, context: grpc.ServicerContext):
            try:
                request = parse(raw)
            except (DecodeError, ValueError) as e:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {e}")
            return behavior(request, context)

        return grpc.unary_unary_rpc_method_handler(
            checked, request_deserializer=None, response_serializer=handler.response_serializer
        )


def make_server(host: str, port: int, max_workers: int = 8) -> tuple[grpc.Server, int]:
    """A server with health checking (status SERVING for "") bound to host:port; returns the bound port."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers), options=OPTIONS, interceptors=[_RejectMalformed()]
    )
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise ValueError(f"cannot bind gRPC server to {host}:{port}")
    return server, bound


def channel(address: str) -> grpc.Channel:
    return grpc.insecure_channel(address, options=[*OPTIONS, ("grpc.service_config", SERVICE_CONFIG)])


def wait_healthy(address: str, timeout_s: float) -> None:
    """Block until the server at address answers SERVING, or raise TimeoutError."""
    with channel(address) as ch:
        try:
            grpc.channel_ready_future(ch).result(timeout=timeout_s)
        except grpc.FutureTimeoutError:
            raise TimeoutError(f"no gRPC server at {address} after {timeout_s:.0f}s") from None
        reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
        if reply.status != health_pb2.HealthCheckResponse.SERVING:
            raise TimeoutError(f"gRPC server at {address} is not serving: {reply.status}")


_STATUS_OF = [
    (ValueError, grpc.StatusCode.INVALID_ARGUMENT),
    (TimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED),
    (PreconditionError, grpc.StatusCode.FAILED_PRECONDITION),
]


def servicer_edge(fn: Callable) -> Callable:
    """Map exceptions of a servicer method to gRPC status codes with an actionable message."""

    @functools.wraps(fn)
    def wrapper(self, request, context: grpc.ServicerContext):
        try:
            return fn(self, request, context)
        except grpc.RpcError:
            raise
        except Exception as e:
            code = next((c for t, c in _STATUS_OF if isinstance(e, t)), grpc.StatusCode.INTERNAL)
            if code is grpc.StatusCode.INTERNAL:
                log.exception("%s failed", fn.__name__)
            context.abort(code, f"{fn.__name__}: {type(e).__name__}: {e}")

    return wrapper
