"""Pack buckets per plan into a ring of reusable buffers, ahead of the sender, and unpack them on arrival.

On GPU the packing runs on a side stream: bucket i+1 is cast/fused/copied while bucket i is on the
wire, with events instead of host waits, and the checksum rides on the packing copy (pack_sum64). On
CPU a packing thread does the same (copies and CRC-32 release the GIL). A ring that holds the whole
version (in-place transports) is packed in one go (pack_version).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from ..kernels import checksum as cs
from .plan import ALIGN_BYTES, Slot, TransferPlan, torch_dtype


def slot_view(buf: torch.Tensor, slot: Slot) -> torch.Tensor:
    """The slot's tensor inside a bucket buffer, at its dtype and shape, without copying."""
    return buf[slot.offset : slot.offset + slot.nbytes].view(torch_dtype(slot.dtype)).view(slot.shape)


def pack_into(buf: torch.Tensor, plan: TransferPlan, index: int, lookup: dict[str, torch.Tensor]) -> None:
    """Write bucket `index` into buf: casts on copy, fused tensors as row ranges of their slot, the
    padding zeroed (checksums read it)."""
    end = 0
    for src, dtype, offset, nbytes in _spans(plan, index, lookup):
        if offset > end:
            buf[end:offset].zero_()
        _copy_at(buf, offset, nbytes, dtype, src)
        end = offset + nbytes
    buf[end:].zero_()


def pack_sum64(buf: torch.Tensor, plan: TransferPlan, index: int, lookup: dict[str, torch.Tensor]) -> torch.Tensor:
    """pack_into, returning the bucket's sum64; where the kernels run, sources are copied (or cast from fp32
    to bf16) by the checksumming kernel, so the bytes are read once and written once, in one launch per
    bucket."""
    kernels = cs.kernels_for(buf)
    if kernels is None:
        pack_into(buf, plan, index, lookup)
        return cs.sum64(buf)
    return kernels.sum64_rows(_bucket_rows(buf, plan, index, lookup, kernels)[0], buf.device)


@dataclass(frozen=True, slots=True)
class PackedVersion:
    """A version packed into a ring that holds it (pack_version): each bucket's sum64, enqueued, and, for the
    tensors the kernel packed piece by piece, each one's sum64 as an engine's read-back computes it (its lines
    counted from its own start): what the read-back must find, with no second pass over the ring."""

    bucket_sums: torch.Tensor | list
    slot_names: tuple[str, ...] = ()
    slot_sums: torch.Tensor | None = None

    def slot_digests(self) -> dict[str, str]:
        return dict(zip(self.slot_names, cs.digests(self.slot_sums), strict=True)) if self.slot_names else {}


def pack_version(
    ring: list[torch.Tensor], plan: TransferPlan, lookup: dict[str, torch.Tensor], indices: list[int]
) -> PackedVersion:
    """Pack buckets `indices` into ring[0], ring[1], ... (a ring that holds them all), enqueued on the current
    stream: where the kernels run, the whole version in one launch (per-bucket launches cost host time a
    version of hundreds of tensors does not need to pay), which also sums each tensor."""
    bufs = [ring[k][: plan.bucket_nbytes[i]] for k, i in enumerate(indices)]
    kernels = cs.kernels_for(bufs[0]) if bufs else None
    if kernels is None:
        return PackedVersion([pack_sum64(buf, plan, i, lookup) for buf, i in zip(bufs, indices, strict=True)])
    rows, buckets, slots = [], [], []
    for buf, i in zip(bufs, indices, strict=True):
        bucket_rows, bucket_slots = _bucket_rows(buf, plan, i, lookup, kernels)
        slots += [(name, len(rows) + first, len(rows) + end, line) for name, first, end, line in bucket_slots]
        buckets.append((len(rows), len(rows) + len(bucket_rows)))
        rows += bucket_rows
    device = bufs[0].device
    sums = kernels.sum64_ranges(rows, buckets + [(first, end) for _, first, end, _ in slots], device)
    tensors = sums[len(buckets) :]
    # Read back, a tensor's line k is the bucket's line k + its first line: that many plain sums less.
    first_lines = torch.tensor([line for *_, line in slots], dtype=torch.int64, pin_memory=device.type == "cuda")
    tensors[:, 1] -= first_lines.to(device, non_blocking=True) * tensors[:, 0]
    return PackedVersion(sums[: len(buckets)], tuple(name for name, *_ in slots), tensors)


def _bucket_rows(
    buf: torch.Tensor, plan: TransferPlan, index: int, lookup, kernels
) -> tuple[list[tuple], list[tuple[str, int, int, int]]]:
    """The kernel's rows that pack bucket `index` into buf and sum it, and each slot's (name, its first row,
    the row after its last, its first line).

    sum64 is a sum of per-word terms, so the bucket's value is the sum of its pieces' values given each
    piece's first line (the kernel zeroes the padding). A piece that starts inside a 64-byte line or is
    not whole words (a fused tensor split at an odd row) sends the bucket the two-step way: pack, then
    one read (and no slot's rows). An fp32 source of a bf16 slot is cast by the kernel; a source that must be
    cast otherwise or lives elsewhere is copied by torch, then summed where it landed. The pieces go to the
    kernel by address: building a view per tensor cost more host time than the copies take on the GPU.
    """
    base = buf.data_ptr()
    if any(offset % ALIGN_BYTES or nbytes % 8 for _, _, offset, nbytes in _spans(plan, index, lookup)):
        pack_into(buf, plan, index, lookup)
        return [(base, base, buf.numel() // 8, 0, kernels.SUM)], []
    rows, slots, end, device = [], [], 0, buf.device
    for slot in plan.by_bucket[index]:
        if slot.offset > end:  # padding before this slot
            rows.append((base + end, base + end, (slot.offset - end) // 8, end // ALIGN_BYTES, kernels.ZERO))
        first, dtype, offset = len(rows), torch_dtype(slot.dtype), slot.offset
        for name in slot.sources:
            src = lookup[name]
            nbytes = src.numel() * dtype.itemsize
            addr, line, ptr = base + offset, offset // ALIGN_BYTES, src.data_ptr()
            direct = ptr % 8 == 0 and src.device == device and src.is_contiguous()
            if direct and src.dtype == dtype:
                rows.append((ptr, addr, nbytes // 8, line, kernels.COPY))
            elif direct and src.dtype == torch.float32 and dtype == torch.bfloat16:
                rows.append((ptr, addr, nbytes // 8, line, kernels.CAST_BF16))
            else:
                _copy_at(buf, offset, nbytes, dtype, src)
                rows.append((addr, addr, nbytes // 8, line, kernels.SUM))
            offset += nbytes
        slots.append((slot.name, first, len(rows), slot.offset // ALIGN_BYTES))
        end = offset
    if end < buf.numel():
        rows.append((base + end, base + end, (buf.numel() - end) // 8, end // ALIGN_BYTES, kernels.ZERO))
    return rows, slots


def _spans(plan: TransferPlan, index: int, lookup) -> list[tuple[torch.Tensor, torch.dtype, int, int]]:
    """(sender tensor, slot dtype, byte offset in the bucket, bytes) for each sender tensor of the bucket,
    in order; a fused slot's sources are consecutive row ranges of it."""
    out = []
    for slot in plan.by_bucket[index]:
        dtype, offset = torch_dtype(slot.dtype), slot.offset
        for name in slot.sources:
            src = lookup[name]
            nbytes = src.numel() * dtype.itemsize
            out.append((src, dtype, offset, nbytes))
            offset += nbytes
    return out


def _copy_at(buf: torch.Tensor, offset: int, nbytes: int, dtype: torch.dtype, src: torch.Tensor) -> None:
    """src cast to dtype into buf's bytes [offset, offset + nbytes)."""
    buf[offset : offset + nbytes].view(dtype).view(src.shape).copy_(src.detach(), non_blocking=True)


def expected_tensor(slot: Slot, lookup: dict[str, torch.Tensor]) -> torch.Tensor:
    """What the receiver should hold under slot.name (fused and cast), for read-back checks."""
    parts = [lookup[n].detach() for n in slot.sources]
    t = torch.cat(parts) if len(parts) > 1 else parts[0]
    return t.to(torch_dtype(slot.dtype))


def unpack(
    buckets: list[torch.Tensor], plan: TransferPlan, slots: list[Slot] | None = None
) -> list[tuple[str, torch.Tensor]]:
    """Views of every tensor (or of `slots`) inside the received buckets (the buckets stay alive through the
    views): one strided view each of its bucket at its dtype, fewer host calls than slot_view's three."""
    typed: dict[tuple[int, torch.dtype], torch.Tensor] = {}
    out = []
    for s in plan.slots if slots is None else slots:
        dtype = torch_dtype(s.dtype)
        key = (s.bucket, dtype)
        if key not in typed:
            typed[key] = buckets[s.bucket].view(dtype)
        bucket, strides, step = typed[key], [], 1
        for size in reversed(s.shape):
            strides.append(step)
            step *= size
        # as_strided's offset counts from the storage's start, not the bucket's.
        out.append(
            (s.name, bucket.as_strided(s.shape, strides[::-1], bucket.storage_offset() + s.offset // dtype.itemsize))
        )
    return out


def new_ring(plan: TransferPlan, device: torch.device, num_buffers: int) -> list[torch.Tensor]:
    if num_buffers < 1:
        raise ValueError(f"num_buffers must be >= 1, got {num_buffers}")
    size = max(plan.bucket_nbytes)
    return [torch.empty(size, dtype=torch.uint8, device=device) for _ in range(min(num_buffers, plan.num_buckets))]


def packed_buckets(
    plan: TransferPlan,
    lookup: dict[str, torch.Tensor],
    ring: list[torch.Tensor],
    sums: list,
    indices: list[int] | None = None,
) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield (index, buffer) in order for the buckets `indices` (default all, one sender's share
    otherwise); a buffer is reused once the consumer asked for the next one.

    On GPU the buffer is ready on the current stream when yielded, and the consumer must have enqueued
    its use of it on the current stream before asking for the next. `sums` receives each bucket's
    checksum (a str on CPU, an int64[3] device tensor on GPU; see checksum.py).
    """
    assert all(b.numel() >= max(plan.bucket_nbytes) for b in ring), "ring buffers smaller than a bucket"
    indices = list(range(plan.num_buckets)) if indices is None else indices
    if ring[0].device.type == "cuda":
        yield from _device_ring(plan, lookup, ring, sums, indices)
    else:
        yield from _host_ring(plan, lookup, ring, sums, indices)


def _host_ring(plan, lookup, ring, sums, indices: list[int]) -> Iterator[tuple[int, torch.Tensor]]:
    def pack(k: int) -> tuple[torch.Tensor, str]:
        i = indices[k]
        buf = ring[k % len(ring)][: plan.bucket_nbytes[i]]
        pack_into(buf, plan, i, lookup)
        return buf, cs.bucket_checksum(buf, cs.algo_for(buf.device))

    with ThreadPoolExecutor(1, thread_name_prefix="weightsync-pack") as pool:
        ahead = {k: pool.submit(pack, k) for k in range(min(len(ring), len(indices)))}
        for k, i in enumerate(indices):
            buf, digest = ahead.pop(k).result()
            sums.append(digest)
            yield i, buf
            # The consumer came back: buffer k % len(ring) is free for the share's bucket k + len(ring).
            if k + len(ring) < len(indices):
                ahead[k + len(ring)] = pool.submit(pack, k + len(ring))


def _device_ring(plan, lookup, ring, sums, indices: list[int]) -> Iterator[tuple[int, torch.Tensor]]:
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream(device=main.device)
    side.wait_stream(main)  # the source tensors were produced on the main stream
    freed: list[torch.cuda.Event | None] = [None] * len(ring)
    ready: dict[int, torch.cuda.Event] = {}
    n = len(indices)  # positions k in this sender's share; bucket indices[k] goes to ring[k % len(ring)]

    def enqueue(k: int) -> None:
        slot = k % len(ring)
        with torch.cuda.stream(side):
            if freed[slot] is not None:
                side.wait_event(freed[slot])
            sums.append(pack_sum64(ring[slot][: plan.bucket_nbytes[indices[k]]], plan, indices[k], lookup))
            ready[k] = side.record_event()

    for k in range(min(len(ring) - 1, n)):
        enqueue(k)
    for k in range(n):
        # Packing runs len(ring) - 1 buckets ahead, into buffers whose sends are already enqueued, so it
        # overlaps the send of bucket k even when the transport blocks the host.
        if k + len(ring) - 1 < n:
            enqueue(k + len(ring) - 1)
        main.wait_event(ready.pop(k))
        yield indices[k], ring[k % len(ring)][: plan.bucket_nbytes[indices[k]]]
        freed[k % len(ring)] = main.record_event()
    main.wait_stream(side)  # nothing allocated on the side stream may be freed before main caught up
