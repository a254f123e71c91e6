"""Exact resume: a run killed (kill -9 of every process) after its checkpoint and resumed with run.resume trains
the same trajectories with the same losses and metrics as a run that was never interrupted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

NUM_STEPS, CHECKPOINT_EVERY = 4, 2
ROOT = Path(__file__).resolve().parents[2]


def _launch(output_dir: Path, tiny_model: Path, *overrides: str, env: dict | None = None) -> subprocess.Popen:
    args = [
        f'run.output_dir="{output_dir}"',
        'run.run_id="r1"',
        f'model.path="{tiny_model}"',
        f"run.num_steps={NUM_STEPS}",
        f"run.checkpoint_every={CHECKPOINT_EVERY}",
        "coordinator.num_prompts=4",
        "coordinator.num_samples=4",
        *overrides,
    ]
    config = ["--config", str(ROOT / "deploy" / "configs" / "local.toml")]
    return subprocess.Popen(
        [sys.executable, "-m", "deploy.local", *config, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )


def _finish(proc: subprocess.Popen, run_dir: Path) -> str:
    out = proc.communicate(timeout=900)[0].decode()
    logs = "".join(f"\n== {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in (run_dir / "logs").glob("*.log"))
    assert proc.returncode == 0, out[-3000:] + logs
    return out


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _kill_everything(launcher: subprocess.Popen, run_dir: Path) -> None:
    """kill -9 of the launcher and of every process group of the run's services (vLLM's and torchrun's too)."""
    groups = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if str(run_dir) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                groups.add(os.getpgid(int(pid)))
        except (OSError, ProcessLookupError):
            continue
    launcher.kill()
    for group in groups - {os.getpgrp()}:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
    launcher.communicate(timeout=60)


# Keys a run writes that are not a function of its data and weights (times, speeds, memory).
_NOT_DETERMINISTIC = ("timing/", "time/", "throughput/", "refit/GBps", "peak_mem", "rollout/peak_mem_GiB", "gc/")


def _deterministic(row: dict) -> dict:
    return {k: v for k, v in row.items() if not any(k.startswith(p) or p in k for p in _NOT_DETERMINISTIC)}


def test_a_run_killed_after_its_checkpoint_resumes_equal_to_an_uninterrupted_one(tmp_path, tiny_model):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    uninterrupted = _launch(whole, tiny_model)
    _finish(uninterrupted, whole / "r1")

    # The same run, killed once it has finished step 3 (its checkpoint is step 2's): step 3 is redone.
    proc = _launch(cut, tiny_model)
    run_dir = cut / "r1"
    deadline = time.monotonic() + 600
    while not (run_dir / "metrics.jsonl").exists() or len(_jsonl(run_dir / "metrics.jsonl")) < 3:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0].decode()[-3000:]
        time.sleep(0.2)
    _kill_everything(proc, run_dir)
    assert [c["step"] for c in _jsonl(run_dir / "checkpoints.jsonl") if c.get("resumable")] == [2]

    out = _finish(_launch(cut, tiny_model, f'run.resume="{run_dir}"'), run_dir)
    assert f"resuming run r1 at step 2 of {NUM_STEPS}" in out

    a, b = whole / "r1", run_dir
    # The same trajectories trained at every step, each once: no prompt re-trained, none skipped.
    assert _jsonl(a / "batches.jsonl") == _jsonl(b / "batches.jsonl")
    rows_a, rows_b = _jsonl(a / "metrics.jsonl"), _jsonl(b / "metrics.jsonl")
    assert [r["step"] for r in rows_b] == list(range(1, NUM_STEPS + 1))
    # Losses and every other metric of the data and weights are equal, the resumed steps' too (CPU, fp32).
    for ra, rb in zip(rows_a, rows_b, strict=True):
        assert _deterministic(ra) == _deterministic(rb), ra["step"]
    assert {"loss", "reward/mean", "mismatch/mult_prob_error", "data/cursor"} <= set(_deterministic(rows_b[-1]))
    assert [s["step"] for s in _jsonl(b / "samples.jsonl")] == [s["step"] for s in _jsonl(a / "samples.jsonl")]
    # What the engines received after each refit is what the trainer held: the same checksums in both runs.
    checksums = [[r["checksum"] for r in _jsonl(d / "refits.jsonl")] for d in (a, b)]
    assert checksums[0] == checksums[1] and len(checksums[0]) == NUM_STEPS
    # keep_checkpoints=2: the run's newest two resumable checkpoints are kept.
    assert sorted(p.name for p in (b / "resume").iterdir()) == ["step_2", "step_4"]


# The toy reward, held in step 3 (after the 2 x 16 samples of steps 1 and 2) while the file `hold` exists.
HOLDING_TOY_REWARD = """
import os, pathlib, time
from services.common.rewards import class_continuation_reward

def score(prompt, completion, answer, metadata):
    folder = pathlib.Path(os.environ["RESUME_DIR"])
    with (folder / "calls").open("a") as f:
        f.write(".")
    if (folder / "calls").stat().st_size > 32 and (folder / "hold").exists():
        (folder / "scoring").touch()
        while (folder / "hold").exists():
            time.sleep(0.05)
    return class_continuation_reward(prompt, completion, answer, metadata)
"""


def test_a_run_stopped_mid_step_checkpoints_its_last_step_and_resumes_equal(tmp_path, tiny_model):
    # SIGTERM while step 3 collects: the stop's checkpoint is step 2's (run.checkpoint_every=10 took none before),
    # though step 3 has taken its prompts already; resumed, step 3 takes those same prompts again.
    (tmp_path / "holding.py").write_text(HOLDING_TOY_REWARD)
    env = {"RESUME_DIR": str(tmp_path), "PYTHONPATH": str(tmp_path)}
    held = ['task.rewards={"holding:score" = 1.0}', "run.checkpoint_every=10", "rollout.engine=hf"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    _finish(_launch(whole, tiny_model, *held, env=env), whole / "r1")

    (tmp_path / "calls").unlink()
    (tmp_path / "hold").touch()
    proc = _launch(cut, tiny_model, *held, env=env)
    deadline = time.monotonic() + 300
    while not (tmp_path / "scoring").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0].decode()[-3000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    run_dir = cut / "r1"
    assert [c["step"] for c in _jsonl(run_dir / "checkpoints.jsonl") if c.get("resumable")] == [2]

    (tmp_path / "hold").unlink()
    _finish(_launch(cut, tiny_model, *held, f'run.resume="{run_dir}"', env=env), run_dir)
    a, b = whole / "r1", run_dir
    assert _jsonl(a / "batches.jsonl") == _jsonl(b / "batches.jsonl")
    for ra, rb in zip(_jsonl(a / "metrics.jsonl"), _jsonl(b / "metrics.jsonl"), strict=True):
        assert _deterministic(ra) == _deterministic(rb), ra["step"]
    assert [(s["step"], s["prompt"]) for s in _jsonl(b / "samples.jsonl")] == [
        (s["step"], s["prompt"]) for s in _jsonl(a / "samples.jsonl")
    ]
