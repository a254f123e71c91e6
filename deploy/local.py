"""`make run`: every service as a local process, one GRPO run, a live table, then a clean stop."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from services.common.config import ConfigError, RunConfig, dump_toml, load_config


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default=None, help="run TOML (default: built-in defaults)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. run.num_steps=5")
    args = parser.parse_args()
    try:
        cfg = load_config(args.config, args.overrides)
        from .preflight import preflight

        preflight(cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from .placement import gpu_env, resolve

    cfg = resolve(cfg)
    try:
        gpus = gpu_env(cfg, _num_gpus())
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    run_dir = Path(cfg.run.output_dir) / cfg.run.run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(dump_toml(cfg))
    return run_local(cfg, run_dir, gpus)


def _num_gpus() -> int:
    import torch

    return torch.cuda.device_count()


def run_local(cfg: RunConfig, run_dir: Path, gpus: dict[str, dict[str, str]]) -> int:
    from services.common.redis_server import start_redis

    from .placement import launches
    from .procs import Service, spawn, stop_all

    services: list[Service] = []
    try:
        if cfg.redis.port:
            redis_proc = start_redis(cfg.redis.port, run_dir / "redis")
            services.append(Service("redis", redis_proc, run_dir / "redis" / "redis.log"))
        for launch in launches(cfg, run_dir / "config.toml"):
            env = {"OMP_NUM_THREADS": str(threads(cfg, launch.name)), **gpus.get(launch.name, {})}
            services.append(spawn(launch.name, launch.args, run_dir / "logs", env))
        return drive(cfg, run_dir, services)
    except KeyboardInterrupt:
        print("\ninterrupted: stopping every service", file=sys.stderr)
        return 130
    finally:
        stop_all(services)


def threads(cfg: RunConfig, service: str) -> int:
    """OMP threads of a service's process: the trainer's and rollout workers' are configured, the rest use one."""
    if service == "trainer":
        return cfg.trainer.num_threads
    return cfg.rollout.num_threads if service.startswith("rollout") else 1


def drive(cfg: RunConfig, run_dir: Path, services) -> int:
    """Wait for the services, start the run, show progress until it ends."""
    from .drive import follow, wait_ready
    from .procs import check_alive

    addresses = [f"{cfg.weightsync.host}:{cfg.weightsync.grpc_port}", f"{cfg.trainer.host}:{cfg.trainer.grpc_port}"]
    addresses += [f"{cfg.rollout.host}:{cfg.rollout.grpc_port + i}" for i in range(cfg.rollout.num_workers)]
    addresses.append(f"{cfg.coordinator.host}:{cfg.coordinator.grpc_port}")
    print(f"run {cfg.run.run_id}: starting services (logs in {run_dir / 'logs'})", flush=True)
    wait_ready(addresses, lambda: check_alive(services))
    status_url = f"http://{cfg.coordinator.host}:{cfg.coordinator.http_port}/status"
    return follow(cfg, f"{cfg.coordinator.host}:{cfg.coordinator.grpc_port}", status_url, lambda: check_alive(services))


if __name__ == "__main__":
    sys.exit(main())
