"""What the placement engine works on and produces: the cluster, each service's assignment, the placement."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from services.common import auth, tls
from services.common.config import ConfigError, RunConfig, dump_toml

Backend = Literal["local", "slurm", "docker"]
Device = Literal["cpu", "cuda"]


class PlacementError(ValueError):
    """A placement that cannot run; the message says what to change."""


@dataclass(frozen=True)
class Cluster:
    """What a launcher may use: node names in allocation order and the GPUs of each node."""

    backend: Backend
    nodes: tuple[str, ...]
    gpus_per_node: int


@dataclass(frozen=True)
class Assignment:
    """Where one service runs and what it gets there."""

    service: str
    nodes: tuple[str, ...]
    host: str
    """Address the service binds and the others reach it at."""
    gpus: tuple[int, ...] | None = None
    """GPU indices on each of its nodes; () = hide every GPU (CPU run); None = leave CUDA's view as it is."""
    ports: dict[str, int] = field(default_factory=dict)
    threads: int = 1
    """OMP_NUM_THREADS of its processes."""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.ports['grpc']}"


@dataclass(frozen=True)
class Placement:
    """Every service's assignment on one cluster, and the config they all read."""

    cfg: RunConfig
    """Ports, hosts, run id and Redis URL filled in."""
    cluster: Cluster
    device: Device
    assignments: tuple[Assignment, ...]
    start_redis: bool
    asked: RunConfig | None = None
    """The config as the user gave it (run id filled, ports and hosts not): what run.resume continues from."""

    def write_configs(self, run_dir: Path, services_cfg: RunConfig | None = None) -> None:
        """config.toml that every service reads, asked.toml that a resumed run starts from, and the run's secret
        (services/common/auth.py; a resumed run keeps its own)."""
        run_dir.mkdir(parents=True, exist_ok=True)
        if self.cfg.run.tls and not self.cfg.run.locked:
            raise ConfigError("run.tls = true needs run.locked = true: TLS would hide calls that anyone may make")
        if self.cfg.run.tls:
            tls.ensure(run_dir)
            tls.load_for_run(run_dir)  # the launcher's own calls go over it too
        elif tls.load(run_dir) is not None:
            raise ConfigError(f"run.tls = false, but {run_dir} holds TLS files: the run was started with run.tls")
        if self.cfg.run.locked:
            auth.ensure_secret(run_dir)
        elif auth.run_secret(run_dir) is not None:
            raise ConfigError(f"run.locked = false, but {run_dir} holds a run secret: the run was started locked")
        else:
            print("warning: run.locked = false: anyone on this host can stop, steer or poison this run",
                  file=sys.stderr, flush=True)  # fmt: skip
        (run_dir / "config.toml").write_text(dump_toml(services_cfg or self.cfg))
        (run_dir / "asked.toml").write_text(dump_toml(self.asked or self.cfg))

    def get(self, service: str) -> Assignment:
        return next(a for a in self.assignments if a.service == service)

    @property
    def services(self) -> tuple[Assignment, ...]:
        """The gRPC services, in start order (Redis left out)."""
        return tuple(a for a in self.assignments if a.service != "redis")

    @property
    def status_url(self) -> str:
        host = "127.0.0.1" if self.cluster.backend == "docker" else self.cfg.coordinator.host
        return f"http://{host}:{self.cfg.coordinator.http_port}/status"
