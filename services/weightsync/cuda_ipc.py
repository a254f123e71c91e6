"""CUDA IPC transport (sender and receivers on one GPU): receivers copy buckets out of the sender's ring.

The ring's handles are created once per process and travel in the DataSource proto, field by field.
Per bucket, "ready" and "done" keys in the group's store order the sender's reuse of a buffer after
every receiver copied it; each wait carries the group's timeout, so a dead peer fails the refit.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch.multiprocessing.reductions import rebuild_cuda_tensor

from . import checksum as cs
from .collective import group_store
from .plan import TransferPlan


@dataclass(frozen=True, slots=True)
class IpcBuffer:
    """Same fields as the CudaIpcBuffer proto message."""

    device_uuid: str
    handle: bytes
    storage_size_bytes: int
    storage_offset_bytes: int
    ref_counter_handle: bytes
    ref_counter_offset: int
    event_handle: bytes
    event_sync_required: bool
    nbytes: int


_rings: dict[tuple, tuple[list[torch.Tensor], list[IpcBuffer]]] = {}
_opened: dict[tuple[bytes, int], torch.Tensor] = {}
"""By (handle, offset): buffers under 1 MiB share one allocator segment, hence one handle."""


def device_uuid(index: int) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


def share(buf: torch.Tensor) -> IpcBuffer:
    assert buf.dtype == torch.uint8 and buf.dim() == 1 and buf.storage_offset() == 0, buf
    _, handle, size, offset, ref_handle, ref_offset, event, sync = buf.untyped_storage()._share_cuda_()
    uuid = device_uuid(buf.device.index)
    return IpcBuffer(uuid, handle, size, offset, ref_handle, ref_offset, event or b"", sync, buf.numel())


def shared_ring(
    plan: TransferPlan, device: torch.device, num_buffers: int
) -> tuple[list[torch.Tensor], list[IpcBuffer]]:
    """The sender's ring, allocated and shared once per (device, size, count): handles stay valid across refits."""
    key = (device.index, max(plan.bucket_nbytes), min(num_buffers, plan.num_buckets))
    if key not in _rings:
        ring = [torch.empty(key[1], dtype=torch.uint8, device=device) for _ in range(key[2])]
        _rings[key] = ring, [share(b) for b in ring]
    return _rings[key]


def open_shared(b) -> torch.Tensor:
    """A uint8 view of a sender's buffer on this process's view of the same GPU (cached by handle and offset)."""
    key = (b.handle, b.storage_offset_bytes)
    if key not in _opened:
        index = next((i for i in range(torch.cuda.device_count()) if device_uuid(i) == b.device_uuid), None)
        if index is None:
            raise ValueError(f"cuda_ipc needs sender and receiver on one GPU; GPU {b.device_uuid} is not visible here")
        _opened[key] = rebuild_cuda_tensor(
            torch.Tensor, (b.nbytes,), (1,), 0, torch.storage.TypedStorage, torch.uint8, index, b.handle,
            b.storage_size_bytes, b.storage_offset_bytes, False, b.ref_counter_handle, b.ref_counter_offset,
            b.event_handle or None, b.event_sync_required,
        )  # fmt: skip
    return _opened[key]


class CudaIpcTransport:
    def __init__(self, group, source):
        self.timeout = datetime.timedelta(seconds=group.timeout_s)
        self.store = group_store(group, self.timeout)
        self.rank, self.world_size = group.rank, group.world_size
        self.buffers = list(source.ipc_buffers)
        if not self.buffers:
            raise ValueError("cuda_ipc transfer without shared buffers in its source")
        self.device = torch.device("cuda", torch.cuda.current_device())

    def _wait(self, keys: list[str], what: str) -> None:
        try:
            self.store.wait(keys, self.timeout)
        except Exception as e:  # the store's own message names no peer
            raise TimeoutError(f"{what} within {self.timeout.total_seconds():.0f}s ({type(e).__name__})") from e

    def wait_free(self, tag: str) -> Callable[[int], None]:
        """For pack.packed_buckets: block until every receiver copied bucket j out of its buffer."""

        def wait(j: int) -> None:
            receivers = range(1, self.world_size)
            self._wait([f"{tag}/done/{j}/{r}" for r in receivers], f"receivers did not copy bucket {j}")

        return wait

    def send(self, buckets: Iterable[tuple[int, torch.Tensor]], tag: str) -> None:
        last = []
        for i, _ in buckets:
            torch.cuda.current_stream().synchronize()  # readers in other processes see only finished bytes
            self.store.set(f"{tag}/ready/{i}", b"1")
            last = [*last[-(len(self.buffers) - 1) :], i] if len(self.buffers) > 1 else [i]
        for j in last:  # the next refit may overwrite any buffer
            self.wait_free(tag)(j)

    def receive(self, index: int, out: torch.Tensor, tag: str, root: int = 0) -> torch.Tensor:
        """Copy bucket `index` out of the sender's ring, with its sum64 computed by the copy itself."""
        if root != 0:
            raise ValueError(f"cuda_ipc reads one sender's ring; bucket from sender rank {root}")
        self._wait([f"{tag}/ready/{index}"], f"no bucket {index} from the sender")
        src = open_shared(self.buffers[index % len(self.buffers)])
        summed = cs.copy_sum64(src[: out.numel()], out)
        torch.cuda.current_stream().synchronize()
        self.store.set(f"{tag}/done/{index}/{self.rank}", b"1")
        return summed
