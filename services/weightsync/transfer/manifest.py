"""The manifest of one weight version: a transfer plan in its wire form, which travels over gRPC before the
bytes (commit.py has what follows them)."""

from __future__ import annotations

from protos.grpo.v1 import weights_pb2

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
