"""The built-in reward functions (BUILTIN, by name) and load_reward, which also resolves an import path.

A reward is a plain function ``(prompt, completion, answer, metadata) -> float``. ``metadata`` is the task row's
metadata plus ``finish_reason`` ("stop" or "length") and ``num_tokens``, added by the rollout worker. Rewards are named
either by a key of BUILTIN or by an import path ``pkg.module:function``.
"""

from __future__ import annotations

import importlib
import logging
import re
import threading
from collections.abc import Callable
from functools import cache
from typing import Any

from services.common.child import import_function

RewardFn = Callable[[str, str, str, dict], float]

_BOXED = re.compile(r"\\boxed\s*\{")
# A minus sign belongs to the number unless it follows something it could be subtracting from ("5-3" ends in 3).
# Thousands groups are exactly three digits, so "1,2345" is two numbers, not one.
_NUMBER = re.compile(r"(?:(?<![\w)\]}])-)?(?:\d+(?:,\d{3}(?!\d))*(?:\.\d+)?|\.\d+)")
_WHITESPACE = re.compile(r"\s+")


# ---------------------------------------------------------------------------------------------------------------------
# Answer extraction


def _boxed_contents(text: str) -> list[str]:
    """Contents of every complete \\boxed{...} in text, in order, with nested braces kept whole."""
    found = []
    for match in _BOXED.finditer(text):
        depth, start = 1, match.end()
        for pos in range(start, len(text)):
            if text[pos] == "{":
                depth += 1
            elif text[pos] == "}":
                depth -= 1
                if depth == 0:
                    found.append(text[start:pos])
                    break
    return found


def extract_answer(text: str) -> str:
    """The last \\boxed{...}'s content, else the last number (thousands commas removed), else the stripped text."""
    boxed = _boxed_contents(text)
    if boxed:
        return boxed[-1].strip()
    numbers_found = _NUMBER.findall(text)
    if numbers_found:
        return numbers_found[-1].replace(",", "")
    return text.strip()


# ---------------------------------------------------------------------------------------------------------------------
# Built-in rewards


@cache
def _math_verify() -> tuple[Callable[..., Any], Callable[..., Any]]:
    from math_verify import parse, verify

    # math-verify logs every expression it fails to parse; a policy early in training produces many of those.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    return parse, verify


def _math_parse(text: str, timeout: int | None) -> list:
    parse, _ = _math_verify()
    # Inside $...$ math-verify's latex extractor reads plain numbers, fractions and latex alike.
    return parse(f"${text}$", parsing_timeout=timeout)


def cut_short(metadata: dict) -> bool:
    """The completion stopped at max_tokens, not at EOS: it has no final answer (the rollout's finish_reason)."""
    return metadata.get("finish_reason") == "length"


def math_reward(prompt: str, completion: str, answer: str, metadata: dict) -> float:
    """1.0 if the completion's extracted answer is mathematically equal to the reference (math-verify); 0.0 for a
    completion cut at max_tokens (cut_short: see reasoning_gym_reward)."""
    if cut_short(metadata):
        return 0.0
    _, verify = _math_verify()
    # math-verify times itself out with signal.alarm, which only works in the main thread.
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    gold_text = answer.strip()
    if _NUMBER.fullmatch(gold_text):
        gold_text = gold_text.replace(",", "")
    gold = _math_parse(gold_text, timeout)
    pred = _math_parse(extract_answer(completion), timeout)
    if not gold or not pred:
        return 0.0
    return float(verify(gold, pred, timeout_seconds=timeout))


def _normalize(text: str) -> str:
    return _WHITESPACE.sub(" ", text.strip()).lower()


def exact_reward(prompt: str, completion: str, answer: str, metadata: dict) -> float:
    """1.0 iff the whole completion equals the answer, ignoring case and runs of whitespace."""
    return float(_normalize(completion) == _normalize(answer))


@cache
def _reasoning_gym_scorer(dataset: str) -> Callable[[str, dict], float]:
    import reasoning_gym

    return reasoning_gym.get_score_answer_fn(dataset)


def reasoning_gym_partial_reward(prompt: str, completion: str, answer: str, metadata: dict) -> float:
    """reasoning-gym's own verifier for the dataset named by metadata["source_dataset"], partial credit included."""
    dataset = metadata.get("source_dataset")
    if not dataset:
        raise ValueError("metadata has no 'source_dataset'; the reasoning_gym reward needs reasoning-gym rows")
    entry = {"question": prompt, "answer": answer, "metadata": metadata}
    return float(_reasoning_gym_scorer(dataset)(extract_answer(completion), entry))


def reasoning_gym_reward(prompt: str, completion: str, answer: str, metadata: dict) -> float:
    """1.0 where reasoning-gym's verifier gives full marks, else 0.0.

    Its default verifier gives a wrong answer that contains the right one partial credit (len(answer) / len(given):
    "10" for 1 scores 0.5), and GRPO's std normalisation turns a group's lone 0.5 into the same push as a lone
    correct answer: on letter_counting that taught "appears 10 times" and held-out accuracy fell from 0.15 to 0.04
    (bench/README.md: "The collapse on an unseen task"). The partial credit stays as `reasoning_gym_partial`.

    A completion cut at max_tokens scores 0.0: it has no final answer, and its last number is whatever it was
    saying when cut. On products seed 0 the one "correct" sample of step 1 was "I'm ready to assist. ... Please use
    the numbers 00," (answer 0, cut at 32 tokens); alone in its group it got the full push, and by step 20 the
    held-out greedy replies were "I'm ready to assist. What's your next question?" (0.35 -> 0.08)."""
    if cut_short(metadata):
        return 0.0
    return float(full_marks(reasoning_gym_partial_reward(prompt, completion, answer, metadata)))


def eos_reward(prompt: str, completion: str, answer: str, metadata: dict) -> float:
    """1.0 if generation stopped at EOS rather than at max_tokens."""
    return float(metadata.get("finish_reason") == "stop")


def boxed_reward(prompt: str, completion: str, answer: str, metadata: dict) -> float:
    """1.0 if the completion contains a complete \\boxed{...}."""
    return float(bool(_boxed_contents(completion)))


def class_continuation_reward(prompt: str, completion: str, answer: str, metadata: dict) -> float:
    """Fraction of generated tokens that are symbols of the answer's class (the toy tokenizer: one char a token)."""
    num_tokens = metadata["num_tokens"]
    if num_tokens == 0:
        return 0.0
    return sum(1 for ch in completion if ch in answer) / num_tokens


def env_reward(prompt: str, completion: str, answer: str, metadata: dict) -> float:
    """The sum of the rewards a multi-turn episode's environment gave its steps (task.episode.environment)."""
    if "env_reward" not in metadata:
        raise ValueError("the env reward needs a multi-turn episode: set task.episode.environment")
    return float(metadata["env_reward"])


def tool_use_reward(prompt: str, completion: str, answer: str, metadata: dict) -> float:
    """A format reward for tool calls (task.episode.tools): 1.0 if the episode called a tool and every call parsed
    and ran, 0.5 if it tried (a call the parser or the tool refused), 0 if it called none. The half step pays a
    small model for the call tags before it gets the JSON inside them right."""
    if "tool_calls" not in metadata:
        raise ValueError("the tool_use reward needs a multi-turn episode with tools: set task.episode.tools")
    if metadata["tool_calls"] == 0:
        return 0.0
    return 1.0 if metadata["tool_errors"] == 0 else 0.5


BUILTIN: dict[str, RewardFn] = {
    "math": math_reward,
    "exact": exact_reward,
    "reasoning_gym": reasoning_gym_reward,
    "reasoning_gym_partial": reasoning_gym_partial_reward,
    "eos": eos_reward,
    "boxed": boxed_reward,
    "class_continuation": class_continuation_reward,
    "env": env_reward,
    "tool_use": tool_use_reward,
}

# Heavy imports a built-in needs, done by the child at start so the first call does not spend its timeout on them.
_PRELOAD: dict[str, Callable[[], object]] = {
    "math": _math_verify,
    "reasoning_gym": lambda: importlib.import_module("reasoning_gym"),
    "reasoning_gym_partial": lambda: importlib.import_module("reasoning_gym"),
}


def load_reward(name: str) -> RewardFn:
    """A BUILTIN reward by name, or the function at import path ``pkg.module:function``."""
    if name in BUILTIN:
        return BUILTIN[name]
    if ":" not in name:
        builtin = ", ".join(sorted(BUILTIN))
        raise ValueError(f"unknown reward {name!r}; built in: {builtin}; or give an import path pkg.module:function")
    return import_function(name, "reward")


def full_marks(score: float) -> bool:
    """A completion counts as correct (eval/accuracy, pass@k) when its correctness reward gave full marks."""
    return score >= 1.0 - 1e-6
