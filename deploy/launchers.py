"""Where `make up` launches, one line per backend: its name (also the `kind` of the record under `.up/` that
`make down` reads) and the module that launches and stops it. A new launcher (Ray, Kubernetes) is one folder with
such a module and one line here: deploy/up.py and deploy/down.py name no backend.

Each module has three functions (the Launcher contract):
- `detect() -> bool`: whether `make up` here should use it by default;
- `up(cfg, dry_run, argv) -> int`: place, check and launch the run (argv: the config arguments as typed, which a
  launcher that starts the run elsewhere passes on, as sbatch does to its job);
- `stop(record) -> list[str]`: stop what a record of its kind names, saying what it stopped.
"""

from __future__ import annotations

import importlib
from typing import Protocol

from services.common.config import RunConfig

LAUNCHERS: dict[str, str] = {
    # In detection order: the first whose detect() answers is the default.
    "slurm": "deploy.slurm.launch",  # inside an allocation (SLURM_JOB_ID): each service an srun step
    "sbatch": "deploy.slurm.submit",  # where Slurm answers: the same launch as a batch job
    "docker": "deploy.docker.launch",  # where a Docker engine answers: one compose project per run
    "local": "deploy.local",  # this machine (`make run`)
}

STOP_ORDER = ("local", "docker", "slurm", "sbatch")
"""`make down` stops launchers before the batch jobs that hold them (sbatch's job runs slurm's launcher), so they get
to stop their services first. Every launcher is in it (tests/unit/test_launchers.py)."""


class Launcher(Protocol):
    def detect(self) -> bool: ...

    def up(self, cfg: RunConfig, dry_run: bool, argv: list[str]) -> int: ...

    def stop(self, record: dict) -> list[str]: ...


def launcher(name: str) -> Launcher:
    if name not in LAUNCHERS:
        raise ValueError(f"no launcher {name!r}; there are {', '.join(LAUNCHERS)}")
    return importlib.import_module(LAUNCHERS[name])  # type: ignore[return-value]


def detect() -> str:
    """The first launcher, in LAUNCHERS' order, that says it applies here (local always does)."""
    return next(name for name in LAUNCHERS if launcher(name).detect())
