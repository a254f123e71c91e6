"""CUDA IPC transport (sender and receivers on one GPU): receivers copy buckets out of the sender's ring.

The sender's ring holds one buffer per bucket, so a whole version sits in it at once: receivers verify it
where it lies and copy it straight into their engine, one HBM copy per byte. Its handles are created once
per ring and travel in the DataSource proto, field by field. Keys in the group's store order the rest: the
sender's one "ready" after every byte, the commit behind it, and each receiver's "released" once it read
all it needed, which the sender waits for before the next refit may write the ring again; each wait
carries the group's timeout, so a dead peer fails the refit.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Sequence
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
    name, device_type, in_place = "cuda_ipc", "cuda", True

    def __init__(self) -> None:
        self._rings: dict[int, tuple[tuple[int, int], list[torch.Tensor], tuple[IpcBuffer, ...]]] = {}
        """By device: the sender's current ring, its (bucket bytes, buffers) and exported handles."""
        self._opened: dict[tuple[bytes, int], torch.Tensor] = {}
        """By (handle, offset): buffers under 1 MiB share one allocator segment, hence one handle."""
        self._stores: dict[tuple, dist.Store] = {}
        self._lock = threading.Lock()

    def offer(self, bucket_bytes: int, num_buffers: int, host: str) -> tuple[list[torch.Tensor], Offer]:
        """The sender's ring (one buffer per bucket of the version), allocated and exported once per size:
        handles stay valid across refits, so receivers open each once."""
        device = torch.cuda.current_device()
        if self._rings.get(device, ((),))[0] != (bucket_bytes, num_buffers):
            self._rings.pop(device, None)  # receivers still holding it keep it alive until they close it
            ring = [torch.empty(bucket_bytes, dtype=torch.uint8, device=self.device()) for _ in range(num_buffers)]
            self._rings[device] = (bucket_bytes, num_buffers), ring, tuple(export_buffer(b) for b in ring)
        _, ring, exported = self._rings[device]
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

    def send(self, transfer: Transfer, buckets: Buckets, sizes: Sequence[int], senders: Sequence[int]) -> None:
        """Pack the whole version into the ring (one buffer per bucket: nothing waits for a reader), then one
        "ready" for all of it. Where packing fails, "ready" is still set: the receivers go on to the commit,
        which carries the error, instead of waiting for bytes until the group's deadline."""
        try:
            _one_sender(senders)
            if len(transfer.source.ipc_buffers) < len(sizes):
                raise ValueError(
                    f"cuda_ipc ring of {len(transfer.source.ipc_buffers)} buffers for {len(sizes)} buckets"
                )
            for _ in buckets:
                pass
            torch.cuda.current_stream().synchronize()  # readers in other processes see only finished bytes
        finally:
            self.store(transfer.group).set(f"{transfer.tag}/ready", b"1")

    def view(self, transfer: Transfer, index: int, nbytes: int) -> torch.Tensor:
        buffers = transfer.source.ipc_buffers
        if not buffers:
            raise ValueError("cuda_ipc transfer without shared buffers in its source")
        if index == 0:
            self.wait(transfer, [f"{transfer.tag}/ready"], "no version from the sender")
            current = {(b.handle, b.storage_offset_bytes) for b in buffers}
            for key in [k for k in self._opened if k not in current]:  # a ring the sender replaced
                del self._opened[key]
        return self.opened(buffers[index])[:nbytes]

    def receive(self, transfer: Transfer, index: int, out: torch.Tensor, root: int = 0) -> torch.Tensor:
        """Copy bucket `index` out of the sender's ring, with its sum64 computed by the copy itself."""
        _one_sender([root])
        summed = cs.copy_sum64(self.view(transfer, index, out.numel()), out)
        if index == len(transfer.source.ipc_buffers) - 1:
            torch.cuda.current_stream().synchronize()
        return summed

    def release(self, transfer: Transfer) -> None:
        """Tell the sender over the store this refit already reached; none reached, nothing read, no wait."""
        torch.cuda.current_stream().synchronize()  # every read of the ring has finished
        with self._lock:
            store = self._stores.get(group_key(transfer.group))
        if store is not None:
            store.set(f"{transfer.tag}/released/{transfer.group.rank}", b"1")

    def send_commit(self, transfer: Transfer, data: bytes) -> None:
        self.store(transfer.group).set(f"{transfer.tag}/commit", data)

    def receive_commit(self, transfer: Transfer) -> bytes:
        self.wait(transfer, [f"{transfer.tag}/commit"], "no commit from the sender")
        return self.store(transfer.group).get(f"{transfer.tag}/commit")

    def end(self, transfer: Transfer, failed: bool) -> None:
        """The sender waits until every receiver released the ring: the next refit writes it again. Where one
        did not in time, the ring is dropped (the next refit exports a fresh one) and the group forgotten."""
        group = transfer.group
        if group.rank == 0 and not failed:
            released = [f"{transfer.tag}/released/{r}" for r in range(1, group.world_size)]
            try:
                self.wait(transfer, released, "receivers did not release the version")
            except TimeoutError:
                self._rings.pop(torch.cuda.current_device(), None)
                failed = True
        if failed:
            with self._lock:
                self._stores.pop(group_key(group), None)


def _timeout(group) -> datetime.timedelta:
    return datetime.timedelta(seconds=group.timeout_s)


def _one_sender(senders: Sequence[int]) -> None:
    if any(senders):
        raise ValueError(f"cuda_ipc reads one sender's ring; buckets from sender ranks {sorted(set(senders))}")
