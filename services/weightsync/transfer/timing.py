"""A refit's time on one side: named moments after a start, logged as one line (the start's wall clock time is
in it, so a trainer's line and a worker's line of the same refit can be laid side by side), and the garbage
collector held off while the refit runs."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager


class Marks:
    def __init__(self) -> None:
        self.wall, self._start = time.time(), time.perf_counter()
        self._marks: list[tuple[str, float]] = []

    def mark(self, what: str) -> None:
        self._marks.append((what, time.perf_counter()))

    def elapsed(self) -> float:
        return time.perf_counter() - self._start

    def __str__(self) -> str:
        steps = ", ".join(f"{what} +{(t - self._start) * 1e3:.1f}ms" for what, t in self._marks)
        return f"{steps} (from {self.wall:.4f})"


@contextmanager
def gc_held() -> Iterator[None]:
    """No garbage collection inside the block: a full collection of a trainer's or an engine's heap takes tens
    of milliseconds, more than a whole GPU refit; it runs after the block instead, when the allocations call
    for it."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
