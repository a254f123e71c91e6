"""Pack buckets per plan into a ring of reusable buffers, ahead of the sender, and unpack them on arrival.

On GPU the packing runs on a side stream: bucket i+1 is cast/fused/copied while bucket i is on the
wire, with events instead of host waits, and the checksum rides on the packing copy (pack_sum64). On
CPU a packing thread does the same (copies and CRC-32 release the GIL).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

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
    """pack_into, returning the bucket's sum64; where the kernels run, sources are copied by the
    checksumming kernel, so the bytes are read once and written once, in one launch per bucket.

    sum64 is a sum of per-word terms, so the bucket's value is the sum of its pieces' values given each
    piece's first line (the kernel zeroes the padding). A piece that starts inside a 64-byte line or is
    not whole words (a fused tensor split at an odd row) sends the bucket the two-step way: pack, then
    one read. A source that must be cast or lives elsewhere is copied by torch, then summed where it
    landed. The pieces go to the kernel by address: building a view per tensor cost more host time
    than the copies take on the GPU.
    """
    kernels = cs.kernels_for(buf)
    spans = _spans(plan, index, lookup)
    if kernels is None or any(offset % ALIGN_BYTES or nbytes % 8 for _, _, offset, nbytes in spans):
        pack_into(buf, plan, index, lookup)
        return cs.sum64(buf)
    base, rows, end = buf.data_ptr(), [], 0
    for src, dtype, offset, nbytes in spans:
        if offset > end:  # padding before this piece
            rows.append((base + end, base + end, (offset - end) // 8, end // ALIGN_BYTES, kernels.ZERO))
        addr = base + offset
        if src.device == buf.device and src.dtype == dtype and src.is_contiguous() and src.data_ptr() % 8 == 0:
            rows.append((src.data_ptr(), addr, nbytes // 8, offset // ALIGN_BYTES, kernels.COPY))
        else:
            _copy_at(buf, offset, nbytes, dtype, src)
            rows.append((addr, addr, nbytes // 8, offset // ALIGN_BYTES, kernels.SUM))
        end = offset + nbytes
    if end < buf.numel():
        rows.append((base + end, base + end, (buf.numel() - end) // 8, end // ALIGN_BYTES, kernels.ZERO))
    return kernels.sum64_rows(rows, buf.device)


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


def unpack(buckets: list[torch.Tensor], plan: TransferPlan) -> list[tuple[str, torch.Tensor]]:
    """Views of every tensor inside the received buckets (the buckets stay alive through the views)."""
    return [(s.name, slot_view(buckets[s.bucket], s)) for s in plan.slots]


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
