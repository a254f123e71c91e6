"""`make up DRY_RUN=1`: the config is checked and the plan printed for each backend; nothing starts."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Enough of a slurm.conf for `scontrol show hostnames`, which reads one before expanding a node list.
MINIMAL_SLURM_CONF = "ClusterName=x\nSlurmctldHost=localhost\nNodeName=localhost CPUs=1\nPartitionName=p Nodes=ALL\n"


def _dry_run(tmp_path: Path, backend: str, *args: str, env: dict[str, str] | None = None):
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    cmd = ["make", "-s", "up", "DRY_RUN=1", f"BACKEND={backend}", f"ARGS=run.output_dir={tmp_path} {' '.join(args)}"]
    out = subprocess.run(cmd, cwd=REPO, env={**base, **(env or {})}, capture_output=True, text=True, timeout=120)
    # A dry run leaves no trace: no run folder, no launch record, so nothing was started.
    assert not list(tmp_path.iterdir())
    return out


def _rows(stdout: str) -> dict[str, list[str]]:
    """service -> [node(s), host, GPUs, ports...] from the printed plan."""
    rows = [line.split() for line in stdout.splitlines() if line.startswith("  ")]
    return {row[0]: row[1:] for row in rows if row[0] != "service"}


def test_local_plan(tmp_path):
    out = _dry_run(tmp_path, "local", "run.run_id=dry")
    assert out.returncode == 0, out.stderr
    rows = _rows(out.stdout)
    assert set(rows) == {"redis", "weightsync", "trainer", "rollout-0", "coordinator"}
    assert rows["coordinator"][1] == "127.0.0.1"
    assert "redis: redis://grpo@127.0.0.1:" in out.stdout and "status: http://127.0.0.1:" in out.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["model.create=false", "model.path=/nonexistent/model"], "model.path = '/nonexistent/model' holds no HF"),
        (["coordinator.grpc_port=25001", "trainer.grpc_port=25001"], "port 25001 on"),
        (["placement.device=cuda"], "placement.device = 'cuda' but the local allocation has no GPUs"),
        (["trainer.num_rank=2"], "trainer.num_rank: Extra inputs are not permitted"),
    ],
)
def test_impossible_local_plan_fails_with_one_line(tmp_path, args, message):
    out = _dry_run(tmp_path, "local", *args)
    assert out.returncode != 0
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], out.stderr
    assert "plan of run" not in out.stdout


def test_batch_submission_plan_prints_the_sbatch_command(tmp_path):
    out = _dry_run(
        tmp_path,
        "sbatch",
        "run.run_id=sub",
        "placement.num_nodes=2",
        "placement.gpus_per_node=8",
        "trainer.num_ranks=8",
        "rollout.num_workers=8",
    )
    assert out.returncode == 0, out.stderr
    submit = next(line for line in out.stdout.splitlines() if line.startswith("submit: sbatch"))
    assert "--nodes=2" in submit and "--gpus-per-node=8" in submit and "--job-name=grpo-sub" in submit
    assert "deploy/slurm/job.sbatch" in submit and 'run.run_id="sub"' in submit
    assert _rows(out.stdout)["trainer"][:3] == ["node0", "node0", "0,1,2,3,4,5,6,7"]


def test_docker_plan_prints_the_compose_command(tmp_path):
    out = _dry_run(tmp_path, "docker", "run.run_id=dock", "trainer.num_ranks=1")
    assert out.returncode == 0, out.stderr
    assert "docker compose --project-name grpo-dock -f" in out.stdout and "GRPO_BIND=127.0.0.1" in out.stdout
    assert _rows(out.stdout)["trainer"][1] == "trainer"


@pytest.fixture
def allocation(tmp_path_factory):
    """The environment of a 4-node job with 4 GPUs per node, as Slurm sets it."""
    if shutil.which("scontrol") is None:
        pytest.skip("scontrol not installed: apt-get install slurm-wlm (.ci/run does it before make test)")
    conf = tmp_path_factory.mktemp("conf") / "slurm.conf"
    conf.write_text(MINIMAL_SLURM_CONF)
    return {
        "SLURM_CONF": str(conf),
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": "gpu[01-04]",
        "SLURM_GPUS_ON_NODE": "4",
    }


def test_plan_inside_an_allocation(tmp_path, allocation):
    args = ["run.run_id=alloc", "trainer.num_ranks=4", "rollout.num_workers=4"]
    out = _dry_run(tmp_path, "slurm", *args, env=allocation)
    assert out.returncode == 0, out.stderr
    rows = _rows(out.stdout)
    assert rows["trainer"][:3] == ["gpu01,gpu02", "gpu01", "0,1"]
    assert [rows[f"rollout-{i}"][:3] for i in range(4)] == [
        ["gpu03", "gpu03", "0"],
        ["gpu04", "gpu04", "0"],
        ["gpu03", "gpu03", "1"],
        ["gpu04", "gpu04", "1"],
    ]
    assert rows["redis"][0] == rows["coordinator"][0] == "gpu01"
    assert "redis: redis://grpo@gpu01:" in out.stdout and "status: http://gpu01:" in out.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["placement.trainer_nodes=[0]", "trainer.num_ranks=8"], "node gpu01 needs 8 GPUs (8 trainer ranks"),
        (
            ["placement.rollout_nodes='[\"gpu09\"]'"],
            "node 'gpu09' is not in the allocation (gpu01, gpu02, gpu03, gpu04)",
        ),
    ],
)
def test_impossible_plan_inside_an_allocation(tmp_path, allocation, args, message):
    out = _dry_run(tmp_path, "slurm", *args, env=allocation)
    assert out.returncode != 0 and message in out.stderr, out.stderr


def test_allocation_without_gpus_cannot_run_cuda(tmp_path, allocation):
    del allocation["SLURM_GPUS_ON_NODE"]
    out = _dry_run(tmp_path, "slurm", "placement.device=cuda", env=allocation)
    assert out.returncode != 0 and "the slurm allocation has no GPUs" in out.stderr, out.stderr
