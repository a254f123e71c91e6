"""The learning rate at each optimizer step: warmup, then constant or a decay to zero (transformers' formulas, the
schedules TRL's lr_scheduler_type names)."""

from __future__ import annotations

import math

TRANSFORMERS_NAMES = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}
"""Each trainer.lr_schedule under the name transformers' get_scheduler (TRL's lr_scheduler_type) gives it."""


def lr_factor(step: int, schedule: str, warmup_steps: int, total_steps: int) -> float:
    """Multiplier of the base lr for optimizer step `step` (0-based) of `total_steps`: linear warmup from 0 over
    warmup_steps, then 1 (constant), a straight line to 0 at total_steps (linear), or half a cosine to 0 (cosine)."""
    if schedule != "constant" and total_steps <= 0:
        raise ValueError(f"a {schedule} lr schedule needs its length (trainer.lr_schedule_steps), got {total_steps}")
    if step < warmup_steps:
        return step / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    if schedule == "linear":
        return max(0.0, 1.0 - progress)
    if schedule == "cosine":
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    raise ValueError(f"unknown lr schedule {schedule!r}")
