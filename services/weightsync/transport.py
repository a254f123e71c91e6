"""Data plane of a refit: broadcast buckets from the sender (rank 0) to every receiver in a group."""

from __future__ import annotations

import datetime
import threading
from typing import Protocol

import torch
import torch.distributed as dist

from protos.grpo.v1 import weights_pb2

from . import manifest as mf


class WeightTransport(Protocol):
    def send(self, buckets: list[torch.Tensor]) -> None: ...
    def receive(self, sizes: list[int]) -> list[torch.Tensor]: ...


class CollectiveTransport:
    """A torch ProcessGroup outside the caller's own world, rendezvoused through the weightsync store.

    Built directly on the backend class (not dist.new_group), because trainer and rollout processes
    each already have their own default world. Every collective carries the group's timeout, so a
    dead peer fails the refit instead of hanging it.
    """

    def __init__(self, group: weights_pb2.TransferGroup):
        timeout = datetime.timedelta(seconds=group.timeout_s)
        store = dist.TCPStore(group.store_host, group.store_port, is_master=False, timeout=timeout)
        prefixed = dist.PrefixStore(group.prefix + "/", store)
        if group.backend == "gloo":
            self.pg = dist.ProcessGroupGloo(prefixed, group.rank, group.world_size, timeout)
            self.device = torch.device("cpu")
        elif group.backend == "nccl":
            self.pg = dist.ProcessGroupNCCL(prefixed, group.rank, group.world_size)
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            raise ValueError(f"transfer backend must be 'gloo' or 'nccl', got {group.backend!r}")

    def _bcast(self, t: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = 0, 0
        self.pg.broadcast([t], opts).wait()

    def send(self, buckets: list[torch.Tensor]) -> None:
        for b in buckets:
            self._bcast(b.to(self.device, non_blocking=True))

    def receive(self, sizes: list[int]) -> list[torch.Tensor]:
        out = []
        for n in sizes:
            buf = torch.empty(n, dtype=torch.uint8, device=self.device)
            self._bcast(buf)
            out.append(buf.cpu())
        return out


_groups: dict[tuple, CollectiveTransport] = {}
_groups_lock = threading.Lock()


def _key(group: weights_pb2.TransferGroup) -> tuple:
    return (group.store_host, group.store_port, group.prefix, group.rank, group.world_size, group.backend)


def open_group(group: weights_pb2.TransferGroup) -> CollectiveTransport:
    """The transport of this group, created on first use (a collective rendezvous)."""
    with _groups_lock:
        if _key(group) not in _groups:
            _groups[_key(group)] = CollectiveTransport(group)
        return _groups[_key(group)]


def drop_group(group: weights_pb2.TransferGroup) -> None:
    """Forget a group after a failed transfer; the next refit rendezvouses a fresh one."""
    with _groups_lock:
        _groups.pop(_key(group), None)


def receive_version(
    manifest: weights_pb2.WeightManifest, group: weights_pb2.TransferGroup
) -> tuple[list[tuple[str, torch.Tensor]], str]:
    """Receive every bucket, verify each checksum; return the tensors and the recomputed checksum."""
    try:
        buckets = open_group(group).receive([b.nbytes for b in manifest.buckets])
    except Exception:
        drop_group(group)
        raise
    sums = []
    for spec, buf in zip(manifest.buckets, buckets):
        got = mf.checksum(buf.numpy())
        if got != spec.checksum:
            raise ValueError(
                f"bucket {spec.index} of version {manifest.policy_version}: checksum {got} != {spec.checksum}"
            )
        sums.append(got)
    named = [nt for i, buf in enumerate(buckets) for nt in mf.unpack_bucket(buf, list(manifest.tensors), i)]
    return named, mf.combine(sums)
