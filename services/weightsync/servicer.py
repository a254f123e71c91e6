"""WeightSync control service: endpoint registry, transfer-group plans, refit completion."""

from __future__ import annotations

import threading
import uuid
from concurrent import futures

import grpc

from protos.grpo.v1 import rollout_pb2, rollout_pb2_grpc, weights_pb2, weightsync_pb2, weightsync_pb2_grpc
from services.common.grpcio import PreconditionError, channel, servicer_edge


class _Refit:
    def __init__(self, version: int, endpoints: list[str], calls: list[futures.Future]):
        self.version, self.endpoints, self.calls = version, endpoints, calls


class WeightSyncServicer(weightsync_pb2_grpc.WeightSyncServicer):
    def __init__(self, store_host: str, store_port: int, backend: str):
        self.store_host, self.store_port, self.backend = store_host, store_port, backend
        self._lock = threading.Lock()
        self._endpoints: dict[str, str] = {}
        self._applied: dict[str, int] = {}
        self._refits: dict[str, _Refit] = {}
        self._version = 0
        self._epoch = 0
        self._group_members: tuple[str, ...] = ()
        self._pool = futures.ThreadPoolExecutor(max_workers=32)

    @servicer_edge
    def RegisterEndpoint(self, request, context):
        if not request.endpoint_id or ":" not in request.grpc_address:
            raise ValueError(f"endpoint needs an id and a host:port address, got {request!r}")
        with self._lock:
            self._endpoints[request.endpoint_id] = request.grpc_address
            self._applied.setdefault(request.endpoint_id, 0)
            return weightsync_pb2.RegisterReply(policy_version=self._version)

    @servicer_edge
    def PublishVersion(self, request, context):
        m = request.manifest
        if not m.buckets or not m.tensors or not m.checksum:
            raise ValueError("manifest needs tensors, buckets and a checksum")
        if request.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {request.timeout_s}")
        with self._lock:
            members = tuple(sorted(self._endpoints))
            if not members:
                raise PreconditionError("no rollout endpoint registered")
            # A new membership (or a failed transfer, see AwaitVersion) needs a new rendezvous.
            if members != self._group_members:
                self._epoch, self._group_members = self._epoch + 1, members
            group = weights_pb2.TransferGroup(
                store_host=self.store_host,
                store_port=self.store_port,
                prefix=f"refit/{self._epoch}",
                world_size=len(members) + 1,
                rank=0,
                backend=self.backend,
                timeout_s=request.timeout_s,
            )
            addresses = [self._endpoints[e] for e in members]
        calls = []
        for rank, address in enumerate(addresses, start=1):
            g = weights_pb2.TransferGroup()
            g.CopyFrom(group)
            g.rank = rank
            req = rollout_pb2.LoadWeightsRequest(manifest=m, group=g)
            calls.append(self._pool.submit(_load_weights, address, req, request.timeout_s))
        refit_id = uuid.uuid4().hex
        with self._lock:
            self._refits[refit_id] = _Refit(m.policy_version, list(members), calls)
        return weightsync_pb2.PublishReply(refit_id=refit_id, group=group, num_endpoints=len(members))

    @servicer_edge
    def AwaitVersion(self, request, context):
        with self._lock:
            refit = self._refits.pop(request.refit_id, None)
        if refit is None:
            raise ValueError(f"unknown refit_id {request.refit_id!r}")
        results = []
        for endpoint, call in zip(refit.endpoints, refit.calls):
            try:
                reply = call.result(timeout=request.timeout_s)
                results.append(
                    weightsync_pb2.EndpointResult(
                        endpoint_id=endpoint,
                        ok=True,
                        received_checksum=reply.received_checksum,
                        readback_checksums=dict(reply.readback_checksums),
                        apply_s=reply.apply_s,
                    )
                )
            except Exception as e:  # a failed endpoint is reported, not raised: the caller decides
                results.append(weightsync_pb2.EndpointResult(endpoint_id=endpoint, ok=False, error=_describe(e)))
        with self._lock:
            for r in results:
                if r.ok:
                    self._applied[r.endpoint_id] = refit.version
                elif r.error.startswith("UNAVAILABLE"):
                    # Nobody listens there any more: drop it so the next refit goes to the living.
                    self._endpoints.pop(r.endpoint_id, None)
                    self._applied.pop(r.endpoint_id, None)
            if all(r.ok for r in results):
                self._version = max(self._version, refit.version)
            else:
                self._group_members = ()  # force a fresh group next time
        return weightsync_pb2.AwaitReply(policy_version=self._version, results=results)

    @servicer_edge
    def Status(self, request, context):
        with self._lock:
            return weightsync_pb2.StatusReply(
                policy_version=self._version,
                endpoints=[
                    weightsync_pb2.EndpointStatus(endpoint_id=e, grpc_address=a, applied_version=self._applied[e])
                    for e, a in sorted(self._endpoints.items())
                ],
            )


def _load_weights(address: str, request: rollout_pb2.LoadWeightsRequest, timeout_s: float):
    with channel(address) as ch:
        return rollout_pb2_grpc.RolloutStub(ch).LoadWeights(request, timeout=timeout_s)


def _describe(e: Exception) -> str:
    if isinstance(e, grpc.RpcError):
        return f"{e.code().name}: {e.details()}"
    return f"{type(e).__name__}: {e}"
