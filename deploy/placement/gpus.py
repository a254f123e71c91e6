"""GPUs of the trainer ranks and rollout workers: disaggregated over NCCL, or colocated with CUDA IPC."""

from __future__ import annotations

from services.common.config import RunConfig

from .types import Cluster, Device, PlacementError

Gpus = tuple[int, ...] | None


def colocated(cfg: RunConfig) -> bool:
    """With cuda_ipc the rollout workers share the GPU of trainer rank 0, the publisher, and read its buckets by
    handle. Any other transport is disaggregated: an NCCL group cannot hold two ranks on one GPU, so every
    trainer rank and every rollout worker needs its own."""
    return cfg.weightsync.transport == "cuda_ipc"


def assign_gpus(
    cfg: RunConfig, cluster: Cluster, device: Device, trainer_nodes: list[str], rollout_nodes: list[str], per_node: int
) -> dict[str, Gpus]:
    """Trainer ranks on the first GPUs of each of their nodes; then one GPU per rollout worker, on the nodes it
    is spread over round robin, or trainer rank 0's GPU when colocated. () everywhere on CPU."""
    workers = [f"rollout-{i}" for i in range(cfg.rollout.num_workers)]
    if device == "cpu":
        if why := cfg.rollout.gpu_options_error("the placement"):
            raise PlacementError(why)
        return {name: () for name in ["trainer", *workers]}
    used = {node: [per_node, 0] for node in trainer_nodes}  # node -> [trainer GPUs, rollout GPUs]
    out: dict[str, Gpus] = {"trainer": tuple(range(per_node))}
    for i, name in enumerate(workers):
        if colocated(cfg):
            out[name] = (0,)
            continue
        count = used.setdefault(rollout_nodes[i % len(rollout_nodes)], [0, 0])
        out[name] = (sum(count),)
        count[1] += 1
    for node, (num_trainer, num_rollout) in used.items():
        if num_trainer + num_rollout > cluster.gpus_per_node:
            raise PlacementError(_too_many(cfg, cluster, node, num_trainer, num_rollout))
    return out


def _too_many(cfg: RunConfig, cluster: Cluster, node: str, num_trainer: int, num_rollout: int) -> str:
    have = f"but the allocation has {cluster.gpus_per_node} per node"
    if colocated(cfg):
        return (
            f"node {node} needs {num_trainer} GPUs ({num_trainer} trainer ranks; the rollout workers share trainer "
            f"rank 0's GPU) {have}; lower trainer.num_ranks or spread the ranks with placement.trainer_nodes"
        )
    return (
        f"node {node} needs {num_trainer + num_rollout} GPUs ({num_trainer} trainer ranks + {num_rollout} rollout "
        f"workers) {have}; lower trainer.num_ranks or rollout.num_workers, or spread them with "
        "placement.trainer_nodes and placement.rollout_nodes"
    )


def visible_devices(wanted: str, inherited: str | None) -> str:
    """Placement GPU indices are positions in the GPUs the process was given (its CUDA_VISIBLE_DEVICES), if any."""
    if not wanted:
        return ""
    indices = [int(i) for i in wanted.split(",")]
    pool = inherited.split(",") if inherited else [str(i) for i in range(max(indices) + 1)]
    if max(indices) >= len(pool):
        raise ValueError(f"GPU {max(indices)} asked but the step sees only CUDA_VISIBLE_DEVICES={inherited}")
    return ",".join(pool[i] for i in indices)


def gpu_list(gpus: tuple[int, ...]) -> str:
    return ",".join(map(str, gpus))
