"""WeightSync control service: endpoint registry, layouts, transfer groups, commits, refit completion."""

from __future__ import annotations

import logging
import threading
import uuid
from concurrent import futures

import grpc

from protos.grpo.v1 import rollout_pb2, rollout_pb2_grpc, weights_pb2, weightsync_pb2, weightsync_pb2_grpc
from services.common.config import WeightsyncSection
from services.common.grpcio import PreconditionError, channel, servicer_edge

from .plan import CAST_DTYPES
from .transport import resolve

log = logging.getLogger(__name__)
_MAX_KEPT_REFITS = 8  # refits nobody awaited (their sender died) are forgotten after this many newer ones


class _Refit:
    def __init__(self, request: weightsync_pb2.PublishRequest, endpoints: list[str]):
        self.request, self.endpoints = request, endpoints
        self.calls: list[futures.Future] = []
        self.commit: weightsync_pb2.CommitRequest | None = None


class WeightSyncServicer(weightsync_pb2_grpc.WeightSyncServicer):
    def __init__(self, cfg: WeightsyncSection, store_port: int, address: str):
        self.cfg, self.store_port, self.address = cfg, store_port, address
        self.transport = resolve(cfg.transport)
        self._lock = threading.Condition()
        self._endpoints: dict[str, str] = {}
        self._dtypes: dict[str, str] = {}
        self._applied: dict[str, int] = {}
        self._errors: dict[str, str] = {}
        self._refits: dict[str, _Refit] = {}
        self._latest: str = ""  # refit id of the newest committed version that a joiner can pull (ucxx)
        self._version = 0
        self._epoch = 0
        self._group_members: tuple = ()  # (sender_id, endpoint ids) of the current group
        self._pool = futures.ThreadPoolExecutor(max_workers=32)

    @servicer_edge
    def RegisterEndpoint(self, request, context):
        if not request.endpoint_id or ":" not in request.grpc_address:
            raise ValueError(f"endpoint needs an id and a host:port address, got {request!r}")
        if request.dtype and request.dtype not in CAST_DTYPES:
            raise ValueError(f"endpoint dtype must be one of {CAST_DTYPES} or empty, got {request.dtype!r}")
        with self._lock:
            self._endpoints[request.endpoint_id] = request.grpc_address
            self._dtypes[request.endpoint_id] = request.dtype
            self._applied.setdefault(request.endpoint_id, 0)
            refit = self._refits.get(self._latest)
        if refit is not None:
            # A joiner pulls the current version by itself; the others are not involved.
            self._fan_out(refit, self._latest, [(request.endpoint_id, request.grpc_address)], _pull_group(refit))
        return weightsync_pb2.RegisterReply(policy_version=self._version)

    @servicer_edge
    def Layout(self, request, context):
        c = self.cfg
        return weightsync_pb2.ReceiverLayout(
            transport=self.transport,
            cast_dtype=c.cast_dtype or self._engine_dtype(),
            fuse=list(c.fuse),
            num_buffers=c.num_buffers,
            ucxx_host=c.ucxx_host,
        )

    def _engine_dtype(self) -> str:
        """The dtype every registered engine holds its weights in, so that a trainer with fp32 master
        weights sends bf16 to bf16 engines (half the bytes, and read-back checks that compare like with
        like); "" where none said."""
        with self._lock:
            said = {e: d for e, d in self._dtypes.items() if d}
        if len(set(said.values())) > 1:
            raise PreconditionError(f"rollout endpoints hold different dtypes {said}: set weightsync.cast_dtype")
        return next(iter(said.values()), "")

    @servicer_edge
    def PublishVersion(self, request, context):
        m = request.manifest
        if not m.buckets or not m.tensors:
            raise ValueError("manifest needs tensors and buckets")
        if request.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {request.timeout_s}")
        num_senders = max(1, request.num_senders)
        if num_senders > 1 and self.transport not in ("gloo", "nccl"):
            raise ValueError(f"several senders need a collective transport (gloo, nccl), not {self.transport}")
        bad = [b.index for b in m.buckets if b.sender >= num_senders]
        if bad:
            raise ValueError(f"buckets {bad[:5]} name a sender outside the {num_senders} senders")
        refit_id = uuid.uuid4().hex
        with self._lock:
            members = tuple(sorted(self._endpoints))
            if not members:
                raise PreconditionError("no rollout endpoint registered")
            # A new membership, a new sender (a restarted trainer) or a failed transfer needs a new
            # rendezvous: receivers would otherwise wait in the old group for a sender that left it.
            if (request.source.sender_id, num_senders, members) != self._group_members:
                self._epoch, self._group_members = self._epoch + 1, (request.source.sender_id, num_senders, members)
            group = weights_pb2.TransferGroup(
                store_host=self.cfg.host,
                store_port=self.store_port,
                prefix=f"refit/{self._epoch}",
                world_size=len(members) + num_senders,
                rank=0,
                backend=self.transport,
                timeout_s=request.timeout_s,
                num_senders=num_senders,
            )
            refit = _Refit(request, list(members))
            self._refits[refit_id] = refit
            for old in list(self._refits)[:-_MAX_KEPT_REFITS]:
                if old != self._latest:
                    del self._refits[old]
            targets = [(e, self._endpoints[e]) for e in members]
        self._fan_out(refit, refit_id, targets, group)
        return weightsync_pb2.PublishReply(refit_id=refit_id, group=group, num_endpoints=len(members))

    def _fan_out(self, refit: _Refit, refit_id: str, targets: list[tuple[str, str]], group) -> None:
        for rank, (endpoint, address) in enumerate(targets, start=max(1, group.num_senders)):
            g = weights_pb2.TransferGroup()
            g.CopyFrom(group)
            g.rank = rank
            req = rollout_pb2.LoadWeightsRequest(
                manifest=refit.request.manifest,
                group=g,
                source=refit.request.source,
                refit_id=refit_id,
                commit_address=self.address,
            )
            call = self._pool.submit(_load_weights, address, req, refit.request.timeout_s)
            call.add_done_callback(lambda f, e=endpoint, v=refit.request.manifest.policy_version: self._done(e, v, f))
            refit.calls.append(call)

    def _done(self, endpoint: str, version: int, call: futures.Future) -> None:
        """Record each endpoint's outcome as it happens, also when nobody awaits the refit (dead sender)."""
        error = call.exception()
        with self._lock:
            if error is None:
                self._applied[endpoint] = max(self._applied.get(endpoint, 0), version)
                self._errors[endpoint] = ""
                return
            self._errors[endpoint] = _describe(error)
            self._group_members = ()  # force a fresh group next time
            if self._errors[endpoint].startswith("UNAVAILABLE"):
                # Nobody listens there any more: drop it so the next refit goes to the living.
                self._endpoints.pop(endpoint, None)
                self._applied.pop(endpoint, None)
                self._dtypes.pop(endpoint, None)
        log.warning("endpoint %s did not apply version %d: %s", endpoint, version, self._errors.get(endpoint))

    @servicer_edge
    def CommitVersion(self, request, context):
        with self._lock:
            refit = self._refits.get(request.refit_id)
            if refit is None:
                raise ValueError(f"unknown refit_id {request.refit_id!r}")
            refit.commit = request
            if not request.error and refit.request.source.ucxx_address:
                self._latest = request.refit_id
            self._lock.notify_all()
        return weightsync_pb2.CommitReply()

    @servicer_edge
    def AwaitCommit(self, request, context):
        with self._lock:
            refit = self._refits.get(request.refit_id)
            if refit is None:
                raise ValueError(f"unknown refit_id {request.refit_id!r}")
            if not self._lock.wait_for(lambda: refit.commit is not None, timeout=request.timeout_s):
                sender = refit.request.source.sender_id or "the sender"
                raise TimeoutError(f"{sender} did not commit refit {request.refit_id} within {request.timeout_s:.0f}s")
            return refit.commit

    @servicer_edge
    def AwaitVersion(self, request, context):
        with self._lock:
            refit = self._refits.get(request.refit_id)
        if refit is None:
            raise ValueError(f"unknown refit_id {request.refit_id!r}")
        results = [_result(endpoint, call, request.timeout_s) for endpoint, call in zip(refit.endpoints, refit.calls)]
        with self._lock:
            if all(r.ok for r in results):
                self._version = max(self._version, refit.request.manifest.policy_version)
            if request.refit_id != self._latest:
                self._refits.pop(request.refit_id, None)
        return weightsync_pb2.AwaitReply(policy_version=self._version, results=results)

    @servicer_edge
    def Status(self, request, context):
        with self._lock:
            return weightsync_pb2.StatusReply(
                policy_version=self._version,
                endpoints=[
                    weightsync_pb2.EndpointStatus(
                        endpoint_id=e,
                        grpc_address=a,
                        applied_version=self._applied[e],
                        last_error=self._errors.get(e, ""),
                    )
                    for e, a in sorted(self._endpoints.items())
                ],
            )


def _pull_group(refit: _Refit) -> weights_pb2.TransferGroup:
    # ucxx needs no rendezvous: the joiner connects to the sender's listener named in the source.
    return weights_pb2.TransferGroup(backend="ucxx", rank=1, world_size=2, timeout_s=refit.request.timeout_s)


def _result(endpoint: str, call: futures.Future, timeout_s: float) -> weightsync_pb2.EndpointResult:
    try:
        reply = call.result(timeout=timeout_s)
    except Exception as e:  # a failed endpoint is reported, not raised: the caller decides
        return weightsync_pb2.EndpointResult(endpoint_id=endpoint, ok=False, error=_describe(e))
    return weightsync_pb2.EndpointResult(
        endpoint_id=endpoint,
        ok=True,
        received_checksum=reply.received_checksum,
        readback_checksums=dict(reply.readback_checksums),
        apply_s=reply.apply_s,
    )


def _load_weights(address: str, request: rollout_pb2.LoadWeightsRequest, timeout_s: float):
    with channel(address) as ch:
        return rollout_pb2_grpc.RolloutStub(ch).LoadWeights(request, timeout=timeout_s)


def _describe(e: BaseException) -> str:
    if isinstance(e, grpc.RpcError):
        return f"{e.code().name}: {e.details()}"
    return f"{type(e).__name__}: {e}"
