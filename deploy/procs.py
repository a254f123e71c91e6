"""Start service processes in their own process groups, and stop every one of them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Service:
    name: str
    proc: subprocess.Popen
    log: Path
    cmd: list[str] = field(default_factory=list)
    """What was started (without the guard's arguments), so that `restart` can start it again."""
    env: dict[str, str] = field(default_factory=dict)
    guarded: bool = False


_lifeline: tuple[int, int] | None = None


def lifeline() -> int:
    """The read end of a pipe whose write end this process holds until it exits, however it exits.

    Both ends are close-on-exec: only a guarded service is handed the read end (pass_fds), and no child
    holds the write end, so the guards read EOF exactly when this process is gone."""
    global _lifeline
    if _lifeline is None:
        _lifeline = os.pipe()
    return _lifeline[0]


def spawn(
    name: str, args: list[str], log_dir: Path, env: dict[str, str] | None = None, *, guard: bool = False
) -> Service:
    """Run `python <args>` in a new session, output to <log_dir>/<name>.log.

    guard: under deploy/guard.py, which ends the service's whole process group once this process is gone."""
    log_dir.mkdir(parents=True, exist_ok=True)
    return start(name, [sys.executable, *args], log_dir / f"{name}.log", env, guard=guard)


def start(name: str, cmd: list[str], log: Path, env: dict[str, str] | None = None, *, guard: bool = False) -> Service:
    """Run any command as `spawn` runs a python one."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    guarded = [sys.executable, "-m", "deploy.guard", str(lifeline()), *cmd] if guard else cmd
    proc = subprocess.Popen(
        guarded,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env=full_env,
        start_new_session=True,
        pass_fds=(lifeline(),) if guard else (),
    )
    return Service(name, proc, log, cmd, env or {}, guard)


def restart(s: Service) -> Service:
    """The same command again, once what is left of the old process group (helpers of the dead process) is gone."""
    assert s.cmd and s.proc.poll() is not None, s.name
    _signal_group(s.proc, signal.SIGKILL)
    with s.log.open("a") as f:
        f.write(f"\n=== {s.name} exited with {s.proc.returncode}; restarted by the launcher ===\n")
    return start(s.name, s.cmd, s.log, s.env, guard=s.guarded)


def drain(s: Service) -> None:
    """SIGTERM to the service's own process, not to its group: its guard would end the group GRACE_S later, and a
    draining worker takes what it needs to finish the items it claimed (its reward processes stay its own). A guard
    that has not started its service yet gets it: the service then never starts."""
    pids = _children(s.proc.pid) if s.guarded else [s.proc.pid]
    if not pids:
        stop_group(s)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def stop_group(s: Service) -> None:
    _signal_group(s.proc, signal.SIGTERM)


def _children(pid: int) -> list[int]:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(_stat(int(entry))[1]) == pid:
                found.append(int(entry))
        except OSError:
            continue
    return found


class ServiceDied(RuntimeError):
    """A service of the run exited; `service` names it, the message holds its log's tail."""

    def __init__(self, service: str, message: str):
        super().__init__(message)
        self.service = service

    @classmethod
    def of(cls, s: Service, prefix: str = "") -> ServiceDied:
        return cls(s.name, prefix + exit_message(s))


def exit_message(s: Service) -> str:
    tail = s.log.read_text(errors="replace").splitlines()[-15:]
    return f"{s.name} exited with {s.proc.returncode}; last lines of {s.log}:\n" + "\n".join(tail)


def check_alive(services: list[Service]) -> None:
    for s in services:
        if s.proc.poll() is not None:
            raise ServiceDied.of(s)


STOP_GRACE_S = 8.0
"""From SIGTERM to SIGKILL of every group when the launcher stops: a service stuck in its shutdown (a refit whose
peer is gone, a dead Redis) must not keep the launcher's promise, every service gone within 10 s (or, when the run's
checkpoints take longer, 1.5 x the last one's time and 4 s: stop_all's save_s), from holding."""


FIRST_TO_STOP = "coordinator"
"""Stopped before the others: a stopped run checkpoints its last complete step, which needs the trainer."""


def stop_all(services: list[Service], grace_s: float = STOP_GRACE_S, save_s: float = 0.0) -> None:
    """SIGTERM the coordinator and wait for it (most of grace_s), then every other process group (newest first);
    SIGKILL what is left after grace_s in all.

    save_s: how long the run's last checkpoint took. A stopped coordinator saves the step it completed, so when that
    takes longer than grace_s allows (a real model's optimizer state) the coordinator gets 1.5 x save_s + 2 s, and
    only its own process is signalled: its guard's short grace (deploy/guard.py) starts only with the group's."""
    first_s = max(grace_s - 2.0, 1.5 * save_s + 2.0)
    deadline = time.monotonic() + first_s + 2.0
    first = [s for s in services if s.name == FIRST_TO_STOP and s.proc.poll() is None]
    for s in first:
        drain(s)
        try:
            s.proc.wait(timeout=max(0.1, deadline - 2.0 - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for s in reversed(services):
        _signal_group(s.proc, signal.SIGTERM)
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


def describe(s: Service) -> dict:
    """What `make down` needs to find the service's process group again, also after the launcher died."""
    return {"name": s.name, "pgid": s.proc.pid, "start_ticks": start_ticks(s.proc.pid)}


def start_ticks(pid: int) -> int | None:
    """When the process started (clock ticks since boot): with the pid, it names one process, not a reused id."""
    try:
        return int(_stat(pid)[19])
    except OSError:
        return None


def group_members(pgid: int) -> list[int]:
    """The live processes of process group pgid (zombies left out)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = _stat(int(entry))
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(entry))
    return found


def _stat(pid: int) -> list[str]:
    """Fields of /proc/<pid>/stat after the command name (state first)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
