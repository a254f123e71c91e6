"""The data-plane seam: one small Protocol, a factory keyed by the transport name, and group caching.

Imports no protos: the transports read groups and sources by attribute (the TransferGroup and
DataSource messages, or any object with the same fields), so the benchmark runs them without gRPC.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import torch

from . import checksum as cs

TRANSPORTS: tuple[str, ...] = ("gloo", "nccl", "cuda_ipc", "ucxx")


class WeightTransport(Protocol):
    device: torch.device
    """Where buckets must be to be sent, and where received buckets land."""

    def send(self, buckets: Iterable[tuple[int, torch.Tensor]], tag: str) -> None:
        """Send (index, bucket) in order; `tag` names the refit (keys, pull requests)."""

    def receive(self, index: int, out: torch.Tensor, tag: str, root: int = 0) -> torch.Tensor | None:
        """Fill `out` with bucket `index` of refit `tag`, sent by group rank `root` (several senders: the
        collective transports only); return its sum64 if the copy computed it."""


def first_line(e: BaseException) -> str:
    """An exception as one short line (NCCL and gloo errors run to pages), for errors that name a peer."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def resolve(name: str) -> str:
    """'auto' is NCCL where a GPU is visible and gloo otherwise (what the skeleton always did)."""
    if name == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    return name


def device_of(name: str) -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if name in ("nccl", "cuda_ipc") else torch.device("cpu")


def make_transport(group, source) -> WeightTransport:
    if group.backend in ("gloo", "nccl"):
        from .collective import CollectiveTransport

        return CollectiveTransport(group)
    if group.backend == "cuda_ipc":
        from .cuda_ipc import CudaIpcTransport

        return CudaIpcTransport(group, source)
    if group.backend == "ucxx":
        from .ucxx_pull import UcxxTransport

        return UcxxTransport(group, source)
    raise ValueError(f"transport must be one of {TRANSPORTS}, got {group.backend!r}")


_groups: dict[tuple, WeightTransport] = {}
_groups_lock = threading.Lock()


def _key(group) -> tuple:
    return (group.store_host, group.store_port, group.prefix, group.rank, group.world_size, group.backend)


def open_group(group, source=None) -> WeightTransport:
    """The transport of this group, created on first use (a rendezvous) and reused while it works.

    ucxx connections are per refit: a join and a regular refit may pull at the same time.
    """
    if group.backend == "ucxx":
        return make_transport(group, source)
    with _groups_lock:
        if _key(group) not in _groups:
            _groups[_key(group)] = make_transport(group, source)
        return _groups[_key(group)]


def drop_group(group) -> None:
    """Forget a group after a failed transfer; the next refit rendezvouses a fresh one."""
    with _groups_lock:
        _groups.pop(_key(group), None)


def receive_buckets(
    transport: WeightTransport, sizes: list[int], algo: str, tag: str, senders: list[int] | None = None
) -> tuple[list[torch.Tensor], list[str]]:
    """Receive every bucket into fresh buffers, checksumming each while the next one arrives.

    The buffers hold the whole version until the caller verified it against the sender's commit:
    only then may an engine see any of it (a failed refit leaves the previous version in service).
    `senders` names each bucket's sending rank where several trainer ranks send (collective transports).
    """
    out = [torch.empty(n, dtype=torch.uint8, device=transport.device) for n in sizes]

    def receive(i: int, buf: torch.Tensor):
        return transport.receive(i, buf, tag, root=senders[i] if senders else 0)

    if transport.device.type == "cuda":
        main, side, sums = torch.cuda.current_stream(), torch.cuda.Stream(), []
        for i, buf in enumerate(out):
            summed = receive(i, buf)  # cuda_ipc: summed inside its copy, on main
            if summed is None:
                side.wait_stream(main)
                with torch.cuda.stream(side):
                    summed = cs.sum64(buf)
            sums.append(summed)
        main.wait_stream(side)
        return out, cs.digests(sums)
    with ThreadPoolExecutor(1, thread_name_prefix="weightsync-sum") as pool:
        futures = []
        for i, buf in enumerate(out):
            receive(i, buf)
            futures.append(pool.submit(cs.bucket_checksum, buf, algo))
        return out, [f.result() for f in futures]
