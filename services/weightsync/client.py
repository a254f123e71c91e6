"""Sender side of a refit, used by the trainer: plan, manifest over gRPC, bytes over the transport, commit."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass

import torch

from protos.grpo.v1 import weights_pb2, weightsync_pb2, weightsync_pb2_grpc
from services.common.grpcio import channel

from . import checksum as cs
from . import manifest as mf
from .pack import expected_tensor, new_ring, packed_buckets
from .plan import ReceiverLayout, TransferPlan, layout_of, make_plan
from .transport import device_of, drop_group, first_line, open_group


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
    apply_s: dict[str, float]
    """Endpoint id -> seconds its LoadWeights took (receive, verify, load, read back)."""


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
    verified = verify(done.results, commit.checksum, plan, dict(named), manifest.checksum_algo)
    return refit_result(done, policy_version, plan, commit.checksum, time.perf_counter() - start, verified)


def refit_result(done, policy_version: int, plan: TransferPlan, checksum: str, refit_s: float, verified: int):
    """The RefitResult of a version every endpoint applied (`done`: the weightsync service's AwaitReply)."""
    return RefitResult(
        policy_version=policy_version,
        payload_bytes=plan.payload_bytes,
        checksum=checksum,
        num_endpoints=len(done.results),
        refit_s=refit_s,
        received_checksums={r.endpoint_id: r.received_checksum for r in done.results},
        num_readback_verified=verified,
        apply_s={r.endpoint_id: r.apply_s for r in done.results},
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
        return weightsync_pb2.CommitRequest(refit_id=reply.refit_id, error=f"sender: {first_line(e)}")
    digests = cs.digests(sums)
    return weightsync_pb2.CommitRequest(refit_id=reply.refit_id, bucket_checksums=digests, checksum=cs.combine(digests))


def verify(results, sent_checksum: str, plan: TransferPlan, named: dict[str, torch.Tensor], algo: str) -> int:
    """Check what every endpoint received and read back against what was sent; return tensors verified
    (those read back whose sources this sender holds: its share, where several ranks send). `algo` is the
    manifest's checksum_algo, whose family the read-back checksums are in."""
    slots = {s.name: s for s in plan.slots}
    read = {n for r in results for n in r.readback_checksums if n in slots}
    held = [n for n in sorted(read) if all(src in named for src in slots[n].sources)]
    want = cs.readback_checksums([(n, expected_tensor(slots[n], named)) for n in held], algo)
    counts = []
    for r in results:
        if r.received_checksum != sent_checksum:
            raise RefitError(f"{r.endpoint_id} received checksum {r.received_checksum}, sent {sent_checksum}")
        mine = [n for n in held if n in r.readback_checksums]
        bad = [n for n in mine if r.readback_checksums[n] != want[n]]
        if bad:
            raise RefitError(f"{r.endpoint_id} holds different values than sent for {bad[:5]}")
        counts.append(len(mine))
    return min(counts, default=0)
