"""CUDA IPC transport (sender and receivers on one GPU): receivers copy buckets out of the sender's ring.

The ring's handles are created once per process and travel in the DataSource proto, field by field.
Per bucket, "ready" and "done" keys in the group's store order the sender's reuse of a buffer after
every receiver copied it; each wait carries the group's timeout, so a dead peer fails the refit.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.multiprocessing.reductions import rebuild_cuda_tensor

from ..kernels import checksum as cs
from .base import Buckets, Offer, Transfer, Transport, group_key
from .collective import group_store


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


def device_uuid(index: int) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


def export_buffer(buf: torch.Tensor) -> IpcBuffer:
    """The handle by which another process on this GPU opens buf."""
    assert buf.dtype == torch.uint8 and buf.dim() == 1 and buf.storage_offset() == 0, buf
    _, handle, size, offset, ref_handle, ref_offset, event, sync = buf.untyped_storage()._share_cuda_()
    uuid = device_uuid(buf.device.index)
    return IpcBuffer(uuid, handle, size, offset, ref_handle, ref_offset, event or b"", sync, buf.numel())


def open_buffer(b) -> torch.Tensor:
    """A uint8 view of a sender's buffer on this process's view of the same GPU."""
    index = next((i for i in range(torch.cuda.device_count()) if device_uuid(i) == b.device_uuid), None)
    if index is None:
        raise ValueError(f"cuda_ipc needs sender and receiver on one GPU; GPU {b.device_uuid} is not visible here")
    return rebuild_cuda_tensor(
        torch.Tensor, (b.nbytes,), (1,), 0, torch.storage.TypedStorage, torch.uint8, index, b.handle,
        b.storage_size_bytes, b.storage_offset_bytes, False, b.ref_counter_handle, b.ref_counter_offset,
        b.event_handle or None, b.event_sync_required,
    )  # fmt: skip


class CudaIpcTransport(Transport):
    name, device_type = "cuda_ipc", "cuda"

    def __init__(self) -> None:
        self._rings: dict[tuple, tuple[list[torch.Tensor], tuple[IpcBuffer, ...]]] = {}
        self._opened: dict[tuple[bytes, int], torch.Tensor] = {}
        """By (handle, offset): buffers under 1 MiB share one allocator segment, hence one handle."""
        self._stores: dict[tuple, dist.Store] = {}
        self._lock = threading.Lock()

    def offer(self, bucket_bytes: int, num_buffers: int, host: str) -> tuple[list[torch.Tensor], Offer]:
        """The sender's ring, allocated and exported once per (device, size, count): handles stay valid
        across refits, so receivers open each once."""
        key = (torch.cuda.current_device(), bucket_bytes, num_buffers)
        if key not in self._rings:
            ring = [torch.empty(bucket_bytes, dtype=torch.uint8, device=self.device()) for _ in range(num_buffers)]
            self._rings[key] = ring, tuple(export_buffer(b) for b in ring)
        ring, exported = self._rings[key]
        return ring, Offer(ipc_buffers=exported)

    def opened(self, b) -> torch.Tensor:
        key = (b.handle, b.storage_offset_bytes)
        if key not in self._opened:
            self._opened[key] = open_buffer(b)
        return self._opened[key]

    def store(self, group) -> dist.Store:
        with self._lock:
            key = group_key(group)
            if key not in self._stores:
                self._stores[key] = group_store(group, _timeout(group))
            return self._stores[key]

    def wait(self, transfer: Transfer, keys: list[str], what: str) -> None:
        timeout = _timeout(transfer.group)
        try:
            self.store(transfer.group).wait(keys, timeout)
        except Exception as e:  # the store's own message names no peer
            raise TimeoutError(f"{what} within {timeout.total_seconds():.0f}s ({type(e).__name__})") from e

    def wait_free(self, transfer: Transfer) -> Callable[[int], None]:
        def wait(j: int) -> None:
            receivers = range(1, transfer.group.world_size)
            self.wait(
                transfer, [f"{transfer.tag}/done/{j}/{r}" for r in receivers], f"receivers did not copy bucket {j}"
            )

        return wait

    def send(self, transfer: Transfer, buckets: Buckets, sizes: Sequence[int], senders: Sequence[int]) -> None:
        _one_sender(senders)
        store, num_buffers, last = self.store(transfer.group), len(transfer.source.ipc_buffers), []
        for i, _ in buckets:
            torch.cuda.current_stream().synchronize()  # readers in other processes see only finished bytes
            store.set(f"{transfer.tag}/ready/{i}", b"1")
            last = [*last[-(num_buffers - 1) :], i] if num_buffers > 1 else [i]
        for j in last:  # the next refit may overwrite any buffer
            self.wait_free(transfer)(j)

    def receive(self, transfer: Transfer, index: int, out: torch.Tensor, root: int = 0) -> torch.Tensor:
        """Copy bucket `index` out of the sender's ring, with its sum64 computed by the copy itself."""
        _one_sender([root])
        buffers = transfer.source.ipc_buffers
        if not buffers:
            raise ValueError("cuda_ipc transfer without shared buffers in its source")
        self.wait(transfer, [f"{transfer.tag}/ready/{index}"], f"no bucket {index} from the sender")
        src = self.opened(buffers[index % len(buffers)])
        summed = cs.copy_sum64(src[: out.numel()], out)
        torch.cuda.current_stream().synchronize()
        self.store(transfer.group).set(f"{transfer.tag}/done/{index}/{transfer.group.rank}", b"1")
        return summed

    def send_commit(self, transfer: Transfer, data: bytes) -> None:
        self.store(transfer.group).set(f"{transfer.tag}/commit", data)

    def receive_commit(self, transfer: Transfer) -> bytes:
        self.wait(transfer, [f"{transfer.tag}/commit"], "no commit from the sender")
        return self.store(transfer.group).get(f"{transfer.tag}/commit")

    def end(self, transfer: Transfer, failed: bool) -> None:
        if failed:
            with self._lock:
                self._stores.pop(group_key(transfer.group), None)


def _timeout(group) -> datetime.timedelta:
    return datetime.timedelta(seconds=group.timeout_s)


def _one_sender(senders: Sequence[int]) -> None:
    if any(senders):
        raise ValueError(f"cuda_ipc reads one sender's ring; buckets from sender ranks {sorted(set(senders))}")
