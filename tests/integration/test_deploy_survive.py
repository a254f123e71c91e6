"""The local launcher leaves no process behind however it ends, and a dead rollout worker does not end its run."""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy import records
from deploy.procs import group_members, start

REPO = Path(__file__).resolve().parents[2]
TINY = ["rollout.engine=hf", "trainer.num_ranks=1", "coordinator.num_prompts=2", "coordinator.num_samples=2"]


def _launch(tmp_path: Path, tiny_model: Path, *overrides: str) -> tuple[subprocess.Popen, Path]:
    """`make run` on the tiny model; its output goes to a file, read while it runs."""
    args = [f'run.output_dir="{tmp_path}"', 'run.run_id="survive"', f'model.path="{tiny_model}"', *TINY, *overrides]
    out = tmp_path / "launcher.out"
    cmd = [sys.executable, "-m", "deploy.local", "--config", str(REPO / "deploy/configs/local.toml"), *args]
    return subprocess.Popen(cmd, stdout=out.open("wb"), stderr=subprocess.STDOUT, cwd=REPO), out


def _wait_for(condition, timeout_s: float, what: str, diagnostics=lambda: "") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout_s:.0f}s\n{diagnostics()}"
        time.sleep(0.2)


def _diagnostics(tmp_path: Path, out: Path) -> str:
    text = out.read_text(errors="replace")[-2000:]
    for log in sorted((tmp_path / "survive" / "logs").glob("*.log")):
        text += f"\n== {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:])
    return text


def _session_processes(session_ids: set[int], mentioning: str = "\0") -> list[str]:
    """Live processes of these sessions (every service is the leader of its own), or whose command line mentions
    `mentioning` (torchrun starts each rank in a session of its own; their config is in the run folder)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if fields[0] != "Z" and (int(fields[3]) in session_ids or mentioning in cmdline):
            found.append(f"{pid}: {cmdline[:150]}")
    return found


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP], ids=["kill-9", "sighup"])
def test_every_service_exits_within_10s_of_the_launcher(tmp_path, tiny_model, sig):
    proc, out = _launch(tmp_path, tiny_model, "run.num_steps=1000")
    try:
        _wait_for(lambda: b"status: " in out.read_bytes(), 300, "no run started", lambda: _diagnostics(tmp_path, out))
        [(record_path, record)] = records.read_all(tmp_path)
        assert {s["name"] for s in record["services"]} == {"redis", "weightsync", "trainer", "rollout-0", "coordinator"}
        sessions, run_dir = {s["pgid"] for s in record["services"]}, str(tmp_path / "survive")
        left = functools.partial(_session_processes, sessions, run_dir)
        # Each service and its guard, and torchrun's rank (in a session of its own).
        assert len(left()) >= 11 and any("services.trainer.main" in p and "torch" not in p for p in left()), left()

        proc.send_signal(sig)
        killed_at = time.monotonic()
        _wait_for(lambda: not left(), 10, "processes left", lambda: "\n".join(left()))
        print(f"{signal.Signals(sig).name}: every service gone after {time.monotonic() - killed_at:.1f}s")
        proc.wait(timeout=30)
    finally:
        proc.kill()
    if sig == signal.SIGHUP:  # it stopped them itself, like Ctrl-C, and took its record away
        assert b"interrupted: stopping every service" in out.read_bytes()
        assert not record_path.exists()
    else:  # `make down` clears what a killed launcher left, and says that nothing was running
        down = _down(tmp_path)
        assert "stopping run survive (local)\n  nothing of it was running" in down.stdout, down.stdout + down.stderr
        assert not record_path.exists()


def _down(output_dir: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "deploy.down", f'run.output_dir="{output_dir}"']
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)


def test_make_down_stops_the_services_of_a_killed_launcher(tmp_path):
    """A launcher killed before its guards could act (or run without them) left its services running."""
    orphan = start("rollout-0", ["sleep", "600"], tmp_path / "sleep.log")
    helper = start("trainer", ["sh", "-c", "sleep 600 & wait"], tmp_path / "sh.log")
    path = records.write(tmp_path, "local", "orphaned")
    record = json.loads(path.read_text())
    record["pid"] = 2**22 + 1  # past pid_max: no such launcher
    record["services"] = [
        {"name": s.name, "pgid": s.proc.pid, "start_ticks": _start_ticks(s.proc.pid)} for s in (orphan, helper)
    ]
    path.write_text(json.dumps(record))
    time.sleep(0.3)  # sh has started its sleep
    assert len(group_members(helper.proc.pid)) == 2

    down = _down(tmp_path)
    assert down.returncode == 0, down.stderr
    lines = down.stdout.splitlines()
    assert lines[0] == "stopping run orphaned (local)"
    assert f"  stopped rollout-0: process group {orphan.proc.pid} (1 processes)" in lines
    assert f"  stopped trainer: process group {helper.proc.pid} (2 processes)" in lines
    assert orphan.proc.wait(timeout=5) == -signal.SIGTERM
    assert not group_members(helper.proc.pid) and not path.exists()


def _start_ticks(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


# A reward that holds the worker in step 2 (after the 4 samples of step 1) while the file `hold` exists: the kill
# then lands while the worker holds leased prompts and the run is at policy version 1, so the restarted worker must
# get that version before it takes work.
HOLDING_REWARD = """
import os, pathlib, time

def score(prompt, completion, answer, metadata):
    folder = pathlib.Path(os.environ["SURVIVE_DIR"])
    with (folder / "calls").open("a") as f:
        f.write(".")
    if (folder / "calls").stat().st_size > 4 and (folder / "hold").exists():
        (folder / "scoring").touch()
        while (folder / "hold").exists():
            time.sleep(0.05)
    return 0.0
"""


@pytest.mark.slow
def test_a_killed_rollout_worker_is_restarted_and_the_run_completes(tmp_path, tiny_model, monkeypatch):
    (tmp_path / "holding_reward.py").write_text(HOLDING_REWARD)
    (tmp_path / "hold").touch()
    # The launcher hands its environment to every service.
    for k, v in {"SURVIVE_DIR": str(tmp_path), "PYTHONPATH": str(tmp_path)}.items():
        monkeypatch.setenv(k, v)
    num_steps = 4
    reward = ['task.rewards={"holding_reward:score" = 1.0}', "task.reward_timeout_s=60"]
    proc, out = _launch(tmp_path, tiny_model, f"run.num_steps={num_steps}", "rollout.lease_timeout_s=2", *reward)
    run_dir = tmp_path / "survive"
    try:
        _wait_for((tmp_path / "scoring").exists, 300, "no step held", lambda: _diagnostics(tmp_path, out))
        running = _session_processes(_sessions(tmp_path))
        [worker] = [p for p in running if "-m services.rollout.main" in p and "deploy.guard" not in p]
        os.kill(int(worker.split(":")[0]), signal.SIGKILL)  # the worker, not its guard
        (tmp_path / "hold").unlink()
        assert proc.wait(timeout=300) == 0, _diagnostics(tmp_path, out)
    finally:
        proc.kill()
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s for s in steps if s > 0] == list(range(1, num_steps + 1))
    assert "rollout-0 exited with -9; restart 1 of 5" in out.read_text()
    log = (run_dir / "logs" / "rollout-0.log").read_text()
    restarted = log.split("restarted by the launcher ===")[1]
    # It took work only once it held the run's current weights (over gloo, the default transport, the coordinator
    # saw it joining and had the trainer publish them again), so nothing it sampled came back stale.
    assert re.search(r"joined at policy version [1-9]", restarted), restarted
    assert "sampled by policy version" not in (run_dir / "logs" / "coordinator.log").read_text()


def _read(path: Path) -> bytes:
    return path.read_bytes() if path.exists() else b""


def _sessions(tmp_path: Path) -> set[int]:
    [(_, record)] = records.read_all(tmp_path)
    return {s["pgid"] for s in record["services"]}


@pytest.mark.slow
def test_a_hung_rollout_worker_is_left_out_of_refits_and_catches_up_when_it_wakes(tmp_path, tiny_model):
    """SIGSTOP: the worker's sockets stay open, its beats stop. The run goes on with the other worker (each refit
    leaves the hung one out instead of waiting out the transfer's timeout), and once woken it gives back the work of
    versions it missed, gets the current version, and generates again. Steps here take milliseconds, so the stop
    often lands inside a transfer the worker already joined: that refit waits out weightsync.timeout_s (10 s here)
    and its retry leaves the worker out."""
    num_steps = 12
    proc, out = _launch(tmp_path, tiny_model, f"run.num_steps={num_steps}", "rollout.num_workers=2",
                        "rollout.lease_timeout_s=2", "weightsync.timeout_s=10")  # fmt: skip
    run_dir = tmp_path / "survive"

    def steps() -> list[int]:
        rows = _read(run_dir / "metrics.jsonl").decode().splitlines()
        return [s for s in (json.loads(line)["step"] for line in rows) if s > 0]

    diagnostics = functools.partial(_diagnostics, tmp_path, out)
    try:
        _wait_for(lambda: 1 in steps(), 300, "no step 1", diagnostics)
        [worker] = [p for p in _session_processes(_sessions(tmp_path)) if "--worker-index 1" in p and "guard" not in p]
        pid = int(worker.split(":")[0])
        os.kill(pid, signal.SIGSTOP)
        stopped_at = len(steps())
        try:
            # Two refits without it: at most one transfer timeout (10 s) and a retry, well within 60 s.
            _wait_for(lambda: len(steps()) >= stopped_at + 2, 60, "the run stalled on the hung worker", diagnostics)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert proc.wait(timeout=300) == 0, diagnostics()
    finally:
        proc.kill()
    assert steps() == list(range(1, num_steps + 1))
    for line in (run_dir / "batches.jsonl").read_text().splitlines():  # each prompt of each step trained once
        b = json.loads(line)
        assert sorted(b["trajectory_ids"]) == sorted(f"survive/{b['step']}/{p}/{s}" for p in range(2) for s in range(2))
    assert "endpoint rollout-1" in (log := (run_dir / "logs" / "weightsync.log").read_text()) and "is hung" in log
    # Woken, it holds a version made while it was hung (from the next refit, or from one the coordinator published
    # for it when its beats said it was joining) before it generates again.
    woken = (run_dir / "logs" / "rollout-1.log").read_text()
    caught_up = [m for m in re.finditer(r"version (\d+) applied", woken) if int(m[1]) >= stopped_at + 2]
    assert caught_up and re.search(r"\d groups \(", woken[caught_up[0].end() :]), woken[-3000:]
