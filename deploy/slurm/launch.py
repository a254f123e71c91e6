"""`make up` inside a Slurm allocation: every service an srun step on its assigned node, one run, a clean stop."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from services.common import auth, tls
from services.common.config import RunConfig

from .. import records, stopping
from ..placement import Assignment, Placement, format_placement, place
from ..procs import Service, check_alive, stop_all
from ..restarts import Restarts
from ..supervise import run_to_end, shield_cleanup, stop_on_sigterm, wait_ready
from .cluster import allocation
from .commands import srun, step_name


def detect() -> bool:
    """Inside an allocation (salloc, or a batch job's script)."""
    return bool(os.environ.get("SLURM_JOB_ID"))


def up(cfg: RunConfig, dry_run: bool, argv: list[str]) -> int:
    placement = place(cfg, allocation())
    print(format_placement(placement), flush=True)
    if dry_run:
        return 0
    run_dir = Path(placement.cfg.run.output_dir) / placement.cfg.run.run_id
    (run_dir / "redis").mkdir(parents=True, exist_ok=True)
    placement.write_configs(run_dir)
    from ..resuming import run_resuming

    return run_resuming(placement, run_dir, lambda p: run(p, run_dir), "make up")


def run(placement: Placement, run_dir: Path) -> int:
    from services.common.tinymodel import create_tiny_model

    cfg, job_id = placement.cfg, os.environ["SLURM_JOB_ID"]
    record = records.write(cfg.run.output_dir, "slurm", cfg.run.run_id, job_id=job_id)
    stop_on_sigterm()
    services: list[Service] = []
    try:
        # Before any step: rollout workers load it at start, and every node reads the same shared path.
        if cfg.model.create:
            create_tiny_model(cfg.model, cfg.run.seed)
        print(f"run {cfg.run.run_id}: starting job steps in job {job_id} (logs in {run_dir / 'logs'})", flush=True)
        for a in placement.assignments:
            services.append(_start(a, srun(placement, a, run_dir / "config.toml"), run_dir / "logs"))
            if a.service == "redis":
                tls_dir = run_dir / tls.DIR_NAME if cfg.run.tls else None
                _wait_redis(cfg.redis.url, services, auth.run_secret(run_dir), tls_dir)
        # A dead rollout worker or Redis is started again as a new job step, as `make run` does (deploy/restarts.py).
        limits = {"redis": cfg.run.max_restarts}
        alive = Restarts(services, lambda: None, lambda name: limits.get(name, cfg.rollout.max_restarts)).check_alive
        wait_ready([a.address for a in placement.services], alive)
        return run_to_end(cfg, placement.get("coordinator").address, placement.status_url, alive)
    except KeyboardInterrupt:
        print("\ninterrupted: stopping every job step", file=sys.stderr)
        return 130
    finally:
        shield_cleanup()
        stop_steps(services, job_id, cfg.run.run_id)
        records.remove(record)


def _start(a: Assignment, cmd: list[str], log_dir: Path) -> Service:
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{a.service}.log"
    # OMP threads as `make run` sets them; GPUs are picked on the node, by deploy/slurm/task.py.
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(a.threads)}
    # Own session: a Ctrl-C in the terminal reaches the launcher only, which stops the steps in order.
    proc = subprocess.Popen(cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return Service(a.service, proc, log, cmd, env)


def _wait_redis(
    url: str, services: list[Service], secret: str | None, tls_dir: Path | None, timeout_s: float = 120.0
) -> None:
    import redis

    from services.common.redis_server import password, ssl_options

    ssl = ssl_options(tls_dir) if tls_dir else {}
    client, deadline = redis.Redis.from_url(url, password=password(secret), **ssl), time.monotonic() + timeout_s
    while True:
        check_alive(services)
        try:
            client.ping()
            return
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"Redis at {url} did not answer within {timeout_s:.0f}s") from None
            time.sleep(0.2)


def stop(record: dict) -> list[str]:
    stopped = stopping.stop_launcher(record)
    # The launcher may run on another host, or have died: stop its steps through Slurm.
    if our_steps(record["job_id"], record["run_id"]):
        stop_steps([], record["job_id"], record["run_id"])
        stopped.append(f"the run's job steps in job {record['job_id']}")
    return stopped


def our_steps(job_id: str, run_id: str) -> list[tuple[str, str]]:
    """(job.step id, step name) of this run's steps still known to Slurm."""
    out = subprocess.run(
        ["squeue", "--noheader", "--steps", f"--jobs={job_id}", "--format=%i %j"], capture_output=True, text=True
    ).stdout
    ours = re.compile(re.escape(step_name(run_id, "")) + r"(redis|weightsync|trainer|coordinator|rollout-\d+)")
    rows = [line.split() for line in out.splitlines()]
    return [(row[0], row[1]) for row in rows if len(row) == 2 and ours.fullmatch(row[1])]


def stop_steps(services: list[Service], job_id: str, run_id: str, grace_s: float = 20.0) -> None:
    """The services first and Redis last, so their last calls still reach it; each phase SIGTERMs the tasks
    themselves, then cancels what is left.

    Not SIGTERM to srun: srun answers it by cancelling its step, which SIGKILLs the tasks at once.
    """
    redis_step = step_name(run_id, "redis")
    for is_redis in (False, True):
        procs = [s for s in services if (s.name == "redis") == is_redis]
        steps = [s for s in our_steps(job_id, run_id) if (s[1] == redis_step) == is_redis]
        if steps:
            subprocess.run(["scancel", "--signal=TERM", *(i for i, _ in steps)], capture_output=True)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and (any(p.proc.poll() is None for p in procs) or steps):
            time.sleep(0.5)
            steps = [s for s in our_steps(job_id, run_id) if (s[1] == redis_step) == is_redis]
        if steps:
            subprocess.run(["scancel", *(i for i, _ in steps)], capture_output=True)
        stop_all(procs, grace_s=10.0)
