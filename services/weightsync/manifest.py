"""Bucket plan and checksums of one weight version; the manifest is what travels over gRPC."""

from __future__ import annotations

import hashlib

import torch

from protos.grpo.v1 import weights_pb2


def checksum(data: bytes | memoryview) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def tensor_checksum(t: torch.Tensor) -> str:
    """blake2b-128 of a tensor's raw bytes (its dtype as stored), the same on every side."""
    return checksum(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())


def combine(bucket_checksums: list[str]) -> str:
    return checksum("".join(bucket_checksums).encode())


ALIGN_BYTES = 64
"""Offsets inside a bucket are aligned so every tensor can be viewed in place at its dtype."""


def plan(named: list[tuple[str, torch.Tensor]], bucket_bytes: int) -> list[weights_pb2.TensorSpec]:
    """Assign tensors to buckets in order; a tensor larger than a bucket gets a bucket of its own."""
    specs, bucket, used = [], 0, 0
    for name, t in named:
        nbytes = t.numel() * t.element_size()
        used = -(-used // ALIGN_BYTES) * ALIGN_BYTES
        if used and used + nbytes > bucket_bytes:
            bucket, used = bucket + 1, 0
        specs.append(
            weights_pb2.TensorSpec(
                name=name,
                dtype=str(t.dtype).removeprefix("torch."),
                shape=list(t.shape),
                bucket=bucket,
                offset=used,
                nbytes=nbytes,
            )
        )
        used += nbytes
    return specs


def bucket_sizes(specs: list[weights_pb2.TensorSpec]) -> list[int]:
    sizes: dict[int, int] = {}
    for s in specs:
        sizes[s.bucket] = max(sizes.get(s.bucket, 0), s.offset + s.nbytes)
    return [sizes[i] for i in range(len(sizes))]


def pack_bucket(named: dict[str, torch.Tensor], specs: list[weights_pb2.TensorSpec], index: int) -> torch.Tensor:
    """The bucket's bytes as one flat uint8 tensor, tensors at their planned offsets."""
    members = [s for s in specs if s.bucket == index]
    out = torch.zeros(members[-1].offset + members[-1].nbytes, dtype=torch.uint8)  # padding is zeros
    for s in members:
        out[s.offset : s.offset + s.nbytes].copy_(named[s.name].detach().contiguous().view(-1).view(torch.uint8))
    return out


def unpack_bucket(buf: torch.Tensor, specs: list[weights_pb2.TensorSpec], index: int) -> list[tuple[str, torch.Tensor]]:
    out = []
    for s in specs:
        if s.bucket == index:
            raw = buf[s.offset : s.offset + s.nbytes]
            out.append((s.name, raw.view(getattr(torch, s.dtype)).view(tuple(s.shape)).clone()))
    return out


def build(named: list[tuple[str, torch.Tensor]], policy_version: int, bucket_bytes: int):
    """Manifest plus the packed buckets (uint8 tensors) to send, in bucket order."""
    specs = plan(named, bucket_bytes)
    lookup = dict(named)
    buckets = [pack_bucket(lookup, specs, i) for i in range(len(bucket_sizes(specs)))]
    sums = [checksum(b.numpy()) for b in buckets]
    manifest = weights_pb2.WeightManifest(
        policy_version=policy_version,
        tensors=specs,
        buckets=[
            weights_pb2.BucketSpec(index=i, nbytes=b.numel(), checksum=c) for i, (b, c) in enumerate(zip(buckets, sums))
        ],
        checksum=combine(sums),
        payload_bytes=sum(b.numel() for b in buckets),
    )
    return manifest, buckets
