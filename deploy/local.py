"""`make run`: every service as a local process, one GRPO run, a live table, then a clean stop."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

from services.common.config import ConfigError, RunConfig, config_from_cli

from . import stopping
from .placement import Cluster, Placement, PlacementError, place
from .placement.commands import service_args, service_env


def main() -> int:
    try:
        cfg, _ = config_from_cli(__doc__)
        from .preflight import preflight

        preflight(cfg)
        placement = place(cfg, this_machine())
    except (ConfigError, PlacementError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return run_local(placement, write_config(placement))


def detect() -> bool:
    """This machine is always there to run on: the last of deploy/launchers.py's order."""
    return True


def up(cfg: RunConfig, dry_run: bool, argv: list[str]) -> int:
    """`make run`'s launch, after the same placement and checks as the other backends."""
    from .placement import format_placement

    placement = place(cfg, this_machine())
    print(format_placement(placement), flush=True)
    if dry_run:
        return 0
    return run_local(placement, write_config(placement))


def stop(record: dict) -> list[str]:
    """The launcher, then whatever is left of its services' process groups: a launcher killed with SIGKILL
    stopped none of them (their guards end them within seconds, but `make down` need not rely on it)."""
    stopped = stopping.stop_launcher(record)
    if record["host"] != socket.gethostname():
        return stopped
    for service in record.get("services", []):
        pgid = service["pgid"]
        members = stopping.our_group(pgid, service["start_ticks"])
        if members:
            stopping.stop_group(pgid)
            stopped.append(f"{service['name']}: process group {pgid} ({len(members)} processes)")
    return stopped


def this_machine() -> Cluster:
    """This host and the GPUs this process sees."""
    import torch

    return Cluster("local", (socket.gethostname(),), torch.cuda.device_count())


def write_config(placement: Placement) -> Path:
    """The run folder, with the placement's config in it that every service reads; returns the folder."""
    run_dir = Path(placement.cfg.run.output_dir) / placement.cfg.run.run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    placement.write_configs(run_dir)
    return run_dir


def launches(placement: Placement, config_path: Path) -> list[tuple[str, list[str], dict[str, str]]]:
    """Name, python arguments and environment of every service process, in start order."""
    return [
        (a.service, service_args(placement, a, str(config_path)), service_env(a, os.environ))
        for a in placement.services
    ]


def run_local(placement: Placement, run_dir: Path) -> int:
    """The run to its end, resumed from its newest checkpoint after a trainer, weightsync or coordinator died."""
    from .resuming import run_resuming

    return run_resuming(placement, run_dir, lambda p: run_services(p, run_dir), "make run")


def run_services(placement: Placement, run_dir: Path) -> int:
    """Start every service under a guard (deploy/guard.py), supervise the run, stop them all at its end.

    The launch record (`make down`) names each service's process group, so they can be found also after a
    `kill -9` of this launcher (whose guards end them within seconds anyway)."""
    from . import records
    from .procs import describe, spawn, stop_all
    from .supervise import shield_cleanup, stop_on_sigterm

    cfg, services = placement.cfg, []

    def record() -> Path:
        return records.write(cfg.run.output_dir, "local", cfg.run.run_id, services=[describe(s) for s in services])

    path = record()
    stop_on_sigterm()
    try:
        if placement.start_redis:
            services.append(_start_redis(placement, run_dir))
            record()
        for name, args, env in launches(placement, run_dir / "config.toml"):
            services.append(spawn(name, args, run_dir / "logs", env, guard=True))
            record()
        return _supervise(placement, run_dir, services, record)
    except KeyboardInterrupt:
        print("\ninterrupted: stopping every service", file=sys.stderr)
        return 130
    finally:
        shield_cleanup()
        stop_all(services, save_s=last_save_s(run_dir))
        records.remove(path)


def last_save_s(run_dir: Path) -> float:
    """Seconds the run's newest resumable checkpoint took (checkpoints.jsonl), 0 before the first: what a stopped
    run needs to save the step it completed."""
    path = run_dir / "checkpoints.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return next((float(r["seconds"]) for r in reversed(rows) if r.get("resumable") and "seconds" in r), 0.0)


def _start_redis(placement: Placement, run_dir: Path):
    from services.common import auth, tls
    from services.common.redis_server import redis_command, wait_answering

    from .procs import start

    data_dir = run_dir / "redis"
    data_dir.mkdir(parents=True, exist_ok=True)
    port = placement.cfg.redis.port
    secret = auth.run_secret(run_dir)
    tls_dir = (run_dir / tls.DIR_NAME).resolve() if placement.cfg.run.tls else None
    cmd = redis_command(port, data_dir, secret=secret, tls_dir=tls_dir)
    redis = start("redis", cmd, data_dir / "redis.log", guard=True)
    wait_answering(redis.proc, port, redis.log, secret=secret, tls_dir=tls_dir)
    return redis


def _supervise(placement: Placement, run_dir: Path, services, record) -> int:
    """Wait for the services, start the run, show progress until it ends; a dead rollout worker is restarted, and
    rollout workers are added or drained to the count the coordinator wants (ScaleRollout)."""
    from .restarts import Restarts
    from .scale import RolloutScaler
    from .supervise import run_to_end, wait_ready

    cfg = placement.cfg
    limits = {"redis": cfg.run.max_restarts}  # rollout workers: rollout.max_restarts each
    restarts = Restarts(services, record, lambda name: limits.get(name, cfg.rollout.max_restarts))
    alive, scaler = restarts.check_alive, RolloutScaler(services, restarts, record)
    print(f"run {cfg.run.run_id}: starting services (logs in {run_dir / 'logs'})", flush=True)
    wait_ready([a.address for a in placement.services], alive)
    return run_to_end(cfg, placement.get("coordinator").address, placement.status_url, alive, scaler.reconcile)


if __name__ == "__main__":
    sys.exit(main())
