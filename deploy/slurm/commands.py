"""The srun command line of every service of a plan: one job step each, named after the run."""

from __future__ import annotations

import sys
from pathlib import Path

from ..plan import Placement, Plan


def step_name(run_id: str, service: str) -> str:
    return f"grpo-{run_id}-{service}"


def srun(plan: Plan, p: Placement, config_path: Path, python: str = sys.executable) -> list[str]:
    """`srun` of one service; steps overlap and see the whole allocation, the plan picks their GPUs."""
    nodes = ",".join(p.nodes)
    cmd = ["srun", "--overlap", "--whole", f"--nodes={len(p.nodes)}", f"--ntasks={len(p.nodes)}"]
    cmd += ["--ntasks-per-node=1", f"--nodelist={nodes}", f"--job-name={step_name(plan.cfg.run.run_id, p.service)}"]
    cmd += ["--kill-on-bad-exit=1", "--export=ALL", python, "-m", "deploy.slurm.task"]
    if p.gpus is not None:
        cmd.append(f"--gpus={','.join(map(str, p.gpus))}")
    if p.service == "redis":
        return [*cmd, "--redis", "--", *_redis_args(plan, p, config_path.parent / "redis")]
    return [*cmd, "--", *service_args(plan, p, str(config_path))]


def service_args(plan: Plan, p: Placement, config_path: str) -> list[str]:
    conf = ["--config", config_path]
    if p.service == "weightsync":
        return ["-m", "services.weightsync.main", *conf]
    if p.service == "coordinator":
        return ["-m", "services.coordinator.main", *conf]
    if p.service.startswith("rollout-"):
        index = p.service.removeprefix("rollout-")
        # One config file for all workers; each binds and advertises its own node.
        return ["-m", "services.rollout.main", "--worker-index", index, *conf, f"rollout.host={p.host}"]
    assert p.service == "trainer", p.service
    ranks = f"--nproc-per-node={plan.cfg.trainer.num_ranks // len(p.nodes)}"
    if len(p.nodes) == 1:
        run = ["--standalone", ranks]
    else:
        rdzv = [f"--master-addr={p.nodes[0]}", f"--master-port={plan.cfg.placement.trainer_rdzv_port}"]
        run = [f"--nnodes={len(p.nodes)}", ranks, "--node-rank={node_rank}", *rdzv]
    return ["-m", "torch.distributed.run", *run, "-m", "services.trainer.main", *conf]


def _redis_args(plan: Plan, p: Placement, data_dir: Path) -> list[str]:
    # As services.common.redis_server starts it locally: AOF every second, no RDB snapshots.
    args = ["--port", str(p.ports["redis"]), "--bind", p.host, "--dir", str(data_dir.resolve())]
    return args + ["--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--daemonize", "no"]
