"""A task from a reasoning-gym generator: its entries as prompts, its config checked key by key."""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Mapping
from typing import Any

from ..config import TaskSection
from .data import Prompt, TaskData, TaskError, _without_overlap


def _json_safe(value: object) -> Any:
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((_json_safe(v) for v in value), key=repr)
    return str(value)  # Fraction, sympy expressions, numpy scalars, ...


def _gym_dataset(task: TaskSection, size: int, seed: int) -> Any:
    import reasoning_gym
    from reasoning_gym.factory import DATASETS

    name, label = task.generator, f"reasoning_gym {task.generator}"
    if name not in DATASETS:
        close = difflib.get_close_matches(name, DATASETS, n=3) or sorted(DATASETS)[:8]
        raise TaskError(f"reasoning_gym: unknown generator {name!r}; e.g. {', '.join(close)} ({len(DATASETS)} in all)")
    keys = [f.name for f in dataclasses.fields(DATASETS[name][1]) if f.name not in ("size", "seed")]
    for key in task.generator_config:
        if key in ("size", "seed"):
            raise TaskError(f"{label}: task.generator_config.{key}: set task.train_{key} / task.eval_{key} instead")
        if key not in keys:
            raise TaskError(f"{label}: task.generator_config has no key {key!r}; it takes {', '.join(keys)}")
    try:
        return reasoning_gym.create_dataset(name, size=size, seed=seed, **task.generator_config)
    except (AssertionError, TypeError, ValueError) as e:  # the generator config's own validation
        raise TaskError(f"{label}: bad task.generator_config {task.generator_config} ({e or type(e).__name__})") from e


def _gym_prompts(task: TaskSection, split: str, size: int, seed: int) -> list[Prompt]:
    if size == 0:
        return []
    label = f"reasoning_gym {task.generator}: {split} prompt"
    # Prompt i is create_dataset(...)[i], so the index in a message is the one that regenerates it.
    return [
        Prompt(entry["question"], str(entry["answer"]), _json_safe(entry["metadata"]), source=f"{label} {i}")
        for i, entry in enumerate(_gym_dataset(task, size, seed))
    ]


def _load_gym_task(task: TaskSection) -> TaskData:
    train = _gym_prompts(task, "train", task.train_size, task.train_seed)
    held_out = _gym_prompts(task, "eval", task.eval_size, task.eval_seed)
    return _without_overlap(train, held_out, f"reasoning_gym {task.generator}")
