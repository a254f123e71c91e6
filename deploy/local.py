"""`make run`: every service as a local process, one GRPO run, a live table, then a clean stop."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from services.common.config import ConfigError, RunConfig, dump_toml, load_config


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default=None, help="run TOML (default: built-in defaults)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. run.num_steps=5")
    args = parser.parse_args()
    try:
        cfg = load_config(args.config, args.overrides)
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
    from services.common.tinymodel import create_tiny_model

    from .placement import launches
    from .procs import Service, spawn, stop_all

    if cfg.model.create:
        create_tiny_model(cfg.model, cfg.run.seed)
    services: list[Service] = []
    try:
        if cfg.redis.port:
            redis_proc = start_redis(cfg.redis.port, run_dir / "redis")
            services.append(Service("redis", redis_proc, run_dir / "redis" / "redis.log"))
        for launch in launches(cfg, run_dir / "config.toml"):
            services.append(spawn(launch.name, launch.args, run_dir / "logs", gpus.get(launch.name)))
        return drive(cfg, run_dir, services)
    except KeyboardInterrupt:
        print("\ninterrupted: stopping every service", file=sys.stderr)
        return 130
    finally:
        stop_all(services)


def drive(cfg: RunConfig, run_dir: Path, services) -> int:
    """Wait for the services, start the run, show progress until it ends."""
    from tqdm import tqdm

    from protos.grpo.v1 import coordinator_pb2
    from services.coordinator.client import CoordinatorClient
    from services.coordinator.metrics import header, row

    from .procs import check_alive

    addresses = [f"{cfg.weightsync.host}:{cfg.weightsync.grpc_port}", f"{cfg.trainer.host}:{cfg.trainer.grpc_port}"]
    addresses += [f"{cfg.rollout.host}:{cfg.rollout.grpc_port + i}" for i in range(cfg.rollout.num_workers)]
    addresses.append(f"{cfg.coordinator.host}:{cfg.coordinator.grpc_port}")
    print(f"run {cfg.run.run_id}: starting services (logs in {run_dir / 'logs'})", flush=True)
    for address in addresses:
        _wait(address, services)
    print(f"status: http://{cfg.coordinator.host}:{cfg.coordinator.http_port}/status", flush=True)
    with CoordinatorClient(f"{cfg.coordinator.host}:{cfg.coordinator.grpc_port}") as client:
        status = client.start_run(cfg.run.num_steps)
        bar = tqdm(total=status.num_steps, unit="step", dynamic_ncols=True)
        bar.write(header())
        shown = 0
        while status.state == coordinator_pb2.RUN_STATE_RUNNING:
            time.sleep(0.5)
            check_alive(services)
            status = client.status()
            if status.step > shown:
                bar.write(row(dict(status.last_metrics)))
                bar.update(status.step - shown)
                shown = status.step
        bar.close()
    state = coordinator_pb2.RunState.Name(status.state)
    print(f"run {cfg.run.run_id} ended: {state} after {status.step} steps; {run_dir}/metrics.jsonl, {run_dir}/plot.png")
    if status.error:
        print(f"error: {status.error}", file=sys.stderr)
    return 0 if status.state == coordinator_pb2.RUN_STATE_DONE else 1


def _wait(address: str, services, timeout_s: float = 300.0) -> None:
    """Until the service at address is healthy; fail fast if any service process died."""
    from services.common.grpcio import wait_healthy

    from .procs import check_alive

    deadline = time.monotonic() + timeout_s
    while True:
        check_alive(services)
        try:
            wait_healthy(address, timeout_s=2.0)
            return
        except TimeoutError:
            if time.monotonic() > deadline:
                raise


if __name__ == "__main__":
    sys.exit(main())
