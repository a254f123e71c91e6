"""`make up` outside an allocation where Slurm answers: submit the same launch as a batch job."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from pathlib import Path

from services.common.config import RunConfig

from .. import records
from ..placement import Cluster, PlacementError, format_placement, place
from .cluster import answers

JOB_SCRIPT = Path(__file__).with_name("job.sbatch")


def sbatch_command(cfg: RunConfig, run_dir: Path, job_args: list[str]) -> list[str]:
    """Resources from the placement section; the job re-reads the same config, with this run id."""
    p = cfg.placement
    cmd = ["sbatch", "--parsable", f"--job-name=grpo-{cfg.run.run_id}", f"--nodes={p.num_nodes}"]
    if p.gpus_per_node:
        cmd.append(f"--gpus-per-node={p.gpus_per_node}")
    named = sorted({n for n in p.trainer_nodes + p.rollout_nodes if isinstance(n, str)})
    if named:
        cmd.append(f"--nodelist={','.join(named)}")
    # Whole nodes: the services' steps share them (srun --overlap --whole), and the placement picks GPUs itself.
    cmd += ["--exclusive", f"--output={run_dir.resolve()}/slurm-%j.out", f"--chdir={Path.cwd()}"]
    cmd += [f"--export=ALL,GRPO_PYTHON={sys.executable}"]
    return [*cmd, str(JOB_SCRIPT), *job_args, f'run.run_id="{cfg.run.run_id}"']


def detect() -> bool:
    """Slurm is installed here and its controller answers."""
    return answers()


def up(cfg: RunConfig, dry_run: bool, job_args: list[str]) -> int:
    cfg = cfg.model_copy(deep=True)
    cfg.run.run_id = cfg.run.run_id or time.strftime("%Y%m%d-%H%M%S")
    # The nodes are not known before the job starts: check the placement on stand-ins of the asked shape.
    p = cfg.placement
    named = list(dict.fromkeys(n for n in p.trainer_nodes + p.rollout_nodes if isinstance(n, str)))
    if len(named) > p.num_nodes:
        raise PlacementError(f"the placement names {len(named)} nodes but placement.num_nodes = {p.num_nodes}")
    stand_ins = [f"node{i}" for i in range(p.num_nodes - len(named))]
    placement = place(cfg, Cluster("slurm", tuple(named + stand_ins), p.gpus_per_node))
    run_dir = Path(cfg.run.output_dir) / cfg.run.run_id
    cmd = sbatch_command(cfg, run_dir, job_args)
    print(format_placement(placement) + "\n(node names are stand-ins until the job starts; ports are chosen there)")
    print("submit: " + shlex.join(cmd), flush=True)
    if dry_run:
        return 0
    run_dir.mkdir(parents=True, exist_ok=True)
    job_id = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().split(";")[0]
    records.write(cfg.run.output_dir, "sbatch", cfg.run.run_id, job_id=job_id)
    print(f"submitted batch job {job_id}: output in {run_dir}/slurm-{job_id}.out, status URL printed there")
    print(f"stop it with `make down` (or scancel {job_id})")
    return 0


def stop(record: dict, timeout_s: float = 120.0) -> list[str]:
    job_id = record["job_id"]
    if not _job_listed(job_id):
        return []
    subprocess.run(["scancel", job_id], check=True)
    deadline = time.monotonic() + timeout_s
    while _job_listed(job_id):
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} still listed by squeue {timeout_s:.0f}s after scancel")
        time.sleep(0.5)
    return [f"batch job {job_id}"]


def _job_listed(job_id: str) -> bool:
    out = subprocess.run(["squeue", "--noheader", f"--jobs={job_id}", "--format=%T"], capture_output=True, text=True)
    return out.returncode == 0 and bool(out.stdout.strip())
