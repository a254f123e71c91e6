"""Sender side of a refit, used by the trainer: plan, manifest over gRPC, bytes over the transport, commit."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from protos.grpo.v1 import weights_pb2, weightsync_pb2, weightsync_pb2_grpc
from services.common.grpcio import channel

from . import checksum as cs
from . import manifest as mf
from .pack import expected_tensor, new_ring, packed_buckets
from .plan import ReceiverLayout, SenderLayout, TransferPlan, bucket_senders, layout_of, make_plan
from .transport import device_of, drop_group, open_group


@dataclass(frozen=True, slots=True)
class RefitResult:
    policy_version: int
    payload_bytes: int
    checksum: str
    num_endpoints: int
    refit_s: float
    received_checksums: dict[str, str]
    """Endpoint id -> checksum it recomputed over what arrived (equal to `checksum`)."""
    num_readback_verified: int
    """Tensors read back from every engine and found equal to the sent ones (min over endpoints)."""


class RefitError(RuntimeError):
    """Some endpoint did not apply the version; the previous version stays in service there."""


def publish(
    named: list[tuple[str, torch.Tensor]],
    policy_version: int,
    address: str,
    bucket_bytes: int,
    timeout_s: float,
    *,
    sender_id: str = "",
) -> RefitResult:
    """Send one version to every registered endpoint, in the layout and over the transport they asked for."""
    start = time.perf_counter()
    sender_id = sender_id or f"sender {socket.gethostname()}:{os.getpid()}"
    with channel(address) as ch:
        stub = weightsync_pb2_grpc.WeightSyncStub(ch)
        layout = stub.Layout(weightsync_pb2.LayoutRequest(), timeout=timeout_s)
        device = device_of(layout.transport)
        plan = make_plan(layout_of(named), ReceiverLayout(layout.cast_dtype, tuple(layout.fuse)), bucket_bytes)
        ring, source = _prepare(layout, plan, device, sender_id)
        manifest = mf.to_manifest(plan, policy_version, cs.algo_for(device))
        reply = stub.PublishVersion(
            weightsync_pb2.PublishRequest(manifest=manifest, timeout_s=timeout_s, source=source), timeout=timeout_s
        )
        commit = _send(reply, source, plan, dict(named), ring)
        stub.CommitVersion(commit, timeout=timeout_s)
        done = stub.AwaitVersion(
            weightsync_pb2.AwaitRequest(refit_id=reply.refit_id, timeout_s=timeout_s), timeout=timeout_s + 5
        )
    failed = [f"{r.endpoint_id}: {r.error}" for r in done.results if not r.ok]
    if failed or commit.error:
        raise RefitError(f"version {policy_version} not applied: {'; '.join(failed + [commit.error])}")
    refit_s = time.perf_counter() - start
    verified = verify(done.results, commit.checksum, plan, dict(named))
    received = {r.endpoint_id: r.received_checksum for r in done.results}
    return RefitResult(
        policy_version, plan.payload_bytes, commit.checksum, reply.num_endpoints, refit_s, received, verified
    )


def _prepare(layout, plan: TransferPlan, device: torch.device, sender_id: str):
    """The buffers to pack into, and where receivers find the bytes besides the group's collective."""
    source = weights_pb2.DataSource(sender_id=sender_id)
    if layout.transport == "cuda_ipc":
        from .cuda_ipc import shared_ring

        ring, shared = shared_ring(plan, device, layout.num_buffers)
        source.ipc_buffers.extend(weights_pb2.CudaIpcBuffer(**_fields(b)) for b in shared)
        return ring, source
    if layout.transport == "ucxx":
        from .ucxx_pull import bucket_server

        source.ucxx_address = bucket_server(layout.ucxx_host).address
    return new_ring(plan, device, layout.num_buffers), source


def _fields(b) -> dict:
    return {f: getattr(b, f) for f in b.__slots__}


def _send(reply, source, plan: TransferPlan, lookup: dict[str, torch.Tensor], ring) -> weightsync_pb2.CommitRequest:
    """Pack and send every bucket; the commit carries the checksums, or the error that stopped us."""
    sums: list = []
    try:
        transport = open_group(reply.group, source)
        wait_free = getattr(transport, "wait_free", None)  # cuda_ipc: readers in other processes
        buckets = packed_buckets(plan, lookup, ring, sums, wait_free(reply.refit_id) if wait_free else None)
        transport.send(buckets, reply.refit_id)
    except Exception as e:  # the endpoints' side names the failed peer; the commit tells them to stop
        drop_group(reply.group)
        text = str(e).strip().splitlines()
        return weightsync_pb2.CommitRequest(
            refit_id=reply.refit_id, error=f"sender: {type(e).__name__}: {text[0] if text else ''}"
        )
    digests = cs.digests(sums)
    return weightsync_pb2.CommitRequest(refit_id=reply.refit_id, bucket_checksums=digests, checksum=cs.combine(digests))


def verify(results, sent_checksum: str, plan: TransferPlan, named: dict[str, torch.Tensor]) -> int:
    """Check what every endpoint received and read back against what was sent; return tensors verified
    (those read back whose sources this sender holds: its share, where several ranks send)."""
    slots = {s.name: s for s in plan.slots}
    counts = []
    for r in results:
        if r.received_checksum != sent_checksum:
            raise RefitError(f"{r.endpoint_id} received checksum {r.received_checksum}, sent {sent_checksum}")
        held = [n for n in r.readback_checksums if n in slots and all(src in named for src in slots[n].sources)]
        bad = [n for n in held if r.readback_checksums[n] != cs.tensor_checksum(expected_tensor(slots[n], named))]
        if bad:
            raise RefitError(f"{r.endpoint_id} holds different values than sent for {bad[:5]}")
        counts.append(len(held))
    return min(counts, default=0)


@dataclass(frozen=True, slots=True)
class SharePlan:
    """What every sending rank computes alike from the whole layout: the plan, each bucket's sender."""

    plan: TransferPlan
    senders: tuple[int, ...]
    transport: str

    def owners(self) -> dict[str, int]:
        """Sender rank of every source tensor: the rank that must hold it whole."""
        return {src: self.senders[slot.bucket] for slot in self.plan.slots for src in slot.sources}


def share_plan(
    layout: SenderLayout, address: str, bucket_bytes: int, timeout_s: float, group: dist.ProcessGroup | None = None
) -> SharePlan | None:
    """Collective over the sending ranks: rank 0 asks the weightsync service how the receivers want the
    weights and tells the others, and every rank plans alike. If that fails rank 0 raises and the other
    ranks get None (they must not fail: a trainer rank that raises takes the trainer down)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    wanted: list = [None]
    failure = None
    if rank == 0:
        try:
            with channel(address) as ch:
                reply = weightsync_pb2_grpc.WeightSyncStub(ch).Layout(weightsync_pb2.LayoutRequest(), timeout=timeout_s)
            if reply.transport not in ("gloo", "nccl"):
                raise ValueError(f"several senders need a collective transport (gloo, nccl), not {reply.transport}")
            wanted = [reply.SerializeToString()]
        except Exception as e:
            failure, wanted = e, [""]
    dist.broadcast_object_list(wanted, src=0, group=group)
    if failure is not None:
        raise failure
    if not wanted[0]:
        return None
    reply = weightsync_pb2.ReceiverLayout.FromString(wanted[0])
    plan = make_plan(layout, ReceiverLayout(reply.cast_dtype, tuple(reply.fuse)), bucket_bytes)
    return SharePlan(plan, bucket_senders(plan.bucket_nbytes, world), reply.transport)


def publish_share(
    named: list[tuple[str, torch.Tensor]],
    share: SharePlan,
    policy_version: int,
    address: str,
    timeout_s: float,
    *,
    group: dist.ProcessGroup | None = None,
    sender_id: str = "",
) -> RefitResult | None:
    """One version sent by every rank of `group` (the trainer's ranks), each its own buckets of the plan:
    `named` holds the sources of this rank's buckets. Rank 0 announces the version, gathers the other
    ranks' bucket checksums (or errors) and commits; it returns the result, the others None."""
    start, plan, senders = time.perf_counter(), share.plan, share.senders
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    sender_id = sender_id or f"trainer {socket.gethostname()}:{os.getpid()} ({world} ranks)"
    source = weights_pb2.DataSource(sender_id=sender_id)
    with channel(address) as ch:
        stub = weightsync_pb2_grpc.WeightSyncStub(ch)
        announced = [None]
        if rank == 0:
            try:
                manifest = mf.to_manifest(plan, policy_version, cs.algo_for(device_of(share.transport)), senders)
                request = weightsync_pb2.PublishRequest(
                    manifest=manifest, timeout_s=timeout_s, source=source, num_senders=world
                )
                announced = [stub.PublishVersion(request, timeout=timeout_s).SerializeToString()]
            except Exception as e:  # the other ranks wait for the announcement: they must hear of it
                announced = [f"{type(e).__name__}: {e}"]
        dist.broadcast_object_list(announced, src=0, group=group)
        if isinstance(announced[0], str):
            if rank != 0:
                return None  # rank 0 raises for the trainer
            raise RefitError(f"version {policy_version} not announced: {announced[0]}")
        reply = weightsync_pb2.PublishReply.FromString(announced[0])
        own, sums, error = [i for i, r in enumerate(senders) if r == rank], [], ""
        try:
            transfer = weights_pb2.TransferGroup()
            transfer.CopyFrom(reply.group)
            transfer.rank = rank
            transport = open_group(transfer, source)
            device = transport.device
            ring = new_ring(plan, device, 2)
            scratch = torch.empty(max(plan.bucket_nbytes), dtype=torch.uint8, device=device)
            buckets = packed_buckets(plan, dict(named), ring, sums, indices=own)
            transport.send_share(buckets, senders, lambda i: scratch[: plan.bucket_nbytes[i]])
            digests = cs.digests(sums)
        except Exception as e:
            drop_group(reply.group)
            text = str(e).strip().splitlines()
            digests, error = [], f"sender rank {rank}: {type(e).__name__}: {text[0] if text else ''}"
        shares = [None] * world if rank == 0 else None
        dist.gather_object((own, digests, error), shares, dst=0, group=group)
        outcome = [None]
        if rank == 0:
            try:
                outcome = [_commit_and_await(stub, reply.refit_id, plan, shares, timeout_s)]
            except Exception as e:  # the other ranks wait for the outcome: they must hear of it
                outcome = [(b"", "", f"{type(e).__name__}: {e}")]
        dist.broadcast_object_list(outcome, src=0, group=group)
    done_bytes, checksum, failure = outcome[0]
    done = weightsync_pb2.AwaitReply.FromString(done_bytes)
    failed = [f"{r.endpoint_id}: {r.error}" for r in done.results if not r.ok]
    if failed or failure:
        if rank != 0:
            return None  # rank 0 raises for the trainer
        raise RefitError(f"version {policy_version} not applied: {'; '.join(failed + [failure])}")
    # Every rank checks what the engines read back of the tensors it sent.
    try:
        checked = (verify(done.results, checksum, plan, dict(named)), "")
    except RefitError as e:
        checked = (0, f"rank {rank}: {e}")
    counts = [None] * world if rank == 0 else None
    dist.gather_object(checked, counts, dst=0, group=group)
    if rank != 0:
        return None
    wrong = [e for _, e in counts if e]
    if wrong:
        raise RefitError("; ".join(wrong))
    received = {r.endpoint_id: r.received_checksum for r in done.results}
    verified = sum(n for n, _ in counts)
    refit_s = time.perf_counter() - start
    return RefitResult(policy_version, plan.payload_bytes, checksum, reply.num_endpoints, refit_s, received, verified)


def _commit_and_await(
    stub, refit_id: str, plan: TransferPlan, shares: list, timeout_s: float
) -> tuple[bytes, str, str]:
    """Rank 0: commit the senders' bucket checksums in bucket order (or their errors), then wait for every
    endpoint; returns (AwaitReply bytes, the version's checksum, the senders' errors)."""
    by_bucket, errors = [""] * plan.num_buckets, [e for _, _, e in shares if e]
    for indices, digests, _ in shares:
        for i, digest in zip(indices, digests):
            by_bucket[i] = digest
    commit = weightsync_pb2.CommitRequest(refit_id=refit_id)
    if errors:
        commit.error = "; ".join(errors)
    else:
        commit.bucket_checksums.extend(by_bucket)
        commit.checksum = cs.combine(by_bucket)
    stub.CommitVersion(commit, timeout=timeout_s)
    done = stub.AwaitVersion(weightsync_pb2.AwaitRequest(refit_id=refit_id, timeout_s=timeout_s), timeout=timeout_s + 5)
    return done.SerializeToString(), commit.checksum, commit.error
