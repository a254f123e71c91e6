"""`make run` heals itself: Redis killed mid-step is restarted in place and its clients reconnect; a killed trainer
rank makes the launcher resume the run from its newest checkpoint. Either way every step completes once and every
trajectory is trained exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy.ranks import launches_ranks

REPO = Path(__file__).resolve().parents[2]
NUM_STEPS, NUM_PROMPTS, NUM_SAMPLES = 4, 2, 2
# A reward that holds the worker in step 3 (after the samples of steps 1 and 2) while the file `hold` exists: the
# fault then lands mid-step, with the step's prompts leased and a checkpoint (step 2) behind the run.
HOLDING_REWARD = f"""
import os, pathlib, time

def score(prompt, completion, answer, metadata):
    folder = pathlib.Path(os.environ["HEAL_DIR"])
    with (folder / "calls").open("a") as f:
        f.write(".")
    if (folder / "calls").stat().st_size > {2 * NUM_PROMPTS * NUM_SAMPLES} and (folder / "hold").exists():
        (folder / "scoring").touch()
        while (folder / "hold").exists():
            time.sleep(0.05)
    return 0.0
"""


def _run_with_a_fault(tmp_path: Path, tiny_model: Path, victim: str) -> tuple[str, Path]:
    """Launch a run, kill -9 `victim` (see _find) while step 3 is held, release it;
    returns the launcher's output and the run folder once the run ended."""
    (tmp_path / "holding_reward.py").write_text(HOLDING_REWARD)
    (tmp_path / "hold").touch()
    run_dir = tmp_path / "heal"
    args = [
        f'run.output_dir="{tmp_path}"', 'run.run_id="heal"', f'model.path="{tiny_model}"', f"run.num_steps={NUM_STEPS}",
        "run.checkpoint_every=1", "rollout.engine=hf", "trainer.num_ranks=1", f"coordinator.num_prompts={NUM_PROMPTS}",
        f"coordinator.num_samples={NUM_SAMPLES}", 'task.rewards={"holding_reward:score" = 1.0}',
        "task.reward_timeout_s=120", "rollout.lease_timeout_s=2",
    ]  # fmt: skip
    env = {**os.environ, "HEAL_DIR": str(tmp_path), "PYTHONPATH": str(tmp_path)}
    cmd = [sys.executable, "-m", "deploy.local", "--config", str(REPO / "deploy/configs/local.toml"), *args]
    out = tmp_path / "launcher.out"
    proc = subprocess.Popen(cmd, stdout=out.open("wb"), stderr=subprocess.STDOUT, cwd=REPO, env=env)
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "scoring").exists():
            assert proc.poll() is None and time.monotonic() < deadline, out.read_text()[-3000:]
            time.sleep(0.2)
        pid = _find(victim, run_dir)
        os.kill(pid, signal.SIGKILL)
        (tmp_path / "hold").unlink()
        assert proc.wait(timeout=400) == 0, out.read_text()[-5000:]
    finally:
        proc.kill()
    return out.read_text(), run_dir


def _find(victim: str, run_dir: Path) -> int:
    """The pid of the trainer rank, or of Redis (which renames itself to `redis-server host:port`)."""
    if victim == "redis":
        import tomllib

        port = tomllib.loads((run_dir / "config.toml").read_text())["redis"]["port"]
        [(pid, _)] = _processes(f"redis-server 127.0.0.1:{port}")
        return pid
    [(pid, _)] = [(p, c) for p, c in _processes(str(run_dir)) if victim in c and not launches_ranks(c)]
    return pid


def _processes(mentioning: str) -> list[tuple[int, str]]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if mentioning in cmdline:
            found.append((int(pid), cmdline))
    return found


def _check_every_step_once(run_dir: Path) -> None:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, NUM_STEPS + 1))
    batches = [json.loads(line) for line in (run_dir / "batches.jsonl").read_text().splitlines()]
    assert [b["step"] for b in batches] == list(range(1, NUM_STEPS + 1))
    for b in batches:  # each prompt of each step trained once: none lost, none twice
        expected = {f"heal/{b['step']}/{p}/{s}" for p in range(NUM_PROMPTS) for s in range(NUM_SAMPLES)}
        assert sorted(b["trajectory_ids"]) == sorted(expected)


@pytest.mark.slow
def test_redis_killed_mid_step_is_restarted_and_nothing_is_lost_or_duplicated(tmp_path, tiny_model):
    out, run_dir = _run_with_a_fault(tmp_path, tiny_model, "redis")
    assert "redis exited with -9; restart 1 of" in out
    assert "resuming" not in out  # healed in place: no service but Redis was restarted
    _check_every_step_once(run_dir)


@pytest.mark.slow
def test_a_killed_trainer_rank_makes_the_run_resume_from_its_checkpoint(tmp_path, tiny_model):
    out, run_dir = _run_with_a_fault(tmp_path, tiny_model, "-m services.trainer.main")
    assert "trainer died: resuming the run from step 2 (restart 1 of 3)" in out
    assert "resuming run heal at step 2 of 4" in out
    _check_every_step_once(run_dir)
