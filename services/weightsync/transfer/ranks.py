"""The sending ranks of one refit: a lone sender, or every rank of the trainer's process group.

The sender's one path asks these for what must agree across ranks (rank 0's answer, everyone's share).
No rank but 0 may raise (a trainer rank that raises takes the trainer down): rank 0's failures reach
the others as a value, and they return None.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch.distributed as dist

T = TypeVar("T")


class Failed:
    """What ranks other than 0 get where rank 0 failed: rank 0 raises the error itself."""

    def __init__(self, message: str):
        self.message = message


class Ranks:
    """One sender, rank 0 of 1: every agreement is local."""

    @property
    def rank(self) -> int:
        return 0

    @property
    def world(self) -> int:
        return 1

    def broadcast(self, value: Any) -> Any:
        """Rank 0's value, on every rank."""
        return value

    def gather(self, value: Any) -> list:
        """Every rank's value, in rank order, on every rank."""
        return [value]

    def on_rank0(self, fn: Callable[[], T]) -> T | Failed:
        """fn's value, computed on rank 0 and broadcast; where fn raised, rank 0 raises and the others get Failed."""
        value: Any = None
        failure = None
        if self.rank == 0:
            try:
                value = fn()
            except Exception as e:  # the other ranks wait for the value: they must hear of it
                failure, value = e, Failed(f"{type(e).__name__}: {e}")
        value = self.broadcast(value)
        if failure is not None:
            raise failure
        return value


class GroupRanks(Ranks):
    """Every rank of a torch process group (the trainer's, by default) sends its share."""

    def __init__(self, group: dist.ProcessGroup | None = None):
        self.group = group

    @property
    def rank(self) -> int:
        return dist.get_rank(self.group)

    @property
    def world(self) -> int:
        return dist.get_world_size(self.group)

    def broadcast(self, value: Any) -> Any:
        box = [value]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def gather(self, value: Any) -> list:
        out = [None] * self.world
        dist.all_gather_object(out, value, group=self.group)
        return out
