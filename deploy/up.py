"""`make up`: place every service on a Slurm allocation, a Docker host or this machine; check, then launch."""

from __future__ import annotations

import argparse
import sys

from services.common.config import ConfigError, config_from_cli

from .launchers import LAUNCHERS, detect, launcher
from .placement import PlacementError


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=tuple(LAUNCHERS), default=None, help="default: detected (launchers.py)")
    parser.add_argument("--dry-run", action="store_true", help="check the config, print the placement, start nothing")
    try:
        cfg, args = config_from_cli(__doc__, parser)
        from .preflight import preflight

        preflight(cfg)
        backend = args.backend or detect()
        print(f"backend: {backend}", flush=True)
        argv = (["--config", args.config] if args.config else []) + args.overrides
        return launcher(backend).up(cfg, args.dry_run, argv)
    except (ConfigError, PlacementError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
