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

from . import auth, tls

log = logging.getLogger(__name__)

# Batches of token ids exceed gRPC's 4 MiB default; weights never travel here.
MAX_MESSAGE_BYTES = 256 * 2**20
OPTIONS = [  # a channel's; a server receives its service's limit (make_server) and keeps the rest
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]
SMALL_REQUEST_BYTES = 64 * 2**10
"""A request of a call that carries no batch and no manifest (status, paths, counts, addresses): the limit of every
call REQUEST_LIMITS does not name."""
REQUEST_LIMITS = {
    "/grpo.v1.Trainer/Train": MAX_MESSAGE_BYTES,  # a batch of sequences: token ids, logprobs, advantages
    "/grpo.v1.Trainer/ComputeLogprobs": MAX_MESSAGE_BYTES,
    "/grpo.v1.Rollout/LoadWeights": 64 * 2**20,  # a weights manifest: a few hundred bytes per tensor
    "/grpo.v1.WeightSync/PublishVersion": 64 * 2**20,
    "/grpo.v1.WeightSync/AwaitVersion": 2**20,  # may carry the sender's error
}
"""The largest request each call takes; a larger one is RESOURCE_EXHAUSTED before it is parsed, and a server whose
calls are all small does not even receive it whole (its gRPC receive limit is its largest call's)."""


def request_limit(method: str) -> int:
    return REQUEST_LIMITS.get(method, SMALL_REQUEST_BYTES)


def service_request_limit(service: str) -> int:
    """The receive limit of a server of this service ("grpo.v1.Coordinator"): its largest call's."""
    return max([SMALL_REQUEST_BYTES, *(n for m, n in REQUEST_LIMITS.items() if m.startswith(f"/{service}/"))])


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


OPEN = {
    "/grpc.health.v1.Health/Check": "read-only liveness: launchers and compose probe it before they hold a secret",
    "/grpc.health.v1.Health/Watch": "read-only liveness, as Check",
    "/grpc.health.v1.Health/List": "read-only liveness, as Check",
    "/grpo.v1.Coordinator/GetStatus": "read-only progress (step, version, workers); the FastAPI /status says the same",
    "/grpo.v1.Rollout/Info": "read-only: the worker's model, engine and policy version",
    "/grpo.v1.WeightSync/Status": "read-only: the published version and the registered endpoints' count",
}
"""The calls that need no run secret, each with why. Every other call needs it: a call missing from here is locked
by default, whatever LOCKED says."""

LOCKED = {
    "/grpo.v1.Coordinator/StartRun": "starts steps: only the run's launcher or its owner",
    "/grpo.v1.Coordinator/StopRun": "ends the run",
    "/grpo.v1.Coordinator/ScaleRollout": "changes how many workers the launcher keeps",
    "/grpo.v1.Rollout/LoadWeights": "replaces the policy the worker generates with",
    "/grpo.v1.Trainer/Train": "changes the weights",
    "/grpo.v1.Trainer/ComputeLogprobs": "read-only, but a forward pass over any batch the caller sends: costly",
    "/grpo.v1.Trainer/Save": "writes a checkpoint to disk",
    "/grpo.v1.Trainer/Load": "replaces the weights and optimizer from disk",
    "/grpo.v1.Trainer/PublishWeights": "starts a refit of every engine",
    "/grpo.v1.WeightSync/RegisterEndpoint": "adds a receiver of the weights (a fake one stalls every refit)",
    "/grpo.v1.WeightSync/Layout": "sizes and names of every tensor of the run's model, the first step of a publish",
    "/grpo.v1.WeightSync/PublishVersion": "sends a weights version to every engine",
    "/grpo.v1.WeightSync/AwaitVersion": "holds a server thread until a version lands",
}
"""The calls that need the run secret, each with why (the test over the protos' RPCs fails on a call in neither)."""


class PreconditionError(RuntimeError):
    """The call is well-formed but the service is not in a state to serve it."""


class NotTrusted(RuntimeError):
    """A peer this call needed refused this process's run secret (it serves another run, or is locked where this
    run is not): no retry can change that, so the caller stops instead of trying again."""


class _RejectMalformed(grpc.ServerInterceptor):
    """Parse unary requests ourselves so undecodable bytes get INVALID_ARGUMENT, not INTERNAL, and one over its
    call's size limit RESOURCE_EXHAUSTED."""

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None or handler.request_deserializer is None:
            return handler
        parse, behavior = handler.request_deserializer, handler.unary_unary
        method, limit = handler_call_details.method, request_limit(handler_call_details.method)

        def checked(raw: bytes, context: grpc.ServicerContext):
            if len(raw) > limit:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{method}: request of {len(raw)} bytes, over its "
                              f"limit of {limit} (services/common/grpcio.py REQUEST_LIMITS)")  # fmt: skip
            try:
                request = parse(raw)
            except (DecodeError, ValueError) as e:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {e}")
            return behavior(request, context)

        return grpc.unary_unary_rpc_method_handler(
            checked, request_deserializer=None, response_serializer=handler.response_serializer
        )


class _RequireSecret(grpc.ServerInterceptor):
    """Every call outside OPEN carries the run secret in its metadata, or gets UNAUTHENTICATED before any servicer
    code (or the request's parsing) runs."""

    def __init__(self, secret: str):
        self._secret = secret

    def intercept_service(self, continuation, handler_call_details):
        if handler_call_details.method in OPEN:
            return continuation(handler_call_details)
        given = dict(handler_call_details.invocation_metadata or ()).get(auth.METADATA_KEY)
        if auth.matches(given if isinstance(given, str) else None, self._secret):
            return continuation(handler_call_details)
        why = "without the run secret" if given is None else "with a wrong run secret"
        message = f"{handler_call_details.method} called {why} (metadata {auth.METADATA_KEY}; the run's run.secret)"

        def refuse(request, context: grpc.ServicerContext):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

        handler = continuation(handler_call_details)
        if handler is not None and handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(refuse)
        return grpc.unary_unary_rpc_method_handler(refuse)


class _AddSecret(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    def __init__(self, secret: str):
        self._pair = (auth.METADATA_KEY, secret)

    def _with_secret(self, details):
        return details._replace(metadata=[*(details.metadata or ()), self._pair])

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._with_secret(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._with_secret(client_call_details), request)


def make_server(
    host: str, port: int, service: str, max_workers: int = 8, secret: str | None = None
) -> tuple[grpc.Server, int]:
    """A server of `service` ("grpo.v1.Trainer") with health checking (status SERVING for "") bound to host:port;
    returns the bound port. It receives no request larger than the service's largest call takes. With a run secret
    (this process's, auth.current(), unless given) every call outside OPEN must carry it."""
    secret = secret or auth.current()
    interceptors: list[grpc.ServerInterceptor] = [_RejectMalformed()]
    if secret:
        interceptors.insert(0, _RequireSecret(secret))
    else:
        log.warning("no run secret: every call of the server on %s:%d is open", host, port)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers),
        options=[("grpc.max_receive_message_length", service_request_limit(service)), *OPTIONS[1:]],
        interceptors=interceptors,
    )
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    creds = tls.current()
    if creds:  # mutual: a caller without the run's certificate does not get past the handshake
        server_creds = grpc.ssl_server_credentials([(creds.key, creds.cert)], creds.ca, require_client_auth=True)
        bound = server.add_secure_port(f"{host}:{port}", server_creds)
    else:
        bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise ValueError(f"cannot bind gRPC server to {host}:{port}")
    return server, bound


def channel(address: str, secret: str | None = None, creds: tls.Credentials | None = None) -> grpc.Channel:
    """A channel to address whose every call carries the run secret (this process's, unless given), over TLS
    where the run has credentials (this process's, unless given: services/common/tls.py)."""
    options = [*OPTIONS, ("grpc.service_config", SERVICE_CONFIG)]
    creds = creds or tls.current()
    if creds:
        options.append(("grpc.ssl_target_name_override", tls.SERVER_NAME))
        ch = grpc.secure_channel(address, grpc.ssl_channel_credentials(creds.ca, creds.key, creds.cert), options)
    else:
        ch = grpc.insecure_channel(address, options=options)
    secret = secret or auth.current()
    return grpc.intercept_channel(ch, _AddSecret(secret)) if secret else ch


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
    (NotTrusted, grpc.StatusCode.PERMISSION_DENIED),
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
