"""Held-out evaluation metrics from scored groups. Pure functions: no services, no torch."""

from __future__ import annotations

from protos.grpo.v1 import queue_pb2
from services.common.rewards import full_marks


def is_correct(t: queue_pb2.Trajectory, correctness: str) -> bool:
    """Full marks from the correctness reward (the first of task.rewards)."""
    return full_marks(t.reward_components.get(correctness, t.reward))


def eval_metrics(
    greedy: list[queue_pb2.TrajectoryGroup], sampled: list[queue_pb2.TrajectoryGroup], correctness: str
) -> dict[str, float]:
    """eval/accuracy: share of greedy completions that are correct; eval/pass@k: share of prompts with at least one
    correct completion among k sampled ones (k = eval/k; with exactly k samples the unbiased estimator of
    Chen et al. 2021 is this share); eval/mean_length: mean greedy completion tokens. Multi-turn episodes add
    eval/turns_mean, eval/tool_call_rate (share of greedy episodes that called a tool) and eval/tool_errors."""
    first = [g.trajectories[0] for g in greedy]
    m = {
        "eval/accuracy": sum(is_correct(t, correctness) for t in first) / len(first),
        "eval/mean_length": sum(len(t.response_ids) for t in first) / len(first),
        "eval/num_prompts": float(len(first)),
    }
    if any(t.turns for t in first):  # multi-turn episodes (task.episode): the whole greedy episode was scored
        m["eval/turns_mean"] = sum(t.turns for t in first) / len(first)
        m["eval/tool_call_rate"] = sum(t.tool_calls > 0 for t in first) / len(first)
        m["eval/tool_errors"] = float(sum(t.tool_errors for t in first))
    if sampled:
        m["eval/pass@k"] = sum(any(is_correct(t, correctness) for t in g.trajectories) for g in sampled) / len(sampled)
        m["eval/k"] = float(len(sampled[0].trajectories))
    return m
