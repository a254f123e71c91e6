"""Pack buckets per plan into a ring of reusable buffers, ahead of the sender, and unpack them on arrival.

On GPU the packing runs on a side stream: bucket i+1 is cast/fused/copied while bucket i is on the
wire, with events instead of host waits. On CPU a packing thread does the same (copies and CRC-32
release the GIL). Checksums are computed as buckets are packed, so they cost no extra pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import torch

from . import checksum as cs
from .plan import Slot, TransferPlan


def slot_view(buf: torch.Tensor, slot: Slot) -> torch.Tensor:
    """The slot's tensor inside a bucket buffer, at its dtype and shape, without copying."""
    return buf[slot.offset : slot.offset + slot.nbytes].view(getattr(torch, slot.dtype)).view(slot.shape)


def pack_into(buf: torch.Tensor, plan: TransferPlan, index: int, lookup: dict[str, torch.Tensor]) -> None:
    """Write bucket `index` into buf: casts on copy, fused tensors as row ranges of their slot."""
    size = plan.bucket_nbytes[index]
    last = plan.by_bucket[index][-1]
    buf[last.offset + last.nbytes : size].zero_()  # alignment padding: checksums read it
    for slot in plan.by_bucket[index]:
        dst, row = slot_view(buf, slot), 0
        for name in slot.sources:
            src = lookup[name].detach()
            rows = src.shape[0] if len(slot.sources) > 1 else None
            (dst[row : row + rows] if rows is not None else dst).copy_(src, non_blocking=True)
            row += rows or 0


def expected_tensor(slot: Slot, lookup: dict[str, torch.Tensor]) -> torch.Tensor:
    """What the receiver should hold under slot.name (fused and cast), for read-back checks."""
    parts = [lookup[n].detach() for n in slot.sources]
    t = torch.cat(parts) if len(parts) > 1 else parts[0]
    return t.to(getattr(torch, slot.dtype))


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
    wait_free: Callable[[int], None] | None = None,
) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield (index, buffer) in order; a buffer is reused once the consumer asked for the next one.

    On GPU the buffer is ready on the current stream when yielded, and the consumer must have enqueued
    its use of it on the current stream before asking for the next. `sums` receives each bucket's
    checksum (a str on CPU, an int64[3] device tensor on GPU; see checksum.py). `wait_free(j)` blocks
    until readers in other processes are done with bucket j, before its buffer is packed again.
    """
    assert all(b.numel() >= max(plan.bucket_nbytes) for b in ring), "ring buffers smaller than a bucket"
    if ring[0].device.type == "cuda":
        yield from _device_ring(plan, lookup, ring, sums, wait_free)
    else:
        yield from _host_ring(plan, lookup, ring, sums)


def _host_ring(plan, lookup, ring, sums) -> Iterator[tuple[int, torch.Tensor]]:
    def pack(i: int) -> tuple[torch.Tensor, str]:
        buf = ring[i % len(ring)][: plan.bucket_nbytes[i]]
        pack_into(buf, plan, i, lookup)
        return buf, cs.bucket_checksum(buf, "crc32")

    with ThreadPoolExecutor(1, thread_name_prefix="weightsync-pack") as pool:
        ahead = {i: pool.submit(pack, i) for i in range(len(ring))}
        for i in range(plan.num_buckets):
            buf, digest = ahead.pop(i).result()
            sums.append(digest)
            yield i, buf
            # The consumer came back: buffer i % len(ring) is free for bucket i + len(ring).
            if i + len(ring) < plan.num_buckets:
                ahead[i + len(ring)] = pool.submit(pack, i + len(ring))


def _device_ring(plan, lookup, ring, sums, wait_free) -> Iterator[tuple[int, torch.Tensor]]:
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream(device=main.device)
    side.wait_stream(main)  # the source tensors were produced on the main stream
    freed: list[torch.cuda.Event | None] = [None] * len(ring)
    ready: dict[int, torch.cuda.Event] = {}

    def enqueue(j: int) -> None:
        k = j % len(ring)
        if wait_free is not None and j >= len(ring):
            wait_free(j - len(ring))
        with torch.cuda.stream(side):
            if freed[k] is not None:
                side.wait_event(freed[k])
            buf = ring[k][: plan.bucket_nbytes[j]]
            pack_into(buf, plan, j, lookup)
            sums.append(cs.sum64(buf))
            ready[j] = side.record_event()

    for j in range(len(ring) - 1):
        enqueue(j)
    for i in range(plan.num_buckets):
        ahead = i + len(ring) - 1 if i + len(ring) - 1 < plan.num_buckets else None
        # Packing runs len(ring) - 1 buckets ahead, into buffers whose sends are already enqueued, so
        # it overlaps the send of bucket i even when the transport blocks the host. With readers in
        # other processes (wait_free) bucket i is handed out first, so they copy it while we pack.
        if ahead is not None and wait_free is None:
            enqueue(ahead)
        main.wait_event(ready.pop(i))
        yield i, ring[i % len(ring)][: plan.bucket_nbytes[i]]
        freed[i % len(ring)] = main.record_event()
        if ahead is not None and wait_free is not None:
            enqueue(ahead)
    main.wait_stream(side)  # nothing allocated on the side stream may be freed before main caught up
