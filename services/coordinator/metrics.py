"""The per-step metric names (docs/architecture.md, "Contracts"), the metrics.jsonl and samples.jsonl writers and
the console row."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from protos.grpo.v1 import queue_pb2
from services.common.tasks import Prompt

from .loggers import Logger

STEP_KEYS = (
    "step",
    "policy_version",
    "timing/total_s",
    "timing/generation_s",
    "timing/logprobs_s",
    "timing/policy_training_s",
    "timing/refit_s",
    "avg_generated_tokens",
    "reward/mean",
    "mismatch/mult_prob_error",
    "refit/bytes",
    "refit/GBps",
    "throughput/tokens_per_s_per_gpu",
)

ASYNC_KEYS = (
    "async/staleness_mean",
    "async/staleness_max",
    "async/dropped_stale",
    "async/trainer_idle_s",
    "async/rollout_idle_s",
    "async/rollout_pause_s",
)
"""Asynchronous GRPO's (coordinator.max_staleness >= 1), in each step's row besides STEP_KEYS."""

EVAL_KEYS = ("eval/accuracy", "eval/pass@k", "eval/mean_length")
"""Held-out metrics, in the rows of step 0, every run.eval_every steps and the last step."""

# (header, key, format) of the console table, in the order the seeds' users read it.
COLUMNS = (
    ("step", "step", "{:>5.0f}"),
    ("total", "timing/total_s", "{:>7.2f}"),
    ("train", "timing/policy_training_s", "{:>7.2f}"),
    ("refit", "timing/refit_s", "{:>7.2f}"),
    ("gen", "timing/generation_s", "{:>7.2f}"),
    ("logprobs", "timing/logprobs_s", "{:>8.2f}"),
    ("gen_tok", "avg_generated_tokens", "{:>7.1f}"),
    ("reward", "reward/mean", "{:>7.3f}"),
    ("mismatch", "mismatch/mult_prob_error", "{:>8.5f}"),
    ("eval_acc", "eval/accuracy", "{:>8.3f}"),
)


def header() -> str:
    return " ".join(f"{h:>{len(fmt.format(0))}}" for h, _, fmt in COLUMNS)


def row(m: dict[str, float]) -> str:
    return " ".join(fmt.format(m.get(k, float("nan"))) for _, k, fmt in COLUMNS)


class MetricsLog:
    """metrics.jsonl, and the same rows to the configured experiment trackers (run.loggers)."""

    def __init__(self, run_dir: Path, loggers: list[Logger] | tuple = ()):
        self.path = run_dir / "metrics.jsonl"
        self.loggers = list(loggers)
        self.observers: list[Callable[[dict[str, float]], dict[str, float]]] = []
        """Called with each row before it is written; the keys they return join the row (the collapse monitor's
        alert/*)."""
        self.start = time.time()
        """time/wall_s counts from here (a resumed run moves it back by the wall time it had)."""
        self.last: dict[str, float] | None = None

    def append(self, m: dict[str, float]) -> None:
        missing = [k for k in STEP_KEYS if k not in m]
        assert not missing, f"step metrics lack {missing}"
        self._write(m)

    def append_eval(self, m: dict[str, float]) -> None:
        """A row holding only held-out metrics (step 0, before any training)."""
        assert "eval/accuracy" in m, "an eval row needs eval/accuracy"
        self._write(m)

    def _write(self, m: dict[str, float]) -> None:
        for observe in self.observers:
            m.update(observe(m))
        m["time/wall_s"] = time.time() - self.start  # since the coordinator started: curves against wall time
        with self.path.open("a") as f:
            f.write(json.dumps(m) + "\n")
        self.last = m
        for logger in self.loggers:
            logger.log(m, int(m["step"]))

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()

    def read(self) -> list[dict[str, float]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]


def response_metrics(trajectories: list[queue_pb2.Trajectory]) -> dict[str, float]:
    """How the batch's completions ended, and each reward's mean (unweighted) beside the weighted reward/mean."""
    n = len(trajectories)
    num_tokens = sum(sum(t.loss_mask) if t.loss_mask else len(t.logprobs) for t in trajectories)  # the model's
    m = {
        "response/max_tokens_frac": sum(t.finish_reason == "length" for t in trajectories) / n,
        "response/eos_frac": sum(t.finish_reason == "stop" for t in trajectories) / n,
        # -log p of each sampled token under the distribution it was drawn from (softmax(logits / temperature)):
        # the mean estimates the policy's per-token entropy, with no pass over the vocabulary (the trainer's
        # `entropy` exists only with trainer.loss.entropy_coef > 0).
        "response/neg_logprob": -sum(sum(t.logprobs) for t in trajectories) / max(num_tokens, 1),
        "reward/errors": float(sum(t.reward_errors for t in trajectories)),
    }
    for name in sorted({k for t in trajectories for k in t.reward_components}):
        m[f"reward/{name}"] = sum(t.reward_components.get(name, 0.0) for t in trajectories) / n
    return m | episode_metrics(trajectories)


def episode_metrics(trajectories: list[queue_pb2.Trajectory]) -> dict[str, float]:
    """Multi-turn episodes (task.episode): turns, tool calls and their errors, environments that failed, length (the
    environment's tokens included); {} for single completions."""
    n = len(trajectories)
    if not n or not any(t.turns for t in trajectories):
        return {}
    return {
        "episode/turns_mean": sum(t.turns for t in trajectories) / n,
        "episode/tool_calls_mean": sum(t.tool_calls for t in trajectories) / n,
        "episode/tool_errors": float(sum(t.tool_errors for t in trajectories)),
        "episode/env_errors": float(sum(t.episode_end == "env_error" for t in trajectories)),
        "episode/length_mean": sum(len(t.response_ids) for t in trajectories) / n,
    }


def env_seconds(groups: list[queue_pb2.TrajectoryGroup]) -> float:
    """timing/env_s: the environment's seconds inside the step's generation. A worker answers its episodes one after
    another, and workers run side by side: the most any one worker spent."""
    per_worker: dict[str, float] = {}
    for g in groups:
        per_worker[g.worker_id] = per_worker.get(g.worker_id, 0.0) + sum(t.env_s for t in g.trajectories)
    return max(per_worker.values(), default=0.0)


class SampleLog:
    """A few completions of every step (and of every evaluation) in samples.jsonl, so a user sees what the model
    writes; the last ones are also on /status."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / "samples.jsonl"
        self.latest: list[dict] = []

    def write(
        self,
        step: int,
        prompts: list[Prompt],
        groups: list[queue_pb2.TrajectoryGroup],
        count: int,
        held_out: bool = False,
    ) -> None:
        rows = [
            {
                "step": step,
                "eval": held_out,
                "prompt": p.text,
                "answer": p.answer,
                "completion": g.trajectories[0].text,
                "reward": g.trajectories[0].reward,
                "finish_reason": g.trajectories[0].finish_reason,
                "policy_version": g.policy_version,
                # A multi-turn episode: every message after the prompt, the environment's included.
                **(
                    {"messages": json.loads(g.trajectories[0].messages_json)} if g.trajectories[0].messages_json else {}
                ),
            }
            for p, g in list(zip(prompts, groups))[:count]
        ]
        if not rows:
            return
        with self.path.open("a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        self.latest = rows


def read_samples(path: Path, last: int) -> list[dict]:
    lines = [line for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return [json.loads(line) for line in lines[-last:]]
