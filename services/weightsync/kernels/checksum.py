"""Bucket checksums: XXH3-128 over host bytes, or a position-weighted 64-bit sum computed where the bytes are.

XXH3-128 (the xxhash package: 22 GB/s on one core here, 5x zlib's CRC-32, 23x blake2b: bench/checksums.py)
keeps the check off the critical path of a CPU refit, where sender and receiver each hash every byte; it
misses random corruption but for 2**-128. "crc32" and "blake2b" stay accepted in a manifest.

Moving a GPU bucket to the host only to hash it would cost more than the transfer, so device buckets
use `sum64`: exact integer arithmetic (wrapping mod 2**64), identical on CPU and GPU. On CUDA a Triton
kernel (sum64_triton.py) reads the bucket once, or computes it inside the copy that moves the bytes;
elsewhere the torch reference does. It catches any changed word and any swap of two different words,
which is what a transport can do wrong; it is not a cryptographic hash.
"""

from __future__ import annotations

import hashlib
import os
import zlib
from types import ModuleType

import numpy as np
import torch
import xxhash

ALGOS = ("xxh3", "crc32", "blake2b", "sum64")
_LINE_WORDS = 8  # 64-byte lines: buckets are multiples of plan.ALIGN_BYTES


def blake2b_hex(data: bytes | memoryview) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def tensor_checksum(t: torch.Tensor) -> str:
    """blake2b-128 of a tensor's raw bytes (its dtype as stored), the same on every side."""
    return blake2b_hex(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())


def tensor_digests(named: list[tuple[str, torch.Tensor]], algo: str) -> dict[str, str]:
    """Checksums of whole tensors (what an engine holds after a refit, or what the sender expects there), in
    the family of the refit's bucket checksums: for "sum64" each tensor's bytes (zero-padded to whole
    words) are summed on their device, one host sync for all; otherwise blake2b on the host.

    Hashing on the host would move every checked tensor through it each refit, on both sides (its cost:
    bench/README.md, "Read-back checks"). Where the kernels run, every tensor that is whole words goes to
    one launch: a launch per tensor costs more host time than the reads take.
    """
    if algo != "sum64":
        return {name: tensor_checksum(t) for name, t in named}
    if not named:
        return {}
    kernels = kernels_for(named[0][1])
    device = named[0][1].device
    rows, batched, values = [], [], [None] * len(named)
    for i, (_, t) in enumerate(named):
        # By address where the tensor is whole words where it lies: a view per tensor costs host time.
        if kernels and t.device == device and t.is_contiguous() and t.nbytes % 8 == 0 and t.data_ptr() % 8 == 0:
            rows.append((t.data_ptr(), t.data_ptr(), t.nbytes // 8, 0, kernels.SUM))
            batched.append(i)
        else:
            values[i] = sum64(_padded_words(t.detach().contiguous().reshape(-1).view(torch.uint8)))
    if rows:
        for i, v in zip(batched, kernels.sum64_each(rows, device), strict=True):
            values[i] = v
    return dict(zip([name for name, _ in named], digests(values), strict=True))


def _padded_words(b: torch.Tensor) -> torch.Tensor:
    """A contiguous uint8 buffer as whole 64-byte lines (itself where it already is, else a zero-padded copy)."""
    line = 8 * _LINE_WORDS
    if b.numel() % line == 0 and b.data_ptr() % 16 == 0:
        return b
    out = torch.zeros(-(-b.numel() // line) * line, dtype=torch.uint8, device=b.device)
    out[: b.numel()] = b
    return out


def combine(bucket_checksums: list[str]) -> str:
    return blake2b_hex("".join(bucket_checksums).encode())


def kernels_for(t: torch.Tensor) -> ModuleType | None:
    """The Triton kernels where they run for t: CUDA with triton installed, or TRITON_INTERPRET=1 (tests)."""
    if not (t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        return None
    try:
        from . import sum64_triton
    except ImportError:  # a torch build without triton: the torch reference, two reads
        return None
    return sum64_triton


def sum64(buf: torch.Tensor) -> torch.Tensor:
    """int64[3] on buf's device: plain sum, line-index-weighted sum, column-weighted sum of the words."""
    kernels = kernels_for(buf)
    return kernels.sum64(buf) if kernels else sum64_reference(buf)


def copy_sum64(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """dst.copy_(src) and sum64(dst): one read and one write of the bytes where the kernels run."""
    kernels = kernels_for(dst)
    if kernels:
        return kernels.copy_sum64(src, dst)
    dst.copy_(src)
    return sum64_reference(dst)


def sum64_reference(buf: torch.Tensor) -> torch.Tensor:
    """sum64 in torch (any device); the kernels must give the same values."""
    assert buf.dtype == torch.uint8 and buf.numel() % (8 * _LINE_WORDS) == 0, buf.shape
    words = buf.view(torch.int64).view(-1, _LINE_WORDS)
    lines = words.sum(1)
    cols = words.sum(0)
    line_w = torch.arange(1, lines.numel() + 1, device=buf.device, dtype=torch.int64)
    col_w = torch.arange(1, _LINE_WORDS + 1, device=buf.device, dtype=torch.int64)
    return torch.stack([lines.sum(), (lines * line_w).sum(), (cols * col_w).sum()])


def sum64_hex(values: torch.Tensor) -> str:
    return "".join(f"{v & (2**64 - 1):016x}" for v in values.tolist())


def digests(sums: list | torch.Tensor) -> list[str]:
    """Hex digests of bucket checksums: strs as they are, device int64[3] tensors (a list, or one [n, 3]
    tensor) with one sync for all."""
    if isinstance(sums, torch.Tensor) or (sums and isinstance(sums[0], torch.Tensor)):
        values = (sums if isinstance(sums, torch.Tensor) else torch.stack(sums)).cpu().numpy().view(np.uint64)
        return [f"{a:016x}{b:016x}{c:016x}" for a, b, c in values.tolist()]
    return list(sums)


def bucket_checksum(buf: torch.Tensor, algo: str) -> str:
    """Checksum of one bucket, synchronously (host code paths and tests)."""
    if algo == "xxh3":
        return xxhash.xxh3_128_hexdigest(buf.cpu().numpy())
    if algo == "crc32":
        return f"{zlib.crc32(buf.cpu().numpy()):08x}"
    if algo == "blake2b":
        return blake2b_hex(buf.cpu().numpy())
    if algo == "sum64":
        return sum64_hex(sum64(buf))
    raise ValueError(f"checksum algo must be one of {ALGOS}, got {algo!r}")


def algo_for(device: torch.device) -> str:
    return "xxh3" if device.type == "cpu" else "sum64"
