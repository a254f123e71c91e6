"""Transfer plan: which receiver tensor lands in which bucket at which offset, computed once per layout pair.

Imports torch only (no protos), so the benchmark runs it on machines without our wire stack.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import torch

ALIGN_BYTES = 64
"""Offsets and bucket sizes are multiples of this, so every tensor is viewable in place and the
device checksum can read a bucket as 64-bit words."""

CAST_DTYPES = ("bfloat16", "float16", "float32")
FUSIONS = ("qkv", "gate_up")

# Receiver name of a fused tensor <- sender names, concatenated along dim 0 in this order. This is the
# layout of vLLM's QKVParallelLinear / MergedColumnParallelLinear at TP=1.
_FUSION_RULES = {
    "qkv": (re.compile(r"(.*)\.self_attn\.q_proj\.(weight|bias)$"), "{0}.self_attn.qkv_proj.{1}", ("q", "k", "v")),
    "gate_up": (re.compile(r"(.*)\.mlp\.gate_proj\.(weight)$"), "{0}.mlp.gate_up_proj.{1}", ("gate", "up")),
}
_SOURCE_NAME = {
    "qkv": lambda prefix, part, suffix: f"{prefix}.self_attn.{part}_proj.{suffix}",
    "gate_up": lambda prefix, part, suffix: f"{prefix}.mlp.{part}_proj.{suffix}",
}

SenderLayout = tuple[tuple[str, str, tuple[int, ...]], ...]
"""(name, dtype, shape) of every tensor the sender holds, in its order."""


@dataclass(frozen=True, slots=True)
class ReceiverLayout:
    """What the receiving engine wants: a dtype for floating tensors ("" = as sent) and fused projections."""

    cast_dtype: str = ""
    fuse: tuple[str, ...] = ()

    def __post_init__(self):
        if self.cast_dtype and self.cast_dtype not in CAST_DTYPES:
            raise ValueError(f"cast_dtype must be one of {CAST_DTYPES} or empty, got {self.cast_dtype!r}")
        bad = [f for f in self.fuse if f not in FUSIONS]
        if bad:
            raise ValueError(f"fuse entries must be among {FUSIONS}, got {bad}")


@dataclass(frozen=True, slots=True)
class Slot:
    """One receiver tensor: where it sits, and the sender tensors it is made of (one unless fused)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    bucket: int
    offset: int
    nbytes: int
    sources: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TransferPlan:
    slots: tuple[Slot, ...]
    bucket_nbytes: tuple[int, ...]
    by_bucket: tuple[tuple[Slot, ...], ...]

    @property
    def payload_bytes(self) -> int:
        return sum(self.bucket_nbytes)

    @property
    def num_buckets(self) -> int:
        return len(self.bucket_nbytes)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a name dtype_name gave ("bfloat16", ...)."""
    dtype = getattr(torch, name)
    assert isinstance(dtype, torch.dtype), name
    return dtype


def layout_of(named: list[tuple[str, torch.Tensor]]) -> SenderLayout:
    return tuple((n, dtype_name(t.dtype), tuple(t.shape)) for n, t in named)


def _align(n: int) -> int:
    return -(-n // ALIGN_BYTES) * ALIGN_BYTES


def _element_size(dtype: str) -> int:
    return torch.empty((), dtype=torch_dtype(dtype)).element_size()


def _fused_groups(sender: SenderLayout, fuse: tuple[str, ...]) -> dict[str, tuple[str, tuple[str, ...]]]:
    """First source name -> (fused name, all source names), for every fusable group fully present."""
    present = {n for n, _, _ in sender}
    groups = {}
    for kind in fuse:
        pattern, target, parts = _FUSION_RULES[kind]
        for name, _, _ in sender:
            m = pattern.match(name)
            if not m:
                continue
            sources = tuple(_SOURCE_NAME[kind](m.group(1), p, m.group(2)) for p in parts)
            if all(s in present for s in sources):
                groups[sources[0]] = (target.format(m.group(1), m.group(2)), sources)
    return groups


def _receiver_tensors(sender: SenderLayout, receiver: ReceiverLayout) -> list[tuple[str, str, tuple, tuple]]:
    """(name, dtype, shape, sources) of every tensor the receiver gets, in sender order."""
    info = {n: (d, s) for n, d, s in sender}
    groups = _fused_groups(sender, receiver.fuse)
    fused_members = {s for _, sources in groups.values() for s in sources}
    out = []
    for name, dtype, shape in sender:
        if name in groups:
            target, sources = groups[name]
            shapes = [info[s][1] for s in sources]
            if any(s[1:] != shape[1:] or info[src][0] != dtype for s, src in zip(shapes, sources)):
                raise ValueError(f"cannot fuse {sources}: shapes {shapes} or dtypes differ")
            name, sources, shape = target, sources, (sum(s[0] for s in shapes), *shape[1:])
        elif name in fused_members:
            continue
        else:
            sources = (name,)
        floating = torch_dtype(dtype).is_floating_point
        out.append((name, receiver.cast_dtype if receiver.cast_dtype and floating else dtype, shape, sources))
    return out


@functools.lru_cache(maxsize=16)
def make_plan(sender: SenderLayout, receiver: ReceiverLayout, bucket_bytes: int) -> TransferPlan:
    """Assign tensors to buckets in order; a tensor larger than a bucket gets a bucket of its own.

    Cached: a training run sends the same layout every step, so planning happens once.
    """
    if bucket_bytes < ALIGN_BYTES:
        raise ValueError(f"bucket_bytes must be >= {ALIGN_BYTES}, got {bucket_bytes}")
    slots, sizes, used = [], [], 0
    for name, dtype, shape, sources in _receiver_tensors(sender, receiver):
        nbytes = _element_size(dtype) * _numel(shape)
        used = _align(used)
        if not sizes or (used and used + nbytes > bucket_bytes):
            sizes.append(0)
            used = 0
        slots.append(Slot(name, dtype, shape, len(sizes) - 1, used, nbytes, sources))
        used += nbytes
        sizes[-1] = _align(used)
    by_bucket = tuple(tuple(s for s in slots if s.bucket == i) for i in range(len(sizes)))
    return TransferPlan(tuple(slots), tuple(sizes), by_bucket)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def bucket_senders(bucket_nbytes: tuple[int, ...], num_senders: int) -> tuple[int, ...]:
    """Sender rank of each bucket: contiguous runs of buckets, about equal in bytes, one run per sender;
    the first bucket is rank 0's (with fewer buckets than senders, the last ranks send none)."""
    if num_senders < 1:
        raise ValueError(f"num_senders must be >= 1, got {num_senders}")
    total, out, done = sum(bucket_nbytes), [], 0
    for n in bucket_nbytes:
        # The bucket goes to the sender whose equal share its first byte falls in.
        out.append(min(num_senders - 1, done * num_senders // total) if total else 0)
        done += n
    return tuple(out)
