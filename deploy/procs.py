"""Start service processes in their own process groups, and stop every one of them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Service:
    name: str
    proc: subprocess.Popen
    log: Path


def spawn(name: str, args: list[str], log_dir: Path, env: dict[str, str] | None = None) -> Service:
    """Run `python -m <args>` (or a command) in a new session, output to <log_dir>/<name>.log."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    cmd = [sys.executable, *args]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.Popen(cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=full_env, start_new_session=True)
    return Service(name, proc, log)


def check_alive(services: list[Service]) -> None:
    for s in services:
        if s.proc.poll() is not None:
            tail = s.log.read_text(errors="replace").splitlines()[-15:]
            raise RuntimeError(f"{s.name} exited with {s.proc.returncode}; last lines of {s.log}:\n" + "\n".join(tail))


def stop_all(services: list[Service], grace_s: float = 15.0) -> None:
    """SIGTERM every process group (newest first), then SIGKILL what is left after grace_s."""
    for s in reversed(services):
        _signal_group(s.proc, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for s in reversed(services):
        try:
            s.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for s in services:
        # The whole group: torchrun's ranks and vLLM's helpers go too.
        _signal_group(s.proc, signal.SIGKILL)
        s.proc.wait()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
