"""The srun command line of every assigned service: one job step each, named after the run."""

from __future__ import annotations

import sys
from pathlib import Path

from ..placement import Assignment, Placement
from ..placement.commands import service_args
from ..placement.gpus import gpu_list


def step_name(run_id: str, service: str) -> str:
    return f"grpo-{run_id}-{service}"


def srun(placement: Placement, a: Assignment, config_path: Path, python: str = sys.executable) -> list[str]:
    """`srun` of one service; steps overlap and see the whole allocation, the placement picks their GPUs."""
    nodes = ",".join(a.nodes)
    cmd = ["srun", "--overlap", "--whole", f"--nodes={len(a.nodes)}", f"--ntasks={len(a.nodes)}"]
    cmd += [
        "--ntasks-per-node=1",
        f"--nodelist={nodes}",
        f"--job-name={step_name(placement.cfg.run.run_id, a.service)}",
    ]
    cmd += ["--kill-on-bad-exit=1", "--export=ALL", python, "-m", "deploy.slurm.task"]
    if a.gpus is not None:
        cmd.append(f"--gpus={gpu_list(a.gpus)}")
    if a.service == "redis":
        return [*cmd, "--redis", "--", *_redis_args(a, config_path.parent / "redis", placement.cfg.run.tls)]
    return [*cmd, "--", *service_args(placement, a, str(config_path))]


def _redis_args(a: Assignment, data_dir: Path, on_tls: bool) -> list[str]:
    """As services.common.redis_server starts it locally (its settings file, locked with the run's secret, on TLS
    under run.tls), bound to the head node's address."""
    from services.common import auth, tls
    from services.common.redis_server import write_conf

    run_dir = data_dir.parent.resolve()
    tls_dir = run_dir / tls.DIR_NAME if on_tls else None
    return [str(write_conf(a.ports["redis"], a.host, data_dir, auth.run_secret(run_dir), tls_dir).resolve())]
