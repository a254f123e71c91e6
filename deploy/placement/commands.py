"""What runs for each assigned service, whatever starts it: its command line and its environment."""

from __future__ import annotations

from collections.abc import Mapping

from .gpus import gpu_list, visible_devices
from .types import Assignment, Placement


def service_args(placement: Placement, a: Assignment, config_path: str) -> list[str]:
    """`python` arguments of a service; every one reads the same config file."""
    conf = ["--config", config_path]
    if a.service == "weightsync":
        return ["-m", "services.weightsync.main", *conf]
    if a.service == "coordinator":
        return ["-m", "services.coordinator.main", *conf]
    if a.service.startswith("rollout-"):
        index = a.service.removeprefix("rollout-")
        # One config file for all workers; each binds and advertises its own node.
        return ["-m", "services.rollout.main", "--worker-index", index, *conf, f"rollout.host={a.host}"]
    assert a.service == "trainer", a.service
    # torchrun's environment for the ranks, with their store on the trainer's address alone (deploy/ranks.py).
    ranks = ["-m", "deploy.ranks", f"--nproc-per-node={placement.cfg.trainer.num_ranks // len(a.nodes)}"]
    if len(a.nodes) == 1:
        return [*ranks, f"--host={a.host}", "--", "-m", "services.trainer.main", *conf]
    # {node_rank}: filled in by each task of the step (deploy/slurm/task.py); node 0 hosts the store.
    nodes = [f"--nnodes={len(a.nodes)}", "--node-rank={node_rank}"]
    master = [f"--host={a.nodes[0]}", f"--port={placement.cfg.placement.trainer_rdzv_port}"]
    return [*ranks, *nodes, *master, "--", "-m", "services.trainer.main", *conf]


def service_env(a: Assignment, inherited: Mapping[str, str]) -> dict[str, str]:
    """OMP threads and, where the assignment picks GPUs, CUDA_VISIBLE_DEVICES within what the process inherits."""
    env = {"OMP_NUM_THREADS": str(a.threads)}
    if a.gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible_devices(gpu_list(a.gpus), inherited.get("CUDA_VISIBLE_DEVICES"))
    return env
