"""What the weightsync service keeps: one record per rollout endpoint, one per refit in flight."""

from __future__ import annotations

import socket
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from protos.grpo.v1 import rollout_pb2, rollout_pb2_grpc, weightsync_pb2
from services.common.grpcio import channel


@dataclass(slots=True)
class EndpointRecord:
    """A registered rollout endpoint and how its refits went."""

    endpoint_id: str
    address: str
    """host:port of its Rollout service."""
    dtype: str = ""
    """Dtype of the engine's floating weights ("" = not said)."""
    applied_version: int = 0
    last_error: str = ""
    """Why its last refit failed ("" after a success)."""
    _channel: grpc.Channel | None = field(default=None, repr=False)

    def stub(self) -> rollout_pb2_grpc.RolloutStub:
        """Its Rollout stub, on a channel kept across refits (a new one per call costs a connection)."""
        if self._channel is None:
            self._channel = channel(self.address)
        return rollout_pb2_grpc.RolloutStub(self._channel)

    def probe(self, timeout_s: float) -> str:
        """ "" if its worker answers Info within timeout_s; else "gone" (nothing listens at its address any more: a
        killed worker) or "hung" (its port still accepts a connection but nothing answers: a stopped or wedged
        process). Call stub() first, under the registry's lock: that makes the channel."""
        assert self._channel is not None
        try:
            rollout_pb2_grpc.RolloutStub(self._channel).Info(rollout_pb2.InfoRequest(), timeout=timeout_s)
            return ""
        except grpc.RpcError:
            pass
        # gRPC cannot tell the two apart (a fresh channel to a stopped process never becomes ready either); the
        # kernel can: it still accepts connections on a stopped process's listening socket.
        host, port = self.address.rsplit(":", 1)
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
            return "hung"
        except OSError:
            return "gone"

    def close(self) -> None:
        """Drop the channel (a new address, a failed call): the next call connects afresh."""
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def status(self) -> weightsync_pb2.EndpointStatus:
        return weightsync_pb2.EndpointStatus(
            endpoint_id=self.endpoint_id,
            grpc_address=self.address,
            applied_version=self.applied_version,
            last_error=self.last_error,
        )


@dataclass(slots=True)
class RefitRecord:
    """One announced version: what the sender published, and each endpoint's LoadWeights call."""

    request: weightsync_pb2.PublishRequest
    calls: dict[str, futures.Future] = field(default_factory=dict)
    """Endpoint id -> its LoadWeights call, in rank order (a joiner's pull is not one of them)."""

    @property
    def version(self) -> int:
        return self.request.manifest.policy_version

    @property
    def timeout_s(self) -> float:
        return self.request.timeout_s
