"""Group-relative advantages (GRPO). Pure functions on plain lists: the coordinator needs no torch."""

from __future__ import annotations

import math


def group_advantages(rewards_G: list[float], eps: float = 1e-6) -> list[float]:
    """(r - mean) / (std + eps) within one prompt's group; std is the unbiased sample std."""
    n = len(rewards_G)
    if n < 2:
        raise ValueError(f"a GRPO group needs >= 2 samples, got {n}")
    mean = sum(rewards_G) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards_G) / (n - 1))
    return [(r - mean) / (std + eps) for r in rewards_G]
