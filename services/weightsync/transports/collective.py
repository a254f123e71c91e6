"""gloo (CPU) and NCCL (GPU) transports: each bucket is broadcast by the rank that sends it to the group."""

from __future__ import annotations

import datetime
import os
import threading
from abc import abstractmethod
from collections.abc import Sequence

import torch
import torch.distributed as dist

from .base import Buckets, Transfer, Transport, group_key


def group_store(group, timeout: datetime.timedelta) -> dist.Store:
    """The group's prefix of the weightsync service's TCPStore; connecting is bounded by the timeout."""
    store = dist.TCPStore(group.store_host, group.store_port, is_master=False, timeout=timeout)
    return dist.PrefixStore(group.prefix + "/", store)


class CollectiveTransport(Transport):
    """torch ProcessGroups outside the caller's own world, rendezvoused through the weightsync store, one
    per group, created on first use and reused while it works.

    Built directly on the backend class (not dist.new_group), because trainer and rollout processes
    each already have their own default world. Every collective carries the group's timeout, so a
    dead peer fails the refit instead of hanging it.
    """

    max_senders = 2**31

    def __init__(self) -> None:
        self._groups: dict[tuple, dist.ProcessGroup] = {}
        self._broken: set[tuple] = set()
        self._lock = threading.Lock()
        self._joining: dict[tuple, threading.Lock] = {}
        """One lock per group key, held while that group's rendezvous runs: a rendezvous waits up to the group's
        own timeout for its peers, and under the shared lock one group whose peers never come (a dead trainer, a
        hostile LoadWeights) held up every other group's refit for that long."""

    @abstractmethod
    def _new_group(self, store: dist.Store, rank: int, world_size: int, timeout: datetime.timedelta):
        """The backend's ProcessGroup on this store."""

    def _pg(self, group) -> dist.ProcessGroup:
        key = group_key(group)
        with self._lock:
            if key in self._groups:
                return self._groups[key]
            joining = self._joining.setdefault(key, threading.Lock())
        with joining:  # the same group joined twice at once would be two ranks of one number
            with self._lock:
                if key in self._groups:
                    return self._groups[key]
            timeout = datetime.timedelta(seconds=group.timeout_s)
            pg = self._new_group(group_store(group, timeout), group.rank, group.world_size, timeout)
            with self._lock:
                self._groups[key] = pg
                self._broken.discard(key)
                self._joining.pop(key, None)
            return pg

    def _bcast(self, pg: dist.ProcessGroup, t: torch.Tensor, root: int = 0) -> dist.Work:
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = root, 0
        return pg.broadcast([t], opts)

    def send(self, transfer: Transfer, buckets: Buckets, sizes: Sequence[int], senders: Sequence[int]) -> None:
        """Broadcast our buckets and take part in the other senders' broadcasts of theirs (received into
        scratch and dropped); on GPU nothing blocks the host until the last bucket is on its way."""
        group = transfer.group
        try:
            pg, own, work, scratch = self._pg(group), iter(buckets), None, None
            for index, root in enumerate(senders):
                if root == group.rank:
                    packed, buf = next(own)
                    assert packed == index, f"bucket {packed} packed where {index} was due"
                else:
                    if scratch is None:
                        scratch = torch.empty(max(sizes), dtype=torch.uint8, device=self.device())
                    buf = scratch[: sizes[index]]
                work = self._bcast(pg, buf, root)
                work.wait()  # NCCL: the current stream waits (no host block); gloo: the transfer is done
            self._drain(work)
        except BaseException:
            self._broken.add(group_key(group))  # a half-done broadcast: nothing else may go over it
            raise

    def _drain(self, work: dist.Work | None) -> None:
        if work is not None and self.device_type == "cuda":
            torch.cuda.current_stream().synchronize()

    def receive(self, transfer: Transfer, index: int, out: torch.Tensor, root: int = 0) -> None:
        self._bcast(self._pg(transfer.group), out, root).wait()

    def send_commit(self, transfer: Transfer, data: bytes) -> None:
        if group_key(transfer.group) in self._broken:
            return
        pg, device = self._pg(transfer.group), self.device()
        self._bcast(pg, torch.tensor([len(data)], dtype=torch.int64, device=device)).wait()
        work = self._bcast(pg, torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device))
        work.wait()
        self._drain(work)

    def receive_commit(self, transfer: Transfer) -> bytes:
        pg, device = self._pg(transfer.group), self.device()
        size = torch.zeros(1, dtype=torch.int64, device=device)
        self._bcast(pg, size).wait()
        data = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
        self._bcast(pg, data).wait()
        return data.cpu().numpy().tobytes()

    def end(self, transfer: Transfer, failed: bool) -> None:
        if failed:
            with self._lock:
                self._groups.pop(group_key(transfer.group), None)


class GlooTransport(CollectiveTransport):
    name, device_type = "gloo", "cpu"

    def _new_group(self, store: dist.Store, rank: int, world_size: int, timeout: datetime.timedelta):
        return dist.ProcessGroupGloo(store, rank, world_size, timeout)


class NcclTransport(CollectiveTransport):
    name, device_type = "nccl", "cuda"

    def _new_group(self, store: dist.Store, rank: int, world_size: int, timeout: datetime.timedelta):
        # Blocking wait makes a failed or timed-out broadcast raise in the waiting thread; without it the
        # watchdog tears the whole process down, and a rollout engine must survive a dead trainer.
        os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")  # abort communicators, keep the process
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, world_size, opts)
