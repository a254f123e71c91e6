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


def dr_grpo_advantages(rewards_G: list[float]) -> list[float]:
    """r - mean within one prompt's group, without Dr.GRPO's removed std division (arXiv 2503.20783):
    dividing by the std up-weights prompts that are nearly always or never solved."""
    n = len(rewards_G)
    if n < 2:
        raise ValueError(f"a GRPO group needs >= 2 samples, got {n}")
    mean = sum(rewards_G) / n
    return [r - mean for r in rewards_G]


def groups_with_signal(rewards_PG: list[list[float]]) -> list[int]:
    """Indices of the groups whose rewards are not all equal: DAPO's dynamic sampling keeps only these.

    A group with zero reward variance has zero advantage on every token, so it adds no gradient but
    still costs a forward/backward and dilutes the token-mean normaliser.
    """
    return [p for p, rewards in enumerate(rewards_PG) if max(rewards) > min(rewards)]


def overlong_penalty(num_tokens: int, max_tokens: int, buffer_tokens: int, penalty: float = 1.0) -> float:
    """DAPO's soft overlong punishment, added to the reward: 0 up to max_tokens - buffer_tokens, then
    falling linearly to -penalty at max_tokens, and -penalty beyond."""
    if not 0 < buffer_tokens <= max_tokens:
        raise ValueError(f"buffer_tokens must be in [1, max_tokens={max_tokens}], got {buffer_tokens}")
    start = max_tokens - buffer_tokens
    if num_tokens <= start:
        return 0.0
    return -penalty * min(num_tokens - start, buffer_tokens) / buffer_tokens
