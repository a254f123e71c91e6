"""Receiver side of a refit, used by rollout workers: bytes in, checksums verified, then tensors out."""

from __future__ import annotations

import torch

from protos.grpo.v1 import rollout_pb2, weightsync_pb2, weightsync_pb2_grpc
from services.common.grpcio import channel

from . import manifest as mf
from .checksum import combine
from .pack import unpack
from .transport import drop_group, first_line, open_group, receive_buckets


class PeerError(RuntimeError):
    """The sender died, stalled or aborted; the message names it. Nothing was applied."""


def receive_version(request: rollout_pb2.LoadWeightsRequest) -> tuple[list[tuple[str, torch.Tensor]], str]:
    """Receive every bucket, verify each against the sender's committed checksum; return tensors and checksum."""
    m, group = request.manifest, request.group
    plan = mf.plan_of(m)
    sender = request.source.sender_id or "the sender"
    transport = None
    try:
        transport = open_group(group, request.source)
        senders = [b.sender for b in m.buckets]
        buckets, sums = receive_buckets(transport, list(plan.bucket_nbytes), m.checksum_algo, request.refit_id, senders)
    except Exception as e:
        drop_group(group)
        raise PeerError(f"transfer of version {m.policy_version} from {sender} failed: {first_line(e)}") from e
    finally:
        if hasattr(transport, "close"):  # per-refit connections (ucxx)
            transport.close()
    commit = await_commit(request.commit_address, request.refit_id, group.timeout_s)
    if commit.error:
        raise PeerError(f"{sender} aborted version {m.policy_version}: {commit.error}")
    bad = [i for i, (got, want) in enumerate(zip(sums, commit.bucket_checksums)) if got != want]
    if bad or len(sums) != len(commit.bucket_checksums):
        raise ValueError(f"version {m.policy_version}: buckets {bad[:5]} arrived different from what {sender} sent")
    return unpack(buckets, plan), combine(sums)


def await_commit(address: str, refit_id: str, timeout_s: float) -> weightsync_pb2.CommitRequest:
    """The sender's checksums, from the weightsync service, once the sender has sent everything."""
    if not address:
        raise ValueError("LoadWeights needs the commit_address of the weightsync service")
    with channel(address) as ch:
        return weightsync_pb2_grpc.WeightSyncStub(ch).AwaitCommit(
            weightsync_pb2.AwaitCommitRequest(refit_id=refit_id, timeout_s=timeout_s), timeout=timeout_s + 5
        )
