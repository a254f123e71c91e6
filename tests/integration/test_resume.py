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


def _launch(output_dir: Path, tiny_model: Path, *overrides: str) -> subprocess.Popen:
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
        [sys.executable, "-m", "deploy.local", *config, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
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
