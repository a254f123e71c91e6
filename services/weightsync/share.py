"""Sender side of a refit from several trainer ranks: each gathers and sends its own run of buckets.

Only collective transports (gloo, NCCL): every sender and receiver is a member of one group, and each
bucket is broadcast from the rank that owns it. Rank 0 announces the version and commits the checksums
of all ranks; a failure anywhere reaches rank 0 as a message, and no other rank raises (a trainer rank
that raises takes the trainer down).
"""

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
from .client import RefitError, RefitResult, refit_result, verify
from .pack import new_ring, packed_buckets
from .plan import ReceiverLayout, SenderLayout, TransferPlan, bucket_senders, make_plan
from .transport import device_of, drop_group, first_line, open_group


@dataclass(frozen=True, slots=True)
class SharePlan:
    """What every sending rank computes alike from the whole layout: the plan, each bucket's sender."""

    plan: TransferPlan
    senders: tuple[int, ...]
    transport: str
    cast_dtype: str
    """What floating tensors go on the wire as ("" = as held): the ranks' gathers may cast to it already."""

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
    return SharePlan(plan, bucket_senders(plan.bucket_nbytes, world), reply.transport, reply.cast_dtype)


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
    algo = cs.algo_for(device_of(share.transport))
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    sender_id = sender_id or f"trainer {socket.gethostname()}:{os.getpid()} ({world} ranks)"
    source = weights_pb2.DataSource(sender_id=sender_id)
    with channel(address) as ch:
        stub = weightsync_pb2_grpc.WeightSyncStub(ch)
        announced = [None]
        if rank == 0:
            try:
                manifest = mf.to_manifest(plan, policy_version, algo, senders)
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
            digests, error = [], f"sender rank {rank}: {first_line(e)}"
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
        checked = (verify(done.results, checksum, plan, dict(named), algo), "")
    except RefitError as e:
        checked = (0, f"rank {rank}: {e}")
    counts = [None] * world if rank == 0 else None
    dist.gather_object(checked, counts, dst=0, group=group)
    if rank != 0:
        return None
    wrong = [e for _, e in counts if e]
    if wrong:
        raise RefitError("; ".join(wrong))
    verified = sum(n for n, _ in counts)
    return refit_result(done, policy_version, plan, checksum, time.perf_counter() - start, verified)


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
