"""`make up`: place every service on a Slurm allocation, a Docker host or this machine; check, then launch."""

from __future__ import annotations

import argparse
import os
import socket
import sys

from services.common.config import ConfigError, RunConfig, load_config

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
    from .plan import Cluster, format_plan, place

    plan = place(cfg, Cluster("local", (socket.gethostname(),), torch.cuda.device_count()))
    print(format_plan(plan), flush=True)
    if args.dry_run:
        return 0
    records.write(plan.cfg.run.output_dir, "local", plan.cfg.run.run_id)
    # Same process id: `make down` interrupts deploy.local like a Ctrl-C, and it stops its services.
    run_id = [f'run.run_id="{plan.cfg.run.run_id}"']
    conf = ["--config", args.config] if args.config else []
    os.execv(sys.executable, [sys.executable, "-m", "deploy.local", *conf, *args.overrides, *run_id])


if __name__ == "__main__":
    sys.exit(main())
