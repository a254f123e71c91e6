"""`make up`: place every service on a Slurm allocation, a Docker host or this machine; check, then launch."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

from services.common.config import ConfigError, RunConfig, dump_toml, load_config

from .plan import PlanError

BACKENDS = ("slurm", "sbatch", "docker", "local")


def detect() -> str:
    """Inside an allocation: slurm; where Slurm answers: sbatch; where a Docker engine answers: docker."""
    import subprocess

    from .slurm.cluster import answers

    if os.environ.get("SLURM_JOB_ID"):
        return "slurm"
    if answers():
        return "sbatch"
    try:
        if subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0:
            return "docker"
    except (OSError, subprocess.TimeoutExpired):
        pass
    return "local"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default=None, help="run TOML (default: built-in defaults)")
    parser.add_argument("--backend", choices=BACKENDS, default=None, help="default: detected (see detect())")
    parser.add_argument("--dry-run", action="store_true", help="check the config, print the plan, start nothing")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. run.num_steps=5")
    args = parser.parse_args()
    try:
        cfg = load_config(args.config, args.overrides)
        from .preflight import preflight

        preflight(cfg)
        backend = args.backend or detect()
        print(f"backend: {backend}", flush=True)
        if backend == "slurm":
            from .slurm.launch import up

            return up(cfg, args.dry_run)
        if backend == "sbatch":
            from .slurm.submit import up

            return up(cfg, args.dry_run, (["--config", args.config] if args.config else []) + args.overrides)
        if backend == "docker":
            from .docker.launch import up

            return up(cfg, args.dry_run)
        return _local(cfg, args)
    except (ConfigError, PlanError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _local(cfg: RunConfig, args: argparse.Namespace) -> int:
    """The placement of `make run`, after the same checks as the other backends."""
    import torch

    from . import records
    from .drive import stop_on_sigterm
    from .local import run_local
    from .placement import gpu_env
    from .plan import Cluster, format_plan, place

    cluster = Cluster("local", (socket.gethostname(),), torch.cuda.device_count())
    plan = place(cfg, cluster)
    print(format_plan(plan), flush=True)
    if args.dry_run:
        return 0
    run_dir = Path(plan.cfg.run.output_dir) / plan.cfg.run.run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(dump_toml(plan.cfg))
    record = records.write(plan.cfg.run.output_dir, "local", plan.cfg.run.run_id)
    stop_on_sigterm()
    try:
        return run_local(plan.cfg, run_dir, gpu_env(plan.cfg, cluster.gpus_per_node))
    finally:
        records.remove(record)


if __name__ == "__main__":
    sys.exit(main())
