"""WeightSync control service: endpoint registry, layouts, transfer groups, refit completion.

One refit: the sender asks for the Layout, announces the version (PublishVersion), whereupon the service
calls every endpoint's LoadWeights; the bytes and the sender's commit go over the data plane, straight
from sender to receivers; the sender then waits for the endpoints' outcomes (AwaitVersion). Nobody calls
back into a service that is waiting on it. A version whose manifest the run's trainer did not sign is refused
here already (the receivers check it again, and the commit's signature, themselves).
"""

from __future__ import annotations

import logging
import secrets
import threading
import uuid
from concurrent import futures

import grpc

from protos.grpo.v1 import rollout_pb2, weights_pb2, weightsync_pb2, weightsync_pb2_grpc
from services.common.config import WeightsyncSection
from services.common.grpcio import PreconditionError, servicer_edge

from ..transfer.plan import CAST_DTYPES
from ..transfer.signing import check_manifest
from ..transports import choose, kind, several_senders
from .endpoints import EndpointRecord, RefitRecord

log = logging.getLogger(__name__)
_MAX_KEPT_REFITS = 8  # refits nobody awaited (their sender died) are forgotten after this many newer ones
PROBE_TIMEOUT_S = 2.0
"""How long a refit waits for a registered endpoint's Info answer before it leaves that endpoint out. One nobody
listens to any more (a killed worker) is forgotten until it registers again; one whose connection holds but that
does not answer (a stopped or wedged process, a worker that missed its beats) is kept and probed again at the next
refit, which it rejoins once it answers. A live endpoint answers at once on its kept channel."""


class WeightSyncServicer(weightsync_pb2_grpc.WeightSyncServicer):
    def __init__(self, cfg: WeightsyncSection, store_port: int):
        self.cfg, self.store_port = cfg, store_port
        self.transport = choose(cfg.transport)
        self._kind = kind(self.transport)
        self._lock = threading.Lock()
        self._endpoints: dict[str, EndpointRecord] = {}
        self._refits: dict[str, RefitRecord] = {}
        self._latest: str = ""  # refit id of the newest committed version that a joiner can pull
        self._version = 0
        self._epoch = 0
        self._prefix = ""  # the current group's keys in the store: refit/<epoch>/<128 random bits>
        self._group_members: tuple = ()  # (sender_id, num_senders, endpoint ids) of the current group
        self._pool = futures.ThreadPoolExecutor(max_workers=32)

    @servicer_edge
    def RegisterEndpoint(self, request, context):
        if not request.endpoint_id or ":" not in request.grpc_address:
            raise ValueError(f"endpoint needs an id and a host:port address, got {request!r}")
        if request.dtype and request.dtype not in CAST_DTYPES:
            raise ValueError(f"endpoint dtype must be one of {CAST_DTYPES} or empty, got {request.dtype!r}")
        with self._lock:
            record = self._endpoints.setdefault(
                request.endpoint_id, EndpointRecord(request.endpoint_id, request.grpc_address)
            )
            # A process registers once, when it starts: under a known id that is a restarted worker, and the
            # old transfer group holds its dead predecessor (same id, maybe the same address), so it is renewed.
            record.close()
            self._group_members = ()
            record.address, record.dtype = request.grpc_address, request.dtype
            refit = self._refits.get(self._latest)
        if refit is not None:
            # A joiner pulls the current version by itself; the others are not involved.
            self._fan_out(refit, self._latest, [record], self._pull_group(refit))
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
            said = {e.endpoint_id: e.dtype for e in self._endpoints.values() if e.dtype}
        if len(set(said.values())) > 1:
            raise PreconditionError(f"rollout endpoints hold different dtypes {said}: set weightsync.cast_dtype")
        return next(iter(said.values()), "")

    @servicer_edge
    def PublishVersion(self, request, context):
        num_senders = self._check_publish(request)
        refit_id, refit = uuid.uuid4().hex, RefitRecord(request)
        answering = self._probe()
        with self._lock:
            targets = [self._endpoints[e] for e in sorted(self._endpoints) if e in answering]
            if not targets:
                raise PreconditionError(f"no rollout endpoint answers ({len(self._endpoints)} registered)")
            group = self._group(request, num_senders, tuple(e.endpoint_id for e in targets))
            self._refits[refit_id] = refit
            for old in list(self._refits)[:-_MAX_KEPT_REFITS]:
                if old != self._latest:
                    del self._refits[old]
        refit.calls = self._fan_out(refit, refit_id, targets, group)
        return weightsync_pb2.PublishReply(refit_id=refit_id, group=group, num_endpoints=len(targets))

    def _probe(self) -> set[str]:
        """The ids of the endpoints that answer now. The others are left out of the refit: a collective transfer
        with a member that never comes would wait its whole timeout, and then the refit would fail anyway."""
        with self._lock:
            endpoints = list(self._endpoints.values())
            for endpoint in endpoints:
                endpoint.stub()  # its channel, kept across refits
        found = list(self._pool.map(lambda e: e.probe(PROBE_TIMEOUT_S), endpoints))
        answering = set()
        with self._lock:
            for endpoint, state in zip(endpoints, found):
                if not state:
                    answering.add(endpoint.endpoint_id)
                    continue
                if self._endpoints.get(endpoint.endpoint_id) is not endpoint:
                    continue  # registered again meanwhile
                self._group_members = ()
                if state == "gone":
                    log.warning(
                        "endpoint %s at %s is gone: left out of this refit and forgotten until it registers",
                        endpoint.endpoint_id, endpoint.address,
                    )  # fmt: skip
                    endpoint.close()
                    del self._endpoints[endpoint.endpoint_id]
                else:
                    endpoint.last_error = f"left out of a refit: Info did not answer within {PROBE_TIMEOUT_S:.0f}s"
                    log.warning("endpoint %s at %s is hung: %s", endpoint.endpoint_id, endpoint.address,
                                endpoint.last_error)  # fmt: skip
        return answering

    def _check_publish(self, request: weightsync_pb2.PublishRequest) -> int:
        """The request's number of senders, once the request is found sound."""
        m = request.manifest
        if not m.buckets or not m.tensors:
            raise ValueError("manifest needs tensors and buckets")
        if request.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {request.timeout_s}")
        num_senders = max(1, request.num_senders)
        if num_senders > self._kind.max_senders:
            raise ValueError(
                f"several senders need a collective transport ({', '.join(several_senders())}), not {self.transport}"
            )
        bad = [b.index for b in m.buckets if b.sender >= num_senders]
        if bad:
            raise ValueError(f"buckets {bad[:5]} name a sender outside the {num_senders} senders")
        check_manifest(m)  # before any endpoint is called: a forged version costs nobody a transfer
        return num_senders

    def _group(self, request, num_senders: int, members: tuple[str, ...]) -> weights_pb2.TransferGroup:
        """The sender's view of this refit's group (it is rank 0). Called under the lock."""
        # A new membership, a new sender (a restarted trainer) or a failed transfer needs a new
        # rendezvous: receivers would otherwise wait in the old group for a sender that left it.
        if (request.source.sender_id, num_senders, members) != self._group_members:
            self._epoch, self._group_members = self._epoch + 1, (request.source.sender_id, num_senders, members)
            # The store has no authentication (torch's TCPStore): anyone who reaches its port could write a group's
            # rendezvous keys (a rank's address: the weights to a stranger, or a stranger's to the workers) if they
            # could name them. The prefix travels only on the run's authenticated gRPC calls, so it is unguessable.
            self._prefix = f"refit/{self._epoch}/{secrets.token_hex(16)}"
        return weights_pb2.TransferGroup(
            store_host=self.cfg.host,
            store_port=self.store_port,
            prefix=self._prefix,
            world_size=len(members) + num_senders,
            rank=0,
            backend=self.transport,
            timeout_s=request.timeout_s,
            num_senders=num_senders,
        )

    def _pull_group(self, refit: RefitRecord) -> weights_pb2.TransferGroup:
        # A joinable transport needs no rendezvous: the joiner reaches the sender named in the source.
        return weights_pb2.TransferGroup(backend=self.transport, rank=1, world_size=2, timeout_s=refit.timeout_s)

    def _fan_out(
        self, refit: RefitRecord, refit_id: str, targets: list[EndpointRecord], group
    ) -> dict[str, futures.Future]:
        """Call every target's LoadWeights, each with its rank in the group; return the calls."""
        calls = {}
        for rank, endpoint in enumerate(targets, start=max(1, group.num_senders)):
            g = weights_pb2.TransferGroup()
            g.CopyFrom(group)
            g.rank = rank
            req = rollout_pb2.LoadWeightsRequest(
                manifest=refit.request.manifest, group=g, source=refit.request.source, refit_id=refit_id
            )
            with self._lock:
                stub = endpoint.stub()
            call = self._pool.submit(stub.LoadWeights, req, timeout=refit.timeout_s)
            call.add_done_callback(lambda f, e=endpoint.endpoint_id, v=refit.version: self._done(e, v, f))
            calls[endpoint.endpoint_id] = call
        return calls

    def _done(self, endpoint_id: str, version: int, call: futures.Future) -> None:
        """Record each endpoint's outcome as it happens, also when nobody awaits the refit (dead sender)."""
        error = call.exception()
        with self._lock:
            record = self._endpoints.get(endpoint_id)
            if record is None:
                return
            if error is None:
                record.applied_version, record.last_error = max(record.applied_version, version), ""
                return
            record.last_error = _describe(error)
            record.close()
            self._group_members = ()  # force a fresh group next time
            if record.last_error.startswith("UNAVAILABLE"):
                # Nobody listens there any more: drop it so the next refit goes to the living.
                del self._endpoints[endpoint_id]
        log.warning("endpoint %s did not apply version %d: %s", endpoint_id, version, record.last_error)

    @servicer_edge
    def AwaitVersion(self, request, context):
        with self._lock:
            refit = self._refits.get(request.refit_id)
            if refit is None:
                raise ValueError(f"unknown refit_id {request.refit_id!r}")
            if not request.sender_error and self._kind.joinable:
                self._latest = request.refit_id
        if request.sender_error:
            log.warning("the sender of version %d failed: %s", refit.version, request.sender_error)
        results = [_result(e, call, request.timeout_s) for e, call in refit.calls.items()]
        with self._lock:
            if all(r.ok for r in results):
                self._version = max(self._version, refit.version)
            if request.refit_id != self._latest:
                self._refits.pop(request.refit_id, None)
        return weightsync_pb2.AwaitReply(policy_version=self._version, results=results)

    @servicer_edge
    def Status(self, request, context):
        with self._lock:
            endpoints = [self._endpoints[e].status() for e in sorted(self._endpoints)]
            return weightsync_pb2.StatusReply(policy_version=self._version, endpoints=endpoints)


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


def _describe(e: BaseException) -> str:
    if isinstance(e, grpc.RpcError):
        return f"{e.code().name}: {e.details()}"
    return f"{type(e).__name__}: {e}"
