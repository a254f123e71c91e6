"""A launcher's answer to the death of a service that holds the run's state (trainer, weightsync, coordinator): stop
every service, resume the run from its newest checkpoint, up to run.max_restarts times; then one line names the
process and the command that resumes the run. Shared by `make run` and `make up` (Slurm, Docker)."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

from services.common.config import RunConfig

from .placement import Placement
from .procs import ServiceDied


def run_resuming(
    placement: Placement,
    run_dir: Path,
    run_once: Callable[[Placement], int],
    command: str,
    services_cfg: Callable[[Placement], RunConfig] | None = None,
) -> int:
    """run_once(placement) until it returns; after a ServiceDied, again with run.resume set. `command` is the
    front-door command (`make run`, `make up`) the last error line names; services_cfg, the config the services
    read where it differs from the placement's (Docker's container paths)."""
    from services.coordinator.run_record import RunRecord

    for restart in range(placement.cfg.run.max_restarts + 1):
        try:
            return run_once(placement)
        except ServiceDied as died:
            latest = RunRecord(run_dir).latest()
            if latest is None:
                print(f"{died}\nerror: {died.service} died before the run's first checkpoint", file=sys.stderr)
                return 1
            if restart == placement.cfg.run.max_restarts:
                resume = f"{command} ARGS='run.resume=\"{run_dir}\"'"
                print(f"{died}\nerror: {died.service} died after {restart} restarts; continue with: {resume}",
                      file=sys.stderr)  # fmt: skip
                return 1
            print(
                f"{died.service} died: resuming the run from step {latest[1].step} "
                f"(restart {restart + 1} of {placement.cfg.run.max_restarts}); {died}",
                file=sys.stderr, flush=True,
            )  # fmt: skip
            placement = resumed(placement, run_dir, services_cfg)
    raise AssertionError("unreachable")


def resumed(
    placement: Placement, run_dir: Path, services_cfg: Callable[[Placement], RunConfig] | None = None
) -> Placement:
    """The same placement (ports, hosts) with run.resume set: the coordinator continues from the newest checkpoint."""
    cfg = placement.cfg.model_copy(update={"run": placement.cfg.run.model_copy(update={"resume": str(run_dir)})})
    placement = dataclasses.replace(placement, cfg=cfg)
    placement.write_configs(run_dir, services_cfg(placement) if services_cfg else None)
    return placement
