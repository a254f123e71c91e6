"""Prompt sources and verifiable rewards. Pure Python: no torch, no model."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

# The built-in task: a prompt is a few symbols of one class; the answer should continue with
# symbols of that same class. A uniform random policy over the tiny model's vocabulary hits a
# class with probability 8 / vocab_size (about 0.11), so a random model scores well under 0.2.
SYMBOL_CLASSES = ("abcdefgh", "ijklmnop", "qrstuvwx", "01234567")


@dataclass(frozen=True, slots=True)
class Prompt:
    text: str
    reward: str
    """Name of the reward function in REWARDS."""
    answer: str
    """Reference the reward function compares against."""


def class_continuation(pieces: list[str], answer: str) -> float:
    """Fraction of generated tokens that are single symbols of the answer's class."""
    if not pieces:
        return 0.0
    return sum(1 for p in pieces if len(p) == 1 and p in answer) / len(pieces)


def exact_match(pieces: list[str], answer: str) -> float:
    """1.0 if the response, stripped, starts with the answer."""
    return float("".join(pieces).strip().startswith(answer.strip()))


REWARDS: dict[str, Callable[[list[str], str], float]] = {
    "class_continuation": class_continuation,
    "exact_match": exact_match,
}


def reward_fn(name: str) -> Callable[[list[str], str], float]:
    if name not in REWARDS:
        raise ValueError(f"unknown reward {name!r}; choose one of {sorted(REWARDS)}")
    return REWARDS[name]


def builtin_prompts(seed: int, prompt_len: int) -> Iterator[Prompt]:
    rng = random.Random(seed)
    while True:
        symbols = rng.choice(SYMBOL_CLASSES)
        yield Prompt("".join(rng.choice(symbols) for _ in range(prompt_len)), "class_continuation", symbols)


def jsonl_prompts(path: str | Path, seed: int) -> Iterator[Prompt]:
    """Cycle through a JSONL file in a seeded order, one epoch after another."""
    rows = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            prompt = Prompt(str(row["prompt"]), str(row.get("reward", "exact_match")), str(row.get("answer", "")))
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{lineno}: expected {{'prompt': str, 'reward': str, 'answer': str}}: {e}") from e
        reward_fn(prompt.reward)
        rows.append(prompt)
    if not rows:
        raise ValueError(f"{path}: no prompts")
    rng = random.Random(seed)
    while True:
        order = list(range(len(rows)))
        rng.shuffle(order)
        yield from (rows[i] for i in order)
