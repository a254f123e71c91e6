"""Multi-turn episodes through the real services on SmolLM2-135M-Instruct: the worker runs each sample as an
episode (the built-in `retry` environment answers a wrong answer; one that raises ends its episode with reward 0),
the trainer masks the environment's tokens, and its logprobs on the model's tokens equal the engine's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RETRY = "That is not right. Try again."


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _run(tmp_path: Path, smollm2_path: Path, run_id: str, extra: list[str], env: dict | None = None):
    args = [
        "--config",
        str(REPO / "deploy" / "configs" / "smollm2_retry.toml"),
        f'run.output_dir="{tmp_path}"',
        f'run.run_id="{run_id}"',
        f'model.path="{smollm2_path}"',
        "run.num_steps=2",
        "run.eval_every=0",
        "run.save_every=0",
        "run.samples_per_step=4",
        "task.train_size=16",
        "task.eval_size=4",
        "coordinator.num_prompts=2",
        "coordinator.num_samples=4",
        "coordinator.max_tokens=48",
        "coordinator.temperature=1.0",
        'rollout.engine="hf"',
        *extra,
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "deploy.local", *args], cwd=REPO, capture_output=True, timeout=1200, env=env
    )
    run_dir = tmp_path / run_id
    logs = "".join(p.read_text(errors="replace")[-1500:] for p in sorted((run_dir / "logs").glob("*.log")))
    assert proc.returncode == 0, proc.stdout.decode()[-2000:] + proc.stderr.decode()[-2000:] + logs
    return run_dir


# The built-in retry environment, except that it raises for tasks whose answer is odd: those episodes end with
# reward 0 (counted in episode/env_errors) and the run goes on.
ENVIRONMENT = """
from services.rollout.multiturn.envs import retry

def respond(messages, task):
    if int(task["answer"]) % 2:
        raise RuntimeError("the environment broke")
    return retry(messages, task)
"""


def test_episodes_train_on_the_models_tokens_only_and_a_failing_environment_costs_its_episode(tmp_path, smollm2_path):
    package = tmp_path / "envpkg"
    package.mkdir()
    (package / "flaky_env.py").write_text(ENVIRONMENT)
    env = {**os.environ, "PYTHONPATH": str(package)}
    run_dir = _run(tmp_path, smollm2_path, "retry", ['task.episode.environment="flaky_env:respond"'], env)
    metrics, samples = _jsonl(run_dir / "metrics.jsonl"), _jsonl(run_dir / "samples.jsonl")
    steps = [m for m in metrics if "timing/total_s" in m]
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:
        # Sampled at temperature 1 and scored by the trainer: on-policy on the model's tokens. The feedback's tokens
        # carry logprob 0.0 from the worker; were they in the mismatch (or the loss), this would be far above 1.
        assert 1.0 <= m["mismatch/mult_prob_error"] <= 1.001
        assert 1.0 <= m["episode/turns_mean"] <= 2.0 and m["timing/env_s"] > 0
        assert m["reward/mean"] <= 1.0 - m["episode/env_errors"] / 8  # a failed episode scores 0
    assert max(m["episode/turns_mean"] for m in steps) > 1.0, "no episode got feedback: nothing multi-turn ran"
    assert sum(m["episode/env_errors"] for m in steps) >= 1, "the environment never failed: the test tests nothing"
    retried = [s for s in samples if len(s.get("messages", [])) == 3]
    assert retried, "samples.jsonl shows no whole episode"
    roles = [m["role"] for m in retried[0]["messages"]]
    assert roles == ["assistant", "user", "assistant"] and retried[0]["messages"][1]["content"] == RETRY
    assert retried[0]["completion"] == retried[0]["messages"][2]["content"]  # the last answer is what is scored
    shown = subprocess.run(
        [sys.executable, "-m", "services.coordinator.cli", str(run_dir), "samples", "--last", "100"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert f"user:       {RETRY}" in shown and "assistant:" in shown  # the CLI prints whole episodes too
    evals = [m for m in metrics if "eval/accuracy" in m]
    assert [m["step"] for m in evals] == [0, 2] and all(1.0 <= m["eval/turns_mean"] <= 2.0 for m in evals)
