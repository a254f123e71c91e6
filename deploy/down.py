"""`make down`: stop everything `make up` or `make run` started (from the records under `<output_dir>/.up/`), and
say what it stopped.

Of the config (`--config` and dotted overrides) only run.output_dir is read.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from services.common.config import ConfigError, config_from_cli

from . import records
from .procs import group_members, start_ticks


def main() -> int:
    try:
        output_dir = config_from_cli(__doc__)[0].run.output_dir
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    found = records.read_all(output_dir)
    if not found:
        print(f"nothing started by `make up` or `make run` is recorded under {Path(output_dir) / '.up'}")
    for path, record in found:
        print(f"stopping run {record['run_id']} ({record['kind']})", flush=True)
        stopped = STOP[record["kind"]](record)
        for line in stopped or ["nothing of it was running"]:
            print(f"  stopped {line}" if stopped else f"  {line}", flush=True)
        records.remove(path)
    return 0


def _stop_launcher(record: dict, timeout_s: float = 120.0) -> list[str]:
    """SIGTERM to the launcher: like Ctrl-C, it stops the services it started, then exits.

    Not SIGINT: a launcher started in the background (`nohup make up &`) ignores it.
    """
    pid = record["pid"]
    if record["host"] != socket.gethostname() or not _is_launcher(pid):
        return []
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _is_launcher(pid):
        if time.monotonic() > deadline:
            print(f"launcher {pid} still running after {timeout_s:.0f}s; killing it", file=sys.stderr)
            os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.2)
    return [f"launcher {pid} (it stopped the services it started)"]


def _is_launcher(pid: int) -> bool:
    # Not merely "pid exists": ids are reused, and an exited child nobody reaped stays as a zombie.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z" and b"deploy." in cmdline


def _stop_local(record: dict) -> list[str]:
    """The launcher, then whatever is left of its services' process groups: a launcher killed with SIGKILL
    stopped none of them (their guards end them within seconds, but `make down` need not rely on it)."""
    stopped = _stop_launcher(record)
    if record["host"] != socket.gethostname():
        return stopped
    for service in record.get("services", []):
        pgid = service["pgid"]
        members = _our_group(pgid, service["start_ticks"])
        if members:
            _stop_group(pgid)
            stopped.append(f"{service['name']}: process group {pgid} ({len(members)} processes)")
    return stopped


def _our_group(pgid: int, leader_start_ticks: int | None) -> list[int]:
    """The group's live processes, unless pgid now names someone else's group. While any process of a group
    lives the kernel does not hand its id out again, so a group without its leader is still ours; a live
    leader is ours if it started when the recorded one did."""
    members = group_members(pgid)
    if pgid in members and start_ticks(pgid) != leader_start_ticks:
        return []
    return members


def _stop_group(pgid: int, grace_s: float = 15.0) -> None:
    """SIGTERM, then SIGKILL to what is left after grace_s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_s
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)


def _stop_slurm(record: dict) -> list[str]:
    from .slurm.launch import our_steps, stop_steps

    stopped = _stop_launcher(record)
    # The launcher may run on another host, or have died: stop its steps through Slurm.
    if our_steps(record["job_id"], record["run_id"]):
        stop_steps([], record["job_id"], record["run_id"])
        stopped.append(f"the run's job steps in job {record['job_id']}")
    return stopped


def _stop_sbatch(record: dict, timeout_s: float = 120.0) -> list[str]:
    job_id = record["job_id"]
    if not _job_listed(job_id):
        return []
    subprocess.run(["scancel", job_id], check=True)
    deadline = time.monotonic() + timeout_s
    while _job_listed(job_id):
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} still listed by squeue {timeout_s:.0f}s after scancel")
        time.sleep(0.5)
    return [f"batch job {job_id}"]


def _job_listed(job_id: str) -> bool:
    out = subprocess.run(["squeue", "--noheader", f"--jobs={job_id}", "--format=%T"], capture_output=True, text=True)
    return out.returncode == 0 and bool(out.stdout.strip())


def _stop_docker(record: dict) -> list[str]:
    stopped = _stop_launcher(record)
    env = {**os.environ, **record["env"]}
    subprocess.run([*record["compose"], "down", "--remove-orphans"], env=env, check=True)
    return [*stopped, f"compose project {record['env'].get('GRPO_PROJECT', '')} (down --remove-orphans)"]


STOP = {"local": _stop_local, "slurm": _stop_slurm, "sbatch": _stop_sbatch, "docker": _stop_docker}


if __name__ == "__main__":
    sys.exit(main())
