"""Where a task.name's prompts come from (SOURCES), loading them, and the up-front check of every prompt."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..config import RunConfig, TaskSection
from .data import TaskData, TaskError
from .files import _load_file_task
from .gym import _load_gym_task
from .render import PromptRenderer

_RENDER_CHUNK = 1024  # prompts tokenized per batch by check_task


def load_task(task: TaskSection) -> TaskData | None:
    """Training and held-out prompts of the task's source (SOURCES); train never holds an eval prompt's text. None
    for a source without finite data: the toy task, whose prompts the coordinator draws from builtin_prompts."""
    return SOURCES[task.name](task)


SOURCES: dict[str, Callable[[TaskSection], TaskData | None]] = {
    "class_continuation": lambda task: None,  # the toy task: endless generated prompts, no held-out set
    "dataset": _load_file_task,
    "jsonl": _load_file_task,
    "reasoning_gym": _load_gym_task,
}
"""Where a task.name's prompts come from: a new source is its loader (returning TaskData) and one line here, its
name in TaskSection.name's Literal (services/common/config/task.py)."""


def check_task(cfg: RunConfig) -> TaskData | None:
    """Load the task and check every prompt fits the context, before any process starts; None for the toy task."""
    data = load_task(cfg.task)
    if data is None:
        return None
    if not Path(cfg.model.path).is_dir():
        raise TaskError(f"model.path {cfg.model.path!r}: no such folder (create the model before checking the task)")
    limit = cfg.rollout.max_model_len - cfg.coordinator.max_tokens
    renderer = PromptRenderer(cfg.model.path, cfg.task.system_prompt, cfg.task.chat_template, cfg.task.episode.tools)
    for prompts in (data.train, data.eval):
        for start in range(0, len(prompts), _RENDER_CHUNK):
            chunk = prompts[start : start + _RENDER_CHUNK]
            for prompt, ids in zip(chunk, renderer.ids_batch(chunk)):
                if len(ids) > limit:
                    raise TaskError(
                        f"{prompt.source}: prompt is {len(ids)} tokens; "
                        f"rollout.max_model_len - coordinator.max_tokens leaves {limit}"
                    )
    return data
