"""Sender side of a refit, used by the trainer: manifest over gRPC, bytes over the transport."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from protos.grpo.v1 import weightsync_pb2, weightsync_pb2_grpc
from services.common.grpcio import channel

from . import manifest as mf
from .transport import drop_group, open_group


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
    named: list[tuple[str, torch.Tensor]], policy_version: int, address: str, bucket_bytes: int, timeout_s: float
) -> RefitResult:
    start = time.perf_counter()
    manifest, buckets = mf.build(named, policy_version, bucket_bytes)
    with channel(address) as ch:
        stub = weightsync_pb2_grpc.WeightSyncStub(ch)
        plan = stub.PublishVersion(
            weightsync_pb2.PublishRequest(manifest=manifest, timeout_s=timeout_s), timeout=timeout_s
        )
        send_error = None
        try:
            open_group(plan.group).send(buckets)
        except Exception as e:  # still collect the endpoints' side, which names the failed peer
            drop_group(plan.group)
            send_error = f"sender: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        reply = stub.AwaitVersion(
            weightsync_pb2.AwaitRequest(refit_id=plan.refit_id, timeout_s=timeout_s), timeout=timeout_s
        )
    failed = [f"{r.endpoint_id}: {r.error}" for r in reply.results if not r.ok]
    if failed or send_error:
        drop_group(plan.group)
        raise RefitError(f"version {policy_version} not applied: {'; '.join(failed + [send_error or ''])}")
    refit_s = time.perf_counter() - start
    verified = verify(reply.results, manifest.checksum, dict(named))
    received = {r.endpoint_id: r.received_checksum for r in reply.results}
    return RefitResult(
        policy_version, manifest.payload_bytes, manifest.checksum, plan.num_endpoints, refit_s, received, verified
    )


def verify(results, sent_checksum: str, named: dict[str, torch.Tensor]) -> int:
    """Check what every endpoint received and read back against what was sent; return tensors verified."""
    counts = []
    for r in results:
        if r.received_checksum != sent_checksum:
            raise RefitError(f"{r.endpoint_id} received checksum {r.received_checksum}, sent {sent_checksum}")
        bad = [n for n, c in r.readback_checksums.items() if c != mf.tensor_checksum(named[n])]
        if bad:
            raise RefitError(f"{r.endpoint_id} holds different values than sent for {bad[:5]}")
        counts.append(len(r.readback_checksums))
    return min(counts, default=0)
