"""The Slurm allocation `make up` runs in, from Slurm's own environment, and whether Slurm answers at all."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping

from ..placement import Cluster


def allocation(env: Mapping[str, str] = os.environ) -> Cluster:
    """Node names (in Slurm's order) and GPUs per node of the current job."""
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise ValueError("SLURM_JOB_ID is set but SLURM_JOB_NODELIST is not: run `make up` inside salloc or sbatch")
    hostnames = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], check=True, capture_output=True, text=True
    ).stdout.split()
    return Cluster("slurm", tuple(hostnames), gpus_per_node(env))


def gpus_per_node(env: Mapping[str, str]) -> int:
    # SLURM_GPUS_ON_NODE is set however the GPUs were asked for (--gpus, --gres, --gpus-per-node);
    # older Slurm versions only export SLURM_GPUS_PER_NODE, as "4" or "h100:4".
    if env.get("SLURM_GPUS_ON_NODE"):
        return int(env["SLURM_GPUS_ON_NODE"])
    if env.get("SLURM_GPUS_PER_NODE"):
        return int(env["SLURM_GPUS_PER_NODE"].rsplit(":", 1)[-1])
    return 0


def answers(timeout_s: float = 10.0) -> bool:
    """Slurm is installed and its controller answers (sinfo succeeds)."""
    if not shutil.which("sbatch"):
        return False
    try:
        sinfo = subprocess.run(["sinfo", "--noheader", "--format=%P"], capture_output=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return sinfo.returncode == 0
