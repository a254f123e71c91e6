"""PromptOrder: the seeded, epoch-aware order a run takes its training prompts in."""

from __future__ import annotations

import random


class PromptOrder:
    """Seeded, epoch-aware order over n prompts with a resumable cursor."""

    def __init__(self, n: int, seed: int, cursor: int = 0):
        if n < 1 or cursor < 0:
            raise ValueError(f"PromptOrder needs n >= 1 and cursor >= 0, got n={n}, cursor={cursor}")
        self.n, self.seed, self.cursor = n, seed, cursor
        self._epoch = -1
        self._permutation: list[int] = []

    @property
    def epoch(self) -> int:
        return self.cursor // self.n

    def take(self, k: int) -> list[int]:
        """The next k indices; every epoch is a fresh permutation of range(n) that depends only on (seed, epoch)."""
        out: list[int] = []
        while len(out) < k:
            if self._epoch != self.epoch:
                self._epoch, self._permutation = self.epoch, self._shuffled(self.epoch)
            start = self.cursor % self.n
            chunk = self._permutation[start : start + k - len(out)]
            out += chunk
            self.cursor += len(chunk)
        return out

    def _shuffled(self, epoch: int) -> list[int]:
        order = list(range(self.n))
        # A string seed is hashed with SHA-512: the same order in every process, whatever PYTHONHASHSEED is.
        random.Random(f"{self.seed}/{epoch}").shuffle(order)
        return order
