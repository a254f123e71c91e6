"""`make up`: place every service on a Slurm allocation, a Docker host or this machine; check, then launch."""

from __future__ import annotations

import argparse
import os
import sys

from services.common.config import ConfigError, RunConfig, config_from_cli

from .placement import PlacementError

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
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=BACKENDS, default=None, help="default: detected (see detect())")
    parser.add_argument("--dry-run", action="store_true", help="check the config, print the placement, start nothing")
    try:
        cfg, args = config_from_cli(__doc__, parser)
        from .preflight import preflight

        preflight(cfg)
        backend = args.backend or detect()
        print(f"backend: {backend}", flush=True)
        return _launch(backend, cfg, args)
    except (ConfigError, PlacementError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _launch(backend: str, cfg: RunConfig, args: argparse.Namespace) -> int:
    if backend == "slurm":
        from .slurm.launch import up

        return up(cfg, args.dry_run)
    if backend == "sbatch":
        from .slurm.submit import up

        return up(cfg, args.dry_run, (["--config", args.config] if args.config else []) + args.overrides)
    if backend == "docker":
        from .docker.launch import up

        return up(cfg, args.dry_run)
    return _local(cfg, args.dry_run)


def _local(cfg: RunConfig, dry_run: bool) -> int:
    """`make run`'s launch, after the same placement and checks as the other backends."""
    from . import local
    from .placement import format_placement, place

    placement = place(cfg, local.this_machine())
    print(format_placement(placement), flush=True)
    if dry_run:
        return 0
    return local.run_local(placement, local.write_config(placement))


if __name__ == "__main__":
    sys.exit(main())
