"""Ports: the free ones a config leaves to launch time, and clashes between services on one node."""

from __future__ import annotations

import time

from services.common.config import RunConfig
from services.common.ports import free_port, free_range, is_free
from services.common.redis_server import USER

from .types import Assignment, Backend, PlacementError


def fill_blanks(cfg: RunConfig) -> RunConfig:
    """A copy with every 0 port replaced by a free one, a run id, and the Redis URL."""
    cfg = cfg.model_copy(deep=True)
    if not cfg.run.run_id:
        cfg.run.run_id = time.strftime("%Y%m%d-%H%M%S")
    for section in (cfg.coordinator, cfg.trainer, cfg.weightsync):
        if section.grpc_port == 0:
            section.grpc_port = free_port()
    if cfg.coordinator.http_port == 0:
        cfg.coordinator.http_port = free_port()
    if cfg.weightsync.store_port == 0:
        cfg.weightsync.store_port = free_port()
    if cfg.rollout.grpc_port == 0:
        cfg.rollout.grpc_port = free_range(cfg.rollout.num_workers)
    if not cfg.redis.url:
        if cfg.redis.port == 0:
            cfg.redis.port = free_port()
        cfg.redis.url = f"{redis_scheme(cfg)}://{USER}@127.0.0.1:{cfg.redis.port}/0"
    return cfg


def redis_scheme(cfg: RunConfig) -> str:
    """The run's own Redis speaks TLS alone under run.tls (services/common/redis_server.py), as its URL says."""
    return "rediss" if cfg.run.tls else "redis"


def check_ports(assignments: list[Assignment], backend: Backend) -> None:
    # Docker: every container has its own network namespace, so only ports within one service can clash.
    taken: dict[tuple[str, int], str] = {}
    for a in assignments:
        for node in a.nodes:
            scope = a.service if backend == "docker" else node
            for name, port in a.ports.items():
                other = taken.setdefault((scope, port), f"{a.service} ({name})")
                if other != f"{a.service} ({name})":
                    raise PlacementError(f"port {port} on {node} is asked for by both {other} and {a.service} ({name})")
                if backend == "local" and port and not is_free(port):  # other hosts' ports are theirs to check
                    raise PlacementError(f"port {port} of {a.service} ({name}) is in use on this machine")
