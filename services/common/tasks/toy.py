"""The toy task: endless generated prompts of symbol classes, no held-out set."""

from __future__ import annotations

import random
from collections.abc import Iterator

from .data import Prompt

# The built-in task: a prompt is a few symbols of one class; the answer should continue with
# symbols of that same class. A uniform random policy over the tiny model's vocabulary hits a
# class with probability 8 / vocab_size (about 0.11), so a random model scores well under 0.2.
SYMBOL_CLASSES = ("abcdefgh", "ijklmnop", "qrstuvwx", "01234567")


def builtin_prompts(seed: int, prompt_len: int) -> Iterator[Prompt]:
    rng = random.Random(seed)
    while True:
        symbols = rng.choice(SYMBOL_CLASSES)
        yield Prompt("".join(rng.choice(symbols) for _ in range(prompt_len)), symbols)
