"""The data-plane contract: every method a sender or a receiver calls on a transport, and nothing else.

A transport is one instance per process and kind (transports/__init__.py makes them); it owns what
outlives one refit: rendezvoused groups, the sender's shared ring or listener, opened handles. Imports
no protos: groups and sources are read by attribute (the TransferGroup and DataSource messages, or any
object with the same fields), so the benchmark runs transports without gRPC.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

Buckets = Iterable[tuple[int, torch.Tensor]]
"""(bucket index, packed buffer) in bucket order."""


@dataclass(frozen=True, slots=True)
class Transfer:
    """One refit as the data plane sees it: its group, where the sender's bytes are, its tag."""

    group: Any
    """TransferGroup fields: store_host, store_port, prefix, world_size, rank, backend, timeout_s."""
    source: Any
    """DataSource fields (sender_id, ucxx_address, ipc_buffers), or None where the group suffices."""
    tag: str
    """Names the refit: store keys, pull requests."""


@dataclass(frozen=True, slots=True)
class Offer:
    """What receivers need besides the group to reach the sender's bytes (DataSource's fields)."""

    ucxx_address: str = ""
    ipc_buffers: tuple = ()


class Transport(ABC):
    name: ClassVar[str]
    device_type: ClassVar[str]
    """"cpu" or "cuda": where buckets must be to be sent, and where received ones land."""
    max_senders: ClassVar[int] = 1
    """Sending ranks one refit may have (each broadcasting its own buckets: collectives only)."""
    joinable: ClassVar[bool] = False
    """Receivers fetch by themselves: one that registers mid-run pulls the current version alone."""
    in_place: ClassVar[bool] = False
    """The sender's ring holds the whole version and receivers read it where it lies (`view`): they verify it
    there and copy it straight into their engine, then `release` it; the sender's `end` waits for that."""

    def device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device()) if self.device_type == "cuda" else torch.device("cpu")

    def offer(self, bucket_bytes: int, num_buffers: int, host: str) -> tuple[list[torch.Tensor], Offer]:
        """Sender, before it announces a refit: the ring of buffers to pack into, and what receivers need
        besides the group. `host` is where a listener binds and is reached."""
        return [torch.empty(bucket_bytes, dtype=torch.uint8, device=self.device()) for _ in range(num_buffers)], Offer()

    @abstractmethod
    def send(self, transfer: Transfer, buckets: Buckets, sizes: Sequence[int], senders: Sequence[int]) -> None:
        """Send our buckets in order. `senders[i]` is the group rank that sends bucket i (of `sizes[i]`
        bytes); with several senders each takes part in the others' sends too."""

    @abstractmethod
    def receive(self, transfer: Transfer, index: int, out: torch.Tensor, root: int = 0) -> torch.Tensor | None:
        """Fill `out` with bucket `index`, sent by group rank `root`; return its sum64 if the copy computed it."""

    def view(self, transfer: Transfer, index: int, nbytes: int) -> torch.Tensor:
        """Receiver of an in_place transport: the sender's buffer of bucket `index`, readable until `release`."""
        raise NotImplementedError(f"{self.name} copies buckets out; it has no in-place view")

    def release(self, transfer: Transfer) -> None:  # noqa: B027 - a no-op unless in_place
        """Receiver, once it no longer reads the sender's buffers (in_place transports); a no-op elsewhere."""

    @abstractmethod
    def send_commit(self, transfer: Transfer, data: bytes) -> None:
        """Group rank 0, after every bucket: the checksums (or the error) that receivers verify against.
        After a failed send this is best effort: where the group is broken receivers fail on their deadline."""

    @abstractmethod
    def receive_commit(self, transfer: Transfer) -> bytes:
        """Every other member, after every bucket: what rank 0 committed."""

    @abstractmethod
    def end(self, transfer: Transfer, failed: bool) -> None:
        """After a refit on this side: per-refit connections close; after a failure the group is forgotten,
        so the next refit rendezvouses a fresh one."""


def first_line(e: BaseException) -> str:
    """An exception as one short line (NCCL and gloo errors run to pages), for errors that name a peer."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def group_key(group) -> tuple:
    return (group.store_host, group.store_port, group.prefix, group.rank, group.world_size, group.backend)
