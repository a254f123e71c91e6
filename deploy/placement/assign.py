"""`place`: node, GPUs, host, ports and threads of every service, checked before any launcher starts one."""

from __future__ import annotations

from pathlib import Path

from services.common.config import RunConfig
from services.common.ports import free_port
from services.common.redis_server import USER, redis_binary

from .gpus import Gpus, assign_gpus
from .nodes import ranks_per_node, split_nodes
from .ports import check_ports, fill_blanks, redis_scheme
from .types import Assignment, Cluster, Device, Placement, PlacementError

# Inside the compose network every service is reached by its service name; Redis keeps its usual port.
DOCKER_REDIS_PORT = 6379
DOCKER_HOSTS = {"coordinator": "0.0.0.0", "trainer": "trainer", "rollout": "rollout", "weightsync": "weightsync"}


def place(cfg: RunConfig, cluster: Cluster) -> Placement:
    """Assign every service its node, GPUs, host and ports; raise PlacementError for one that cannot run."""
    if not cluster.nodes:
        raise PlacementError("the allocation has no nodes")
    device = _device(cfg, cluster)
    trainer_nodes, rollout_nodes = split_nodes(cfg, cluster.nodes)
    per_node = ranks_per_node(cfg, trainer_nodes)
    _check_model(cfg)
    start_redis = not cfg.redis.url
    if start_redis and cfg.run.tls and cluster.backend != "docker":  # compose's Redis: on the project's network only
        try:
            redis_binary(need_tls=True)
        except ValueError as e:
            raise PlacementError(str(e)) from None
    asked, cfg = cfg, fill_blanks(cfg)
    asked = asked.model_copy(update={"run": asked.run.model_copy(update={"run_id": cfg.run.run_id})})
    if len(trainer_nodes) > 1 and not cfg.placement.trainer_rdzv_port:
        cfg.placement.trainer_rdzv_port = free_port()
    _set_hosts(cfg, cluster, trainer_nodes, rollout_nodes, start_redis)
    gpus = assign_gpus(cfg, cluster, device, trainer_nodes, rollout_nodes, per_node)
    assignments = _assignments(cfg, cluster, trainer_nodes, rollout_nodes, gpus, start_redis)
    check_ports(assignments, cluster.backend)
    return Placement(cfg, cluster, device, tuple(assignments), start_redis, asked)


def threads(cfg: RunConfig, service: str) -> int:
    """OMP threads of a service's processes: the trainer's and rollout workers' are configured, the rest use one."""
    if service == "trainer":
        return cfg.trainer.num_threads
    return cfg.rollout.num_threads if service.startswith("rollout") else 1


def _device(cfg: RunConfig, cluster: Cluster) -> Device:
    if cfg.placement.device == "cuda" and cluster.gpus_per_node == 0:
        raise PlacementError(
            f"placement.device = 'cuda' but the {cluster.backend} allocation has no GPUs; "
            "ask for GPUs (placement.gpus_per_node, or --gpus-per-node on salloc) or set placement.device = 'cpu'"
        )
    if cfg.placement.device == "auto":
        return "cuda" if cluster.gpus_per_node else "cpu"
    return cfg.placement.device


def _check_model(cfg: RunConfig) -> None:
    if not cfg.model.create and not (Path(cfg.model.path) / "config.json").is_file():
        raise PlacementError(
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
            cfg.redis.url = f"{redis_scheme(cfg)}://{USER}@{head}:{cfg.redis.port}/0"
    elif cluster.backend == "docker":
        for section, host in DOCKER_HOSTS.items():
            getattr(cfg, section).host = host
        cfg.weightsync.ucxx_host = DOCKER_HOSTS["trainer"]
        if start_redis:
            cfg.redis.port = DOCKER_REDIS_PORT
            cfg.redis.url = f"redis://{USER}@redis:{DOCKER_REDIS_PORT}/0"


def _assignments(
    cfg: RunConfig,
    cluster: Cluster,
    trainer: list[str],
    rollout: list[str],
    gpus: dict[str, Gpus],
    start_redis: bool,
) -> list[Assignment]:
    """In start order: Redis (when started here), weightsync, trainer, rollout workers, coordinator."""
    head = cluster.nodes[0]
    # In a CPU run every service hides the GPUs: weightsync picks NCCL whenever it sees one.
    base = () if gpus["trainer"] == () else None
    out = []
    if start_redis:
        host = {"slurm": head, "docker": "redis"}.get(cluster.backend, "127.0.0.1")
        out.append(Assignment("redis", (head,), host, None, {"redis": cfg.redis.port}))
    ws, co = cfg.weightsync, cfg.coordinator
    out.append(Assignment("weightsync", (head,), ws.host, base, {"grpc": ws.grpc_port, "store": ws.store_port}))
    out.append(_trainer(cfg, trainer, gpus["trainer"]))
    out += _rollout_workers(cfg, cluster, rollout, gpus)
    out.append(Assignment("coordinator", (head,), co.host, base, {"grpc": co.grpc_port, "http": co.http_port}))
    return out


def _trainer(cfg: RunConfig, nodes: list[str], gpus: Gpus) -> Assignment:
    ports = {"grpc": cfg.trainer.grpc_port}
    if len(nodes) > 1:
        ports["rdzv"] = cfg.placement.trainer_rdzv_port
    return Assignment("trainer", tuple(nodes), cfg.trainer.host, gpus, ports, threads(cfg, "trainer"))


def _rollout_workers(cfg: RunConfig, cluster: Cluster, nodes: list[str], gpus: dict[str, Gpus]) -> list[Assignment]:
    """Round robin over their nodes; each worker on the next port of the range."""
    out = []
    for i in range(cfg.rollout.num_workers):
        node, name = nodes[i % len(nodes)], f"rollout-{i}"
        host = node if cluster.backend == "slurm" else cfg.rollout.host
        out.append(Assignment(name, (node,), host, gpus[name], {"grpc": cfg.rollout.grpc_port + i}, threads(cfg, name)))
    return out
