"""The per-step metric names of DESIGN.md, the metrics.jsonl writer and the console row."""

from __future__ import annotations

import json
from pathlib import Path

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
)


def header() -> str:
    return " ".join(f"{h:>{len(fmt.format(0))}}" for h, _, fmt in COLUMNS)


def row(m: dict[str, float]) -> str:
    return " ".join(fmt.format(m.get(k, float("nan"))) for _, k, fmt in COLUMNS)


class MetricsLog:
    def __init__(self, run_dir: Path):
        self.path = run_dir / "metrics.jsonl"

    def append(self, m: dict[str, float]) -> None:
        missing = [k for k in STEP_KEYS if k not in m]
        assert not missing, f"step metrics lack {missing}"
        with self.path.open("a") as f:
            f.write(json.dumps(m) + "\n")

    def read(self) -> list[dict[str, float]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
