"""Sender side of a refit, used by the trainer: one path for one sending rank or many.

Rank 0 asks the weightsync service how the receivers want the weights (Layout) and announces the version
(PublishVersion) with its manifest signed by the run secret; every rank packs and sends its own run of buckets
over the transport; rank 0 commits the checksums of all of them, signed too (signing.py), over the data plane,
right behind the bytes, and waits for the endpoints (AwaitVersion). Every rank then checks what the engines read
back of the tensors it sent.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import grpc
import torch

from protos.grpo.v1 import weights_pb2, weightsync_pb2, weightsync_pb2_grpc
from services.common.grpcio import channel

from ..kernels import checksum as cs
from ..transports import Transports, kind, several_senders
from ..transports.base import Offer, Transfer, Transport, first_line
from . import manifest as mf
from . import signing
from .commit import Commit
from .outcome import RefitError, RefitResult, verify
from .pack import pack_version, packed_buckets
from .plan import ReceiverLayout, SenderLayout, TransferPlan, bucket_senders, layout_of, make_plan
from .ranks import Failed, Ranks
from .timing import Marks, gc_held

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RefitPlan:
    """What every sending rank computes alike from the whole layout and the receivers' wishes."""

    plan: TransferPlan
    senders: tuple[int, ...]
    """The sending rank of each bucket."""
    transport: str
    cast_dtype: str
    """What floating tensors go on the wire as ("" = as held): the ranks' gathers may cast to it already."""
    num_buffers: int
    ucxx_host: str

    def owners(self) -> dict[str, int]:
        """Sender rank of every source tensor: the rank that must hold it whole."""
        return {src: self.senders[slot.bucket] for slot in self.plan.slots for src in slot.sources}


class Sender:
    """One process's sending side of refits: who it is, its ranks, and its transports (made on first use
    and kept, with their groups and buffers, across refits)."""

    def __init__(self, sender_id: str = "", ranks: Ranks | None = None):
        self.ranks = ranks or Ranks()
        self._sender_id = sender_id
        self._transports = Transports()
        self._channels: dict[str, grpc.Channel] = {}
        """By address: the weightsync service's channel, kept across refits (a new one costs a connection)."""

    @property
    def sender_id(self) -> str:
        if not self._sender_id:
            world, who = self.ranks.world, f"{socket.gethostname()}:{os.getpid()}"
            self._sender_id = f"sender {who}" if world == 1 else f"trainer {who} ({world} ranks)"
        return self._sender_id

    def publish(
        self,
        named: list[tuple[str, torch.Tensor]],
        policy_version: int,
        address: str,
        bucket_bytes: int,
        timeout_s: float,
    ) -> RefitResult | None:
        """Plan for the receivers and send one version, every rank holding all of `named`."""
        marks = Marks()
        plan = self.plan(layout_of(named), address, bucket_bytes, timeout_s)
        marks.mark("planned")
        return None if plan is None else self.send(named, plan, policy_version, address, timeout_s, marks)

    def plan(self, layout: SenderLayout, address: str, bucket_bytes: int, timeout_s: float) -> RefitPlan | None:
        """Rank 0 asks how the receivers want the weights and tells the others; every rank plans alike.
        Where asking fails rank 0 raises and the others get None."""
        wanted = self.ranks.on_rank0(lambda: self._layout(address, timeout_s))
        if isinstance(wanted, Failed):
            return None
        reply = weightsync_pb2.ReceiverLayout.FromString(wanted)
        plan = make_plan(layout, ReceiverLayout(reply.cast_dtype, tuple(reply.fuse)), bucket_bytes)
        senders = bucket_senders(plan.bucket_nbytes, self.ranks.world)
        return RefitPlan(plan, senders, reply.transport, reply.cast_dtype, reply.num_buffers, reply.ucxx_host)

    @contextmanager
    def _stub(self, address: str) -> Iterator[weightsync_pb2_grpc.WeightSyncStub]:
        """The service's stub on the kept channel; a failed call drops the channel, so the next refit connects
        afresh instead of waiting out a broken channel's reconnect backoff."""
        if address not in self._channels:
            self._channels[address] = channel(address)
        try:
            yield weightsync_pb2_grpc.WeightSyncStub(self._channels[address])
        except grpc.RpcError:
            self._channels.pop(address).close()
            raise

    def _layout(self, address: str, timeout_s: float) -> bytes:
        with self._stub(address) as stub:
            reply = stub.Layout(weightsync_pb2.LayoutRequest(), timeout=timeout_s)
        if self.ranks.world > kind(reply.transport).max_senders:
            several = ", ".join(several_senders())
            raise ValueError(f"several senders need a collective transport ({several}), not {reply.transport}")
        return reply.SerializeToString()

    def send(
        self,
        named: list[tuple[str, torch.Tensor]],
        plan: RefitPlan,
        policy_version: int,
        address: str,
        timeout_s: float,
        marks: Marks | None = None,
    ) -> RefitResult | None:
        """Send one version, each rank its own buckets of the plan (`named` holds their sources). Rank 0
        returns the result or raises; the others return None. The garbage collector waits (timing.gc_held);
        `marks` (the refit's start, where it planned first) gets its moments, logged at the end."""
        with gc_held():
            return self._send(named, plan, policy_version, address, timeout_s, marks or Marks())

    def _send(
        self, named, plan: RefitPlan, policy_version: int, address: str, timeout_s: float, marks: Marks
    ) -> RefitResult | None:
        start, lookup = marks.elapsed(), dict(named)
        transport = self._transports.get(plan.transport)
        # An in-place ring holds the whole version: receivers read it where it lies until they release it.
        num_buffers = plan.plan.num_buckets if transport.in_place else min(plan.num_buffers, plan.plan.num_buckets)
        ring, offer = transport.offer(max(plan.plan.bucket_nbytes), num_buffers, plan.ucxx_host)
        source = _source(self.sender_id, offer)
        algo = cs.algo_for(transport.device())
        own = [i for i, r in enumerate(plan.senders) if r == self.ranks.rank]
        manifest = signing.sign_manifest(mf.to_manifest(plan.plan, policy_version, algo, plan.senders))
        marks.mark("offered")
        # A ring that holds the version is packed (one launch) before the announcement: the GPU packs while
        # the receivers are called, and nothing is announced where packing fails. (Announcing first, with the
        # packing's host work beside the call, measured no faster: the two share the interpreter.)
        try:
            packed = (own, pack_version(ring, plan.plan, lookup, own)) if transport.in_place else None
        except Exception as e:
            raise RefitError(f"version {policy_version} not sent: packing failed: {first_line(e)}") from e
        marks.mark("packing enqueued")
        with self._stub(address) as stub:
            announced = self.ranks.on_rank0(lambda: self._announce(stub, manifest, source, timeout_s))
            if isinstance(announced, Failed):
                return None
            marks.mark("announced")
            reply = weightsync_pb2.PublishReply.FromString(announced)
            commit = self._transfer(transport, reply, source, manifest, plan, lookup, ring, packed, marks)
            request = weightsync_pb2.AwaitRequest(
                refit_id=reply.refit_id, timeout_s=timeout_s, sender_error=commit.error
            )
            done = self.ranks.on_rank0(lambda: stub.AwaitVersion(request, timeout=timeout_s + 5).SerializeToString())
        if isinstance(done, Failed):
            return None
        marks.mark("awaited")
        done = weightsync_pb2.AwaitReply.FromString(done)
        # The ring is untouched until our next refit; the packing kernel already summed its tensors.
        sent = (ring, packed[1].slot_digests()) if packed is not None else None
        result = self._outcome(done, policy_version, commit, plan, lookup, algo, marks.elapsed() - start, sent)
        marks.mark("verified")
        if not commit.error:
            log.info("refit %s: %s", reply.refit_id, marks)
        return result

    def _announce(self, stub, manifest: weights_pb2.WeightManifest, source, timeout_s: float) -> bytes:
        request = weightsync_pb2.PublishRequest(
            manifest=manifest, timeout_s=timeout_s, source=source, num_senders=self.ranks.world
        )
        return stub.PublishVersion(request, timeout=timeout_s).SerializeToString()

    def _transfer(
        self, transport: Transport, reply, source, manifest, plan: RefitPlan, lookup, ring, packed, marks: Marks
    ) -> Commit:
        """Pack (unless `packed` holds this rank's bucket indices and their packed version) and send this
        rank's buckets, then commit every rank's checksums (or their errors), signed for `manifest`."""
        rank, group = self.ranks.rank, weights_pb2.TransferGroup()
        group.CopyFrom(reply.group)
        group.rank = rank
        transfer = Transfer(group, source, reply.refit_id)
        own, sums, error = [i for i, r in enumerate(plan.senders) if r == rank], [], ""
        try:
            if packed is not None:
                own, sums = packed[0], packed[1].bucket_sums
                buckets = [(i, ring[k][: plan.plan.bucket_nbytes[i]]) for k, i in enumerate(own)]
            else:
                buckets = packed_buckets(plan.plan, lookup, ring, sums, own)
            transport.send(transfer, buckets, plan.plan.bucket_nbytes, plan.senders)
            marks.mark("sent")
            digests = cs.digests(sums)
        except Exception as e:  # the endpoints' side names the failed peer; the commit tells them to stop
            who = "sender" if self.ranks.world == 1 else f"sender rank {rank}"
            digests, error = [], f"{who}: {first_line(e)}"
        commit = Commit.of_shares(self.ranks.gather((own, digests, error)), plan.plan.num_buckets)
        commit = self._commit(transport, transfer, commit, manifest)
        marks.mark("committed")
        transport.end(transfer, failed=bool(commit.error))
        marks.mark("released")
        return commit

    def _commit(
        self, transport: Transport, transfer: Transfer, commit: Commit, manifest: weights_pb2.WeightManifest
    ) -> Commit:
        """Rank 0 sends the commit behind the bytes, signed; other sending ranks take part where the transport
        needs them to. After a failure with several senders nobody does: a rank that failed may not take part,
        and the receivers fail on their deadline."""
        if commit.error and self.ranks.world > 1:
            return commit
        try:
            if self.ranks.rank == 0:
                transport.send_commit(transfer, signing.sign_commit(manifest, commit).encode())
            else:
                transport.receive_commit(transfer)
        except Exception as e:
            return Commit(error=f"commit: {first_line(e)}")
        return commit

    def _outcome(
        self, done, version: int, commit: Commit, plan: RefitPlan, lookup, algo: str, publish_s: float, sent=None
    ):
        rank = self.ranks.rank
        failed = [f"{r.endpoint_id}: {r.error}" for r in done.results if not r.ok]
        if failed or commit.error:
            if rank != 0:
                return None  # rank 0 raises for the trainer
            raise RefitError(f"version {version} not applied: {'; '.join(failed + [commit.error])}")
        try:
            checked = (verify(done.results, commit.checksum, plan.plan, lookup, algo, *(sent or ())), "")
        except RefitError as e:
            checked = (0, f"rank {rank}: {e}" if self.ranks.world > 1 else str(e))
        counts = self.ranks.gather(checked)
        if rank != 0:
            return None
        wrong = [e for _, e in counts if e]
        if wrong:
            raise RefitError("; ".join(wrong))
        return RefitResult(
            policy_version=version,
            payload_bytes=plan.plan.payload_bytes,
            checksum=commit.checksum,
            num_endpoints=len(done.results),
            publish_s=publish_s,
            received_checksums={r.endpoint_id: r.received_checksum for r in done.results},
            num_readback_verified=sum(n for n, _ in counts),
            apply_s={r.endpoint_id: r.apply_s for r in done.results},
        )


def _source(sender_id: str, offer: Offer) -> weights_pb2.DataSource:
    """Where receivers find the bytes besides the group's collective."""
    buffers = [weights_pb2.CudaIpcBuffer(**dataclasses.asdict(b)) for b in offer.ipc_buffers]
    return weights_pb2.DataSource(sender_id=sender_id, ucxx_address=offer.ucxx_address, ipc_buffers=buffers)
