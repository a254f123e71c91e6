"""A prompt, the task data of a source, and the one error every source raises."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Prompt:
    text: str
    """The user's prompt as in the data (not rendered)."""
    answer: str
    """Reference answer the rewards compare against."""
    metadata: dict = field(default_factory=dict)
    """JSON-serialisable: the reasoning-gym entry's metadata, or a file row's other scalar fields."""
    source: str = field(default="", compare=False)
    """Where the prompt came from, for error messages: "data/train.jsonl: row 3"."""


class TaskError(ValueError):
    """One line naming the file, row and field (or the generator and key) at fault."""


@dataclass(frozen=True, slots=True)
class TaskData:
    train: list[Prompt]
    eval: list[Prompt]


def _without_overlap(train: list[Prompt], held_out: list[Prompt], label: str) -> TaskData:
    held_texts = {p.text for p in held_out}
    kept = [p for p in train if p.text not in held_texts]
    if not kept:
        raise TaskError(
            f"{label}: no training prompts left after holding out {len(held_out)} for eval; lower task.eval_size"
        )
    return TaskData(kept, held_out)


def _one_line(error: BaseException) -> str:
    cause = error.__cause__ or error
    text = str(cause).strip().splitlines()
    return text[0] if text else type(cause).__name__
