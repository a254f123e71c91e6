"""The placement plan of `make up`: node, GPUs, host and ports of every service, checked before launch."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from services.common.config import RunConfig
from services.common.ports import free_port

from .placement import resolve

Backend = Literal["local", "slurm", "docker"]
# Inside the compose network every service is reached by its service name; Redis keeps its usual port.
DOCKER_REDIS_PORT = 6379
DOCKER_HOSTS = {"coordinator": "0.0.0.0", "trainer": "trainer", "rollout": "rollout", "weightsync": "weightsync"}


class PlanError(ValueError):
    """A placement that cannot run; the message says what to change."""


@dataclass(frozen=True)
class Cluster:
    """What `make up` may use: node names in allocation order and the GPUs of each node."""

    backend: Backend
    nodes: tuple[str, ...]
    gpus_per_node: int


@dataclass(frozen=True)
class Placement:
    service: str
    nodes: tuple[str, ...]
    host: str
    """Address the service binds and the others reach it at."""
    gpus: tuple[int, ...] | None = None
    """GPU indices on each of its nodes; () = hide every GPU (CPU run); None = leave CUDA's view as it is."""
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.ports['grpc']}"


@dataclass(frozen=True)
class Plan:
    cfg: RunConfig
    """The config every service reads: ports, hosts and Redis URL filled in."""
    cluster: Cluster
    device: Literal["cpu", "cuda"]
    placements: tuple[Placement, ...]
    start_redis: bool

    def get(self, service: str) -> Placement:
        return next(p for p in self.placements if p.service == service)

    @property
    def status_url(self) -> str:
        host = "127.0.0.1" if self.cluster.backend == "docker" else self.cfg.coordinator.host
        return f"http://{host}:{self.cfg.coordinator.http_port}/status"


def place(cfg: RunConfig, cluster: Cluster) -> Plan:
    """Assign every service its node, GPUs, host and ports; raise PlanError for a plan that cannot run."""
    if not cluster.nodes:
        raise PlanError("the allocation has no nodes")
    device = _device(cfg, cluster)
    trainer_nodes, rollout_nodes = split_nodes(cfg, cluster.nodes)
    ranks_per_node = _ranks_per_node(cfg, trainer_nodes)
    _check_model(cfg)
    start_redis = not cfg.redis.url
    cfg = resolve(cfg)
    if len(trainer_nodes) > 1 and not cfg.placement.trainer_rdzv_port:
        cfg.placement.trainer_rdzv_port = free_port()
    _set_hosts(cfg, cluster, trainer_nodes, rollout_nodes, start_redis)
    gpus = _assign_gpus(cfg, cluster, device, trainer_nodes, rollout_nodes, ranks_per_node)
    placements = _placements(cfg, cluster, trainer_nodes, rollout_nodes, gpus, start_redis)
    _check_ports(placements, cluster.backend)
    return Plan(cfg, cluster, device, tuple(placements), start_redis)


def _device(cfg: RunConfig, cluster: Cluster) -> Literal["cpu", "cuda"]:
    if cfg.placement.device == "cuda" and cluster.gpus_per_node == 0:
        raise PlanError(
            f"placement.device = 'cuda' but the {cluster.backend} allocation has no GPUs; "
            "ask for GPUs (placement.gpus_per_node, or --gpus-per-node on salloc) or set placement.device = 'cpu'"
        )
    if cfg.placement.device == "auto":
        return "cuda" if cluster.gpus_per_node else "cpu"
    return cfg.placement.device


def split_nodes(cfg: RunConfig, nodes: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """Trainer and rollout nodes as the placement section names them; one left empty gets the nodes the
    other does not use (all nodes if none is left); both empty = first half trainer, second half rollout."""
    trainer = _named(cfg.placement.trainer_nodes, nodes, "placement.trainer_nodes")
    rollout = _named(cfg.placement.rollout_nodes, nodes, "placement.rollout_nodes")
    if not trainer and not rollout:
        half = max(1, len(nodes) // 2)
        return list(nodes[:half]), list(nodes[half:]) or list(nodes)
    if not trainer:
        trainer = [n for n in nodes if n not in rollout] or list(nodes)
    if not rollout:
        rollout = [n for n in nodes if n not in trainer] or list(nodes)
    # Allocation order: Slurm gives node rank 0 of a multi-node step to the first of its nodes in that order.
    return [n for n in nodes if n in trainer], [n for n in nodes if n in rollout]


def _named(entries: list[str | int], nodes: tuple[str, ...], key: str) -> list[str]:
    out = []
    for entry in entries:
        if isinstance(entry, int):
            if not 0 <= entry < len(nodes):
                raise PlanError(f"{key}: index {entry} is outside the allocation's {len(nodes)} nodes")
            entry = nodes[entry]
        elif entry not in nodes:
            raise PlanError(f"{key}: node {entry!r} is not in the allocation ({', '.join(nodes)})")
        if entry in out:
            raise PlanError(f"{key}: node {entry!r} is listed twice")
        out.append(entry)
    return out


def _ranks_per_node(cfg: RunConfig, trainer_nodes: list[str]) -> int:
    # torchrun starts the same number of ranks on every node it spans.
    num_ranks, num_nodes = cfg.trainer.num_ranks, len(trainer_nodes)
    if num_ranks % num_nodes:
        raise PlanError(f"trainer.num_ranks = {num_ranks} does not split evenly over {num_nodes} trainer nodes")
    return num_ranks // num_nodes


def _check_model(cfg: RunConfig) -> None:
    if not cfg.model.create and not (Path(cfg.model.path) / "config.json").is_file():
        raise PlanError(
            f"model.path = {cfg.model.path!r} holds no HF model (no config.json) and model.create = false; "
            "point model.path at a model directory every node can read, or set model.create = true"
        )


def _set_hosts(cfg: RunConfig, cluster: Cluster, trainer: list[str], rollout: list[str], start_redis: bool) -> None:
    """Every host a service binds must be reachable from the others: its node's name on Slurm."""
    if cluster.backend == "slurm":
        head = cluster.nodes[0]
        cfg.coordinator.host, cfg.weightsync.host = head, head
        cfg.trainer.host, cfg.weightsync.ucxx_host, cfg.rollout.host = trainer[0], trainer[0], rollout[0]
        if start_redis:
            cfg.redis.url = f"redis://{head}:{cfg.redis.port}/0"
    elif cluster.backend == "docker":
        for section, host in DOCKER_HOSTS.items():
            getattr(cfg, section).host = host
        cfg.weightsync.ucxx_host = DOCKER_HOSTS["trainer"]
        if start_redis:
            cfg.redis.port = DOCKER_REDIS_PORT
            cfg.redis.url = f"redis://redis:{DOCKER_REDIS_PORT}/0"


def _assign_gpus(
    cfg: RunConfig,
    cluster: Cluster,
    device: str,
    trainer: list[str],
    rollout: list[str],
    ranks_per_node: int,
) -> dict[str, tuple[int, ...] | None]:
    """One GPU per trainer rank (the first ones of each node), then one per rollout worker.

    Disaggregated only, as in `make run`: an NCCL group cannot hold two ranks on one GPU.
    """
    names = ["trainer"] + [f"rollout-{i}" for i in range(cfg.rollout.num_workers)]
    if device == "cpu":
        return {name: () for name in names}
    used: dict[str, list[int]] = {}  # node -> [trainer GPUs, rollout GPUs]
    for node in trainer:
        used.setdefault(node, [0, 0])[0] = ranks_per_node
    out: dict[str, tuple[int, ...] | None] = {"trainer": tuple(range(ranks_per_node))}
    for i in range(cfg.rollout.num_workers):
        count = used.setdefault(rollout[i % len(rollout)], [0, 0])
        out[f"rollout-{i}"] = (sum(count),)
        count[1] += 1
    for node, (num_trainer, num_rollout) in used.items():
        if num_trainer + num_rollout > cluster.gpus_per_node:
            raise PlanError(
                f"node {node} needs {num_trainer + num_rollout} GPUs ({num_trainer} trainer ranks + "
                f"{num_rollout} rollout workers) but the allocation has {cluster.gpus_per_node} per node; "
                "lower trainer.num_ranks or rollout.num_workers, or spread them with placement.trainer_nodes "
                "and placement.rollout_nodes"
            )
    return out


def _placements(
    cfg: RunConfig,
    cluster: Cluster,
    trainer: list[str],
    rollout: list[str],
    gpus: dict[str, tuple[int, ...] | None],
    start_redis: bool,
) -> list[Placement]:
    head = cluster.nodes[0]
    # In a CPU run every service hides the GPUs: weightsync picks NCCL whenever it sees one.
    base = () if gpus["trainer"] == () else None
    out = []
    if start_redis:
        host = {"slurm": head, "docker": "redis"}.get(cluster.backend, "127.0.0.1")
        out.append(Placement("redis", (head,), host, None, {"redis": cfg.redis.port}))
    ws, co = cfg.weightsync, cfg.coordinator
    out.append(Placement("weightsync", (head,), ws.host, base, {"grpc": ws.grpc_port, "store": ws.store_port}))
    trainer_ports = {"grpc": cfg.trainer.grpc_port}
    if len(trainer) > 1:
        trainer_ports["rdzv"] = cfg.placement.trainer_rdzv_port
    out.append(Placement("trainer", tuple(trainer), cfg.trainer.host, gpus["trainer"], trainer_ports))
    for i in range(cfg.rollout.num_workers):
        node = rollout[i % len(rollout)]
        host = node if cluster.backend == "slurm" else cfg.rollout.host
        port = {"grpc": cfg.rollout.grpc_port + i}
        out.append(Placement(f"rollout-{i}", (node,), host, gpus[f"rollout-{i}"], port))
    out.append(Placement("coordinator", (head,), co.host, base, {"grpc": co.grpc_port, "http": co.http_port}))
    return out


def _check_ports(placements: list[Placement], backend: Backend) -> None:
    # Docker: every container has its own network namespace, so only ports within one service can clash.
    taken: dict[tuple[str, int], str] = {}
    for p in placements:
        for node in p.nodes:
            scope = p.service if backend == "docker" else node
            for name, port in p.ports.items():
                other = taken.setdefault((scope, port), f"{p.service} ({name})")
                if other != f"{p.service} ({name})":
                    raise PlanError(f"port {port} on {node} is asked for by both {other} and {p.service} ({name})")


def format_plan(plan: Plan) -> str:
    """The plan as a table a user can check before anything starts."""
    c = plan.cluster
    lines = [
        f"plan of run {plan.cfg.run.run_id}: {c.backend}, {len(c.nodes)} node(s), "
        f"{c.gpus_per_node} GPU(s) per node, device {plan.device}",
        f"  {'service':<12} {'node(s)':<24} {'host':<20} {'GPUs':<10} ports",
    ]
    for p in plan.placements:
        gpus = "-" if not p.gpus else ",".join(map(str, p.gpus))
        ports = ", ".join(f"{name} {port}" for name, port in p.ports.items())
        lines.append(f"  {p.service:<12} {','.join(p.nodes):<24} {p.host:<20} {gpus:<10} {ports}")
    redis = plan.cfg.redis.url + ("" if plan.start_redis else " (external)")
    lines += [f"redis: {redis}", f"status: {plan.status_url}"]
    return "\n".join(lines)
