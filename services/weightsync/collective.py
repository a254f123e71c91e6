"""gloo (CPU) and NCCL (GPU) transport: the sender, rank 0, broadcasts each bucket to the group."""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist


def group_store(group, timeout: datetime.timedelta) -> dist.Store:
    """The group's prefix of the weightsync service's TCPStore; connecting is bounded by the timeout."""
    store = dist.TCPStore(group.store_host, group.store_port, is_master=False, timeout=timeout)
    return dist.PrefixStore(group.prefix + "/", store)


class CollectiveTransport:
    """A torch ProcessGroup outside the caller's own world, rendezvoused through the weightsync store.

    Built directly on the backend class (not dist.new_group), because trainer and rollout processes
    each already have their own default world. Every collective carries the group's timeout, so a
    dead peer fails the refit instead of hanging it.
    """

    def __init__(self, group):
        timeout = datetime.timedelta(seconds=group.timeout_s)
        store = group_store(group, timeout)
        if group.backend == "gloo":
            self.pg = dist.ProcessGroupGloo(store, group.rank, group.world_size, timeout)
            self.device = torch.device("cpu")
        else:
            assert group.backend == "nccl", group.backend
            self.pg = _nccl_group(store, group.rank, group.world_size, timeout)
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.timeout, self.rank = timeout, group.rank

    def _bcast(self, t: torch.Tensor, root: int = 0) -> dist.Work:
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = root, 0
        return self.pg.broadcast([t], opts)

    def send(self, buckets: Iterable[tuple[int, torch.Tensor]], tag: str) -> None:
        """Broadcast each bucket; on GPU nothing blocks the host until the last bucket is on its way."""
        work = None
        for _, buf in buckets:
            work = self._bcast(buf)
            work.wait()  # NCCL: the current stream waits (no host block); gloo: the transfer is done
        self._drain(work)

    def send_share(
        self, own: Iterable[tuple[int, torch.Tensor]], senders: tuple[int, ...], scratch: Callable[[int], torch.Tensor]
    ) -> None:
        """One of several senders: broadcast our buckets (`own`, in bucket order) and take part in the
        other senders' broadcasts of theirs, received into scratch(index) and dropped."""
        own, work = iter(own), None
        for index, root in enumerate(senders):
            if root == self.rank:
                packed, buf = next(own)
                assert packed == index, f"bucket {packed} packed where {index} was due"
            else:
                buf = scratch(index)
            work = self._bcast(buf, root)
            work.wait()
        self._drain(work)

    def _drain(self, work: dist.Work | None) -> None:
        if work is not None and self.device.type == "cuda":
            torch.cuda.current_stream().synchronize()

    def receive(self, index: int, out: torch.Tensor, tag: str, root: int = 0) -> None:
        self._bcast(out, root).wait()


def _nccl_group(store: dist.Store, rank: int, world_size: int, timeout: datetime.timedelta):
    # Blocking wait makes a failed or timed-out broadcast raise in the waiting thread; without it the
    # watchdog tears the whole process down, and a rollout engine must survive a dead trainer.
    os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")  # abort communicators, keep the process
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = timeout
    return dist.ProcessGroupNCCL(store, rank, world_size, opts)
