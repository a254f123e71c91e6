"""What the launchers' `stop` share: ending a launcher by its recorded pid, and the process groups it left."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path

from .procs import group_members, start_ticks


def stop_launcher(record: dict, timeout_s: float = 120.0) -> list[str]:
    """SIGTERM to the launcher: like Ctrl-C, it stops the services it started, then exits.

    Not SIGINT: a launcher started in the background (`nohup make up &`) ignores it.
    """
    pid = record["pid"]
    if record["host"] != socket.gethostname() or not is_launcher(pid):
        return []
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while is_launcher(pid):
        if time.monotonic() > deadline:
            print(f"launcher {pid} still running after {timeout_s:.0f}s; killing it", file=sys.stderr)
            os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.2)
    return [f"launcher {pid} (it stopped the services it started)"]


def is_launcher(pid: int) -> bool:
    # Not merely "pid exists": ids are reused, and an exited child nobody reaped stays as a zombie.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z" and b"deploy." in cmdline


def our_group(pgid: int, leader_start_ticks: int | None) -> list[int]:
    """The group's live processes, unless pgid now names someone else's group. While any process of a group
    lives the kernel does not hand its id out again, so a group without its leader is still ours; a live
    leader is ours if it started when the recorded one did."""
    members = group_members(pgid)
    if pgid in members and start_ticks(pgid) != leader_start_ticks:
        return []
    return members


def stop_group(pgid: int, grace_s: float = 15.0) -> None:
    """SIGTERM, then SIGKILL to what is left after grace_s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_s
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
