"""Rewards: the built-in functions and the import-path loader (builtin.py), and the runner that calls them in an
isolated, killable child process (runner.py). Import from here: `from services.common.rewards import RewardRunner`."""

from .builtin import (
    BUILTIN,
    RewardFn,
    boxed_reward,
    class_continuation_reward,
    cut_short,
    eos_reward,
    exact_reward,
    extract_answer,
    full_marks,
    load_reward,
    math_reward,
    reasoning_gym_partial_reward,
    reasoning_gym_reward,
)
from .runner import RewardInput, RewardRunner, Scored

__all__ = [
    "BUILTIN",
    "RewardFn",
    "RewardInput",
    "RewardRunner",
    "Scored",
    "boxed_reward",
    "class_continuation_reward",
    "cut_short",
    "eos_reward",
    "exact_reward",
    "extract_answer",
    "full_marks",
    "load_reward",
    "math_reward",
    "reasoning_gym_partial_reward",
    "reasoning_gym_reward",
]
