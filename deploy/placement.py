"""Local placement: resolve run id, ports and Redis, then the command line of every service."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from services.common.config import RunConfig
from services.common.ports import free_port, is_free


@dataclass(frozen=True)
class Launch:
    name: str
    args: list[str]


def resolve(cfg: RunConfig) -> RunConfig:
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
        cfg.rollout.grpc_port = _free_range(cfg.rollout.num_workers)
    if not cfg.redis.url:
        if cfg.redis.port == 0:
            cfg.redis.port = free_port()
        cfg.redis.url = f"redis://127.0.0.1:{cfg.redis.port}/0"
    return cfg


def _free_range(n: int) -> int:
    for _ in range(100):
        base = free_port()
        if all(is_free(base + i) for i in range(1, n)):
            return base
    raise RuntimeError(f"no {n} consecutive free ports")


def launches(cfg: RunConfig, config_path: Path) -> list[Launch]:
    """Service command lines; every one gets the same resolved config file."""
    conf = ["--config", str(config_path)]
    out = [Launch("weightsync", ["-m", "services.weightsync.main", *conf])]
    out.append(
        Launch(
            "trainer",
            ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={cfg.trainer.num_ranks}"]
            + ["-m", "services.trainer.main", *conf],
        )
    )
    for i in range(cfg.rollout.num_workers):
        out.append(Launch(f"rollout-{i}", ["-m", "services.rollout.main", "--worker-index", str(i), *conf]))
    out.append(Launch("coordinator", ["-m", "services.coordinator.main", *conf]))
    return out


def gpu_env(cfg: RunConfig, num_gpus: int) -> dict[str, dict[str, str]]:
    """CUDA_VISIBLE_DEVICES per service: trainer ranks on the first GPUs, one GPU per rollout worker after.

    Disaggregated, unless weightsync.transport is cuda_ipc: an NCCL group cannot hold two ranks on one
    GPU, so there every trainer rank and every rollout worker needs its own. With cuda_ipc the rollout
    workers share the GPU of trainer rank 0, the publisher, and read its buckets by handle (colocated).
    """
    if num_gpus == 0:
        return {}
    if cfg.weightsync.transport == "cuda_ipc":
        if cfg.trainer.num_ranks > num_gpus:
            raise ValueError(f"trainer.num_ranks ({cfg.trainer.num_ranks}) GPUs asked, {num_gpus} present")
        env = {"trainer": {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in range(cfg.trainer.num_ranks))}}
        return env | {f"rollout-{i}": {"CUDA_VISIBLE_DEVICES": "0"} for i in range(cfg.rollout.num_workers)}
    need = cfg.trainer.num_ranks + cfg.rollout.num_workers
    if need > num_gpus:
        raise ValueError(
            f"trainer.num_ranks ({cfg.trainer.num_ranks}) + rollout.num_workers ({cfg.rollout.num_workers}) "
            f"= {need} GPUs asked, {num_gpus} present"
        )
    trainer = ",".join(str(g) for g in range(cfg.trainer.num_ranks))
    env = {"trainer": {"CUDA_VISIBLE_DEVICES": trainer}}
    for i in range(cfg.rollout.num_workers):
        env[f"rollout-{i}"] = {"CUDA_VISIBLE_DEVICES": str(cfg.trainer.num_ranks + i)}
    return env
