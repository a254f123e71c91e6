"""`make run` scales its rollout workers mid-run: an added worker joins at the run's current version and its groups
are trained; a removed one drains (finishes what it claimed, exits 0) and is not restarted; nothing is lost."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy import records
from deploy.procs import start, stop_all
from deploy.restarts import Restarts
from deploy.scale import RolloutScaler
from services.coordinator.client import CoordinatorClient

REPO = Path(__file__).resolve().parents[2]
NUM_STEPS, NUM_PROMPTS, NUM_SAMPLES = 4, 2, 2
# Holds a reward call of worker K (its process is the reward process's parent) while the file `hold-K` exists:
# worker 0 from step 2 on (after step 1's samples), worker 1 from its first call.
HOLDING_REWARD = f"""
import os, pathlib, time

def score(prompt, completion, answer, metadata):
    folder = pathlib.Path(os.environ["SCALE_DIR"])
    with (folder / "calls").open("a") as f:
        f.write(".")
    worker = pathlib.Path(f"/proc/{{os.getppid()}}/cmdline").read_bytes().split(b"\\0")
    index = worker[worker.index(b"--worker-index") + 1].decode()
    if index == "0" and (folder / "calls").stat().st_size <= {NUM_PROMPTS * NUM_SAMPLES}:
        return 0.0
    while (folder / f"hold-{{index}}").exists():
        (folder / f"scoring-{{index}}").touch()
        time.sleep(0.05)
    return 0.0
"""


def _wait_for(condition, timeout_s: float, what: str, diagnostics) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout_s:.0f}s\n{diagnostics()}"
        time.sleep(0.2)


def _cli(*args: str) -> str:
    cmd = [sys.executable, "-m", "services.coordinator.cli", *args]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow
def test_rollout_scaled_up_and_down_mid_run(tmp_path, tiny_model):
    (tmp_path / "holding_reward.py").write_text(HOLDING_REWARD)
    for held in ("hold-0", "hold-1"):
        (tmp_path / held).touch()
    run_dir, out = tmp_path / "scale", tmp_path / "launcher.out"
    args = [
        f'run.output_dir="{tmp_path}"', 'run.run_id="scale"', f'model.path="{tiny_model}"',
        f"run.num_steps={NUM_STEPS}",
        "rollout.engine=hf", "trainer.num_ranks=1", f"coordinator.num_prompts={NUM_PROMPTS}",
        f"coordinator.num_samples={NUM_SAMPLES}", 'task.rewards={"holding_reward:score" = 1.0}',
        "task.reward_timeout_s=120", "rollout.lease_timeout_s=2",
    ]  # fmt: skip
    env = {**os.environ, "SCALE_DIR": str(tmp_path), "PYTHONPATH": str(tmp_path)}
    cmd = [sys.executable, "-m", "deploy.local", "--config", str(REPO / "deploy/configs/local.toml"), *args]
    proc = subprocess.Popen(cmd, stdout=out.open("wb"), stderr=subprocess.STDOUT, cwd=REPO, env=env)

    def diagnostics() -> str:
        text = out.read_text(errors="replace")[-3000:]
        for log in sorted((run_dir / "logs").glob("*.log")):
            text += f"\n== {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        return text

    try:
        # Worker 0 holds step 2's prompts (the run is at policy version 1); the CLI asks for a second worker.
        _wait_for((tmp_path / "scoring-0").exists, 300, "no step held", diagnostics)
        assert _cli(str(run_dir), "workers", "--set", "2").startswith("rollout workers: 2 wanted")
        # It joins at version 1, takes the held prompts once their lease ran out, and is held in turn.
        _wait_for((tmp_path / "scoring-1").exists, 300, "the added worker took no work", diagnostics)
        listed = _cli(str(run_dir), "workers")
        assert "rollout-1@" in listed, listed
        [(_, record)] = records.read_all(tmp_path)
        assert "rollout-1" in {s["name"] for s in record["services"]}

        # Back to one worker (over the RPC this time) while worker 1 holds its claimed prompts: it drains.
        with CoordinatorClient.for_run(run_dir) as client:
            assert client.scale_rollout(1).num_rollout_workers == 1
        _wait_for(lambda: b"rollout-1 draining" in out.read_bytes(), 30, "no drain", diagnostics)
        (tmp_path / "hold-1").unlink()
        _wait_for(lambda: b"rollout-1 drained: exited with 0" in out.read_bytes(), 60, "no clean drain", diagnostics)
        # Step 2 was trained on worker 1's groups: worker 0 is still held.
        _wait_for(lambda: 2 in _steps(run_dir), 120, "step 2 not trained", diagnostics)
        [(_, record)] = records.read_all(tmp_path)
        assert {s["name"] for s in record["services"]} == {"redis", "weightsync", "trainer", "rollout-0", "coordinator"}
        (tmp_path / "hold-0").unlink()
        assert proc.wait(timeout=300) == 0, diagnostics()
    finally:
        proc.kill()

    assert _steps(run_dir) == list(range(1, NUM_STEPS + 1))
    for b in _rows(run_dir / "batches.jsonl"):  # each prompt of each step trained once: none lost, none twice
        expected = {f"scale/{b['step']}/{p}/{s}" for p in range(NUM_PROMPTS) for s in range(NUM_SAMPLES)}
        assert sorted(b["trajectory_ids"]) == sorted(expected)
    launcher = out.read_text()
    assert "rollout-1 added" in launcher and "rollout-1 exited" not in launcher  # drained, never restarted
    added = (run_dir / "logs" / "rollout-1.log").read_text()
    assert "joined at policy version 1" in added and re.search(r"\d groups \(\d sequences\)", added), added
    assert "sampled by policy version" not in (run_dir / "logs" / "coordinator.log").read_text()


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in _rows(run_dir / "metrics.jsonl") if r["step"] > 0]


def test_the_scaler_adds_at_free_indices_drains_the_newest_and_never_restarts_a_drained_one(tmp_path):
    """Stand-in workers (a shell that sleeps) under their guards, as the launcher starts them."""
    worker = ["sh", "-c", "trap 'exit 0' TERM; sleep 60 & wait", "--worker-index", "0"]
    services = [start("rollout-0", worker, tmp_path / "rollout-0.log", guard=True)]
    records_written = []
    restarts = Restarts(services, lambda: records_written.append(1), lambda name: 5)
    scaler = RolloutScaler(services, restarts, lambda: records_written.append(1))

    def names() -> list[str]:
        return sorted(s.name for s in services)

    try:
        scaler.reconcile(3)
        assert names() == ["rollout-0", "rollout-1", "rollout-2"]
        assert services[2].cmd[-3:] == ["--worker-index", "2", "rollout.grpc_port=0"]
        scaler.reconcile(0)  # a coordinator that does not say: nothing changes
        time.sleep(1.0)  # the guards have started their workers
        scaler.reconcile(1)
        assert restarts.draining == {"rollout-1", "rollout-2"}
        scaler.reconcile(1)  # still draining: not drained twice, nothing added
        deadline = time.monotonic() + 10
        while len(services) > 1 and time.monotonic() < deadline:
            restarts.check_alive()  # a drained worker leaves, never restarted
            time.sleep(0.1)
        assert names() == ["rollout-0"] and not restarts.draining and not restarts.num_restarts
        scaler.reconcile(2)  # index 1 is free again
        assert names() == ["rollout-0", "rollout-1"]
        assert len(records_written) == 5  # the launch record after each reconcile that changed workers, each exit
    finally:
        stop_all(services)
