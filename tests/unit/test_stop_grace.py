"""A stopped run saves the step it completed: the launcher gives its coordinator the time the run's checkpoints take
(checkpoints.jsonl), with the trainer still up, and still ends every process, guards included."""

from __future__ import annotations

import json
import os
import time

import pytest

from deploy.local import last_save_s
from deploy.procs import spawn, stop_all

SAVES_SLOWLY = """
import os, signal, sys, time
from pathlib import Path

def stop(*_):
    time.sleep(float(sys.argv[2]))  # the trainer's Save of a real model's optimizer state
    try:
        os.kill(int(sys.argv[3]), 0)
        trainer = "up"
    except ProcessLookupError:
        trainer = "gone"
    Path(sys.argv[1]).write_text(trainer)
    sys.exit(0)

signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
while True:
    time.sleep(0.1)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ")[1][0] != "Z"


@pytest.mark.parametrize("last_checkpoint_s", [7.0, None], ids=["7s-checkpoints", "no-checkpoint-yet"])
def test_a_stopped_coordinator_gets_the_time_the_runs_checkpoints_take(tmp_path, last_checkpoint_s):
    run_dir, saved = tmp_path / "run", tmp_path / "saved"
    run_dir.mkdir()
    if last_checkpoint_s is not None:
        rows = [{"step": 2, "path": "x", "policy_version": 2}, {"step": 2, "resumable": True, "seconds": 7.0}]
        (run_dir / "checkpoints.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    trainer = spawn("trainer", ["-c", "import time; time.sleep(600)"], tmp_path / "logs", guard=True)
    time.sleep(0.5)
    [trainer_pid] = [int(p) for p in os.listdir("/proc") if p.isdigit() and _parent(int(p)) == trainer.proc.pid]
    coordinator = spawn("coordinator", ["-c", SAVES_SLOWLY, str(saved), "7", str(trainer_pid)], tmp_path / "logs",
                        guard=True)  # fmt: skip
    deadline = time.monotonic() + 30
    while b"ready" not in coordinator.log.read_bytes():
        assert time.monotonic() < deadline and coordinator.proc.poll() is None, coordinator.log.read_text()
        time.sleep(0.1)
    start = time.monotonic()
    stop_all([trainer, coordinator], save_s=last_save_s(run_dir))
    took = time.monotonic() - start
    assert not any(_alive(p) for p in (trainer.proc.pid, trainer_pid, coordinator.proc.pid))
    if last_checkpoint_s is None:  # no measure yet: the default grace holds, and the save is cut off
        assert not saved.exists() and took < 10
    else:  # saved, with the trainer up all along, within 1.5 x 7 + 4 s
        assert saved.read_text() == "up" and took < 1.5 * 7 + 4


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().split(") ")[1].split()[1])
    except OSError:
        return -1
