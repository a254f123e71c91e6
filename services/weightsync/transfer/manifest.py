"""What travels beside the bytes of one version: the manifest (a transfer plan in its wire form, over gRPC
before the bytes) and the commit (the sender's bucket checksums, over the data plane after them)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from protos.grpo.v1 import weights_pb2

from ..kernels.checksum import combine
from .plan import Slot, TransferPlan


def to_manifest(
    plan: TransferPlan, policy_version: int, checksum_algo: str, senders: tuple[int, ...] = ()
) -> weights_pb2.WeightManifest:
    """The plan as a manifest, each bucket naming its sender; its checksums follow the bytes, in the commit."""
    senders = senders or (0,) * plan.num_buckets
    return weights_pb2.WeightManifest(
        policy_version=policy_version,
        tensors=[
            weights_pb2.TensorSpec(
                name=s.name, dtype=s.dtype, shape=list(s.shape), bucket=s.bucket, offset=s.offset, nbytes=s.nbytes
            )
            for s in plan.slots
        ],
        buckets=[
            weights_pb2.BucketSpec(index=i, nbytes=n, sender=r)
            for i, (n, r) in enumerate(zip(plan.bucket_nbytes, senders, strict=True))
        ],
        payload_bytes=plan.payload_bytes,
        checksum_algo=checksum_algo,
    )


def plan_of(manifest: weights_pb2.WeightManifest) -> TransferPlan:
    """The receiver's view of the plan (no sender names: it only unpacks)."""
    slots = tuple(
        Slot(t.name, t.dtype, tuple(t.shape), t.bucket, t.offset, t.nbytes, (t.name,)) for t in manifest.tensors
    )
    sizes = tuple(b.nbytes for b in manifest.buckets)
    for s in slots:
        if s.bucket >= len(sizes) or s.offset + s.nbytes > sizes[s.bucket]:
            raise ValueError(f"tensor {s.name} lies outside its bucket {s.bucket}")
    by_bucket = tuple(tuple(s for s in slots if s.bucket == i) for i in range(len(sizes)))
    return TransferPlan(slots, sizes, by_bucket)


@dataclass(frozen=True, slots=True)
class Commit:
    """The sender's checksums of the buckets it sent, in bucket order, or why it stopped (receivers must
    then apply nothing)."""

    bucket_checksums: tuple[str, ...] = ()
    error: str = ""

    @property
    def checksum(self) -> str:
        """The version's checksum: blake2b-128 over the bucket checksums, in order."""
        return combine(list(self.bucket_checksums)) if not self.error else ""

    def encode(self) -> bytes:
        return json.dumps({"bucket_checksums": list(self.bucket_checksums), "error": self.error}).encode()

    @classmethod
    def decode(cls, data: bytes) -> Commit:
        d = json.loads(data)
        return cls(tuple(d["bucket_checksums"]), d["error"])

    @classmethod
    def of_shares(cls, shares: list[tuple[list[int], list[str], str]], num_buckets: int) -> Commit:
        """The commit of every sending rank's (bucket indices, their checksums, error)."""
        errors = [e for _, _, e in shares if e]
        if errors:
            return cls(error="; ".join(errors))
        by_bucket = [""] * num_buckets
        for indices, digests, _ in shares:
            for i, digest in zip(indices, digests, strict=True):
                by_bucket[i] = digest
        return cls(tuple(by_bucket))
