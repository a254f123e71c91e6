"""Asynchronous GRPO through all four services, started the way `make run` starts them: eta = 0 is the synchronous
run, batch for batch; eta = 1 trains on groups generated while the previous step trained, never older than that."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

NUM_STEPS = 4
ROOT = Path(__file__).resolve().parents[2]
# Keys a run writes that are not a function of its data and weights (times, speeds, memory).
_NOT_DETERMINISTIC = ("timing/", "time/", "throughput/", "refit/GBps", "peak_mem", "gc/")


def _run(output_dir: Path, tiny_model: Path, *overrides: str) -> Path:
    args = [
        f'run.output_dir="{output_dir}"',
        'run.run_id="a"',
        f'model.path="{tiny_model}"',
        f"run.num_steps={NUM_STEPS}",
        "coordinator.num_prompts=4",
        "coordinator.num_samples=4",
        *overrides,
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "deploy.local", "--config", str(ROOT / "deploy/configs/local.toml"), *args],
        capture_output=True,
        timeout=600,
    )
    run_dir = output_dir / "a"
    logs = "".join(f"\n== {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in (run_dir / "logs").glob("*.log"))
    assert proc.returncode == 0, proc.stdout.decode()[-3000:] + proc.stderr.decode()[-2000:] + logs
    return run_dir


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _deterministic(row: dict) -> dict:
    return {k: v for k, v in row.items() if not any(k.startswith(p) or p in k for p in _NOT_DETERMINISTIC)}


def test_eta_0_trains_the_synchronous_batches_and_losses(tmp_path, tiny_model):
    sync = _run(tmp_path / "sync", tiny_model)
    eta0 = _run(tmp_path / "eta0", tiny_model, "coordinator.max_staleness=0")
    assert _jsonl(eta0 / "batches.jsonl") == _jsonl(sync / "batches.jsonl")
    assert [_deterministic(r) for r in _jsonl(eta0 / "metrics.jsonl")] == [
        _deterministic(r) for r in _jsonl(sync / "metrics.jsonl")
    ]
    assert not any(k.startswith("async/") for r in _jsonl(sync / "metrics.jsonl") for k in r)


def test_eta_1_trains_groups_of_the_previous_version_once_each(tmp_path, tiny_model):
    run_dir = _run(tmp_path, tiny_model, "coordinator.max_staleness=1")
    steps = [r for r in _jsonl(run_dir / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, NUM_STEPS + 1))
    assert all(r["async/staleness_max"] <= 1 for r in steps)
    # Step k+1's groups were generated while step k trained, by the version before the refit.
    assert max(r["async/staleness_max"] for r in steps[1:]) == 1
    assert all(r["async/dropped_stale"] == 0 for r in steps)
    ids = [t for b in _jsonl(run_dir / "batches.jsonl") for t in b["trajectory_ids"]]
    assert len(ids) == NUM_STEPS * 4 * 4 and len(set(ids)) == len(ids), "a trajectory was trained twice"
    assert all(r["async/rollout_idle_s"] >= 0 and r["async/trainer_idle_s"] >= 0 for r in steps)
