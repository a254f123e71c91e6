"""`make run`: every service as a local process, one GRPO run, a live table, then a clean stop."""

from __future__ import annotations

import functools
import os
import socket
import sys
from pathlib import Path

from services.common.config import ConfigError, config_from_cli, dump_toml

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


def this_machine() -> Cluster:
    """This host and the GPUs this process sees."""
    import torch

    return Cluster("local", (socket.gethostname(),), torch.cuda.device_count())


def write_config(placement: Placement) -> Path:
    """The run folder, with the placement's config in it that every service reads; returns the folder."""
    run_dir = Path(placement.cfg.run.output_dir) / placement.cfg.run.run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(dump_toml(placement.cfg))
    return run_dir


def launches(placement: Placement, config_path: Path) -> list[tuple[str, list[str], dict[str, str]]]:
    """Name, python arguments and environment of every service process, in start order."""
    return [
        (a.service, service_args(placement, a, str(config_path)), service_env(a, os.environ))
        for a in placement.services
    ]


def run_local(placement: Placement, run_dir: Path) -> int:
    from services.common.redis_server import start_redis

    from .procs import Service, spawn, stop_all

    services: list[Service] = []
    try:
        if placement.start_redis:
            redis_proc = start_redis(placement.cfg.redis.port, run_dir / "redis")
            services.append(Service("redis", redis_proc, run_dir / "redis" / "redis.log"))
        for name, args, env in launches(placement, run_dir / "config.toml"):
            services.append(spawn(name, args, run_dir / "logs", env))
        return _supervise(placement, run_dir, services)
    except KeyboardInterrupt:
        print("\ninterrupted: stopping every service", file=sys.stderr)
        return 130
    finally:
        stop_all(services)


def _supervise(placement: Placement, run_dir: Path, services) -> int:
    """Wait for the services, start the run, show progress until it ends."""
    from .procs import check_alive
    from .supervise import run_to_end, wait_ready

    cfg, alive = placement.cfg, functools.partial(check_alive, services)
    print(f"run {cfg.run.run_id}: starting services (logs in {run_dir / 'logs'})", flush=True)
    wait_ready([a.address for a in placement.services], alive)
    return run_to_end(cfg, placement.get("coordinator").address, placement.status_url, alive)


if __name__ == "__main__":
    sys.exit(main())
