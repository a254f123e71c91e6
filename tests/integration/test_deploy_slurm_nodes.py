"""`make up` / `make down` across a real three-node Slurm cluster (deploy/slurm/testcluster.py: slurmctld and three
slurmd, each node in its own network and UTS namespace with its own address and hostname), submitted from the
cluster's login node as a user would."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from deploy.slurm import testcluster

pytestmark = pytest.mark.skipif(
    shutil.which("slurmctld") is None or os.geteuid() != 0,
    reason="needs root and slurm-wlm + munge (.ci/run installs them before make test)",
)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cluster")
    c = testcluster.up(folder, num_nodes=3)
    yield c
    stray = subprocess.Popen(c.command("node2", "sleep", "600"), start_new_session=True)  # as a job step would
    time.sleep(1)
    testcluster.down(folder)
    assert stray.wait(timeout=10) == -signal.SIGKILL, "a process left running in a node's network"
    assert not [ns for ns in os.listdir("/run/netns") if ns.startswith(c.tag)], "namespaces left behind"


def _make(c: testcluster.TestCluster, target: str, *args: str) -> str:
    done = c.run("ctl", "make", "-s", "-C", str(REPO), target, f"ARGS={' '.join(args)}", timeout_s=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _submit(c, out_dir: Path, run_id: str, model: Path, *overrides: str) -> str:
    args = [f"run.output_dir={out_dir}", f"run.run_id={run_id}", f"model.path={model}", "model.create=true"]
    args += ["rollout.engine=hf", "coordinator.num_prompts=4", "coordinator.num_samples=4", "placement.num_nodes=3"]
    out = _make(c, "up", *args, *overrides)
    assert "backend: sbatch" in out
    return re.search(r"submitted batch job (\d+)", out).group(1)


def _wait_for(predicate, timeout_s: float, what: str, details=lambda: "") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what} within {timeout_s:.0f}s{details()}"
        time.sleep(0.3)


def _job_listed(c, job_id: str) -> bool:
    return bool(c.run("ctl", "squeue", "--noheader", f"--jobs={job_id}").stdout.strip())


def _ours(c: testcluster.TestCluster, run_dir: Path) -> dict[int, str]:
    """Live processes whose command line names run_dir: pid -> the cluster host whose network they are in."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
            net = os.stat(f"/proc/{pid}/ns/net").st_ino
        except OSError:
            continue
        if str(run_dir) in cmdline and state != "Z" and int(pid) != os.getpid():
            found[int(pid)] = next((h for h, ino in _netns(c).items() if ino == net), "the machine") + " " + cmdline
    return found


def _netns(c: testcluster.TestCluster) -> dict[str, int]:
    """This cluster's hosts -> their network namespace's inode (never another cluster's namespaces of one name)."""
    return {host: os.stat(f"/run/netns/{c.netns(host)}").st_ino for host in ("ctl", *c.nodes)}


def _diagnostics(run_dir: Path) -> str:
    text = ""
    for log in sorted(run_dir.glob("slurm-*.out")) + sorted((run_dir / "logs").glob("*.log")):
        text += f"\n== {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-25:])
    return text


def test_a_batch_job_spans_three_nodes_to_the_end_and_leaves_nothing(cluster, tmp_path):
    """Redis, weightsync, the coordinator and the rollout worker on node1, the two trainer ranks on node2 and
    node3 (gloo across nodes, the ranks' store on node2's address): every step, then `make down` finds nothing."""
    out_dir, run_dir = tmp_path / "runs", tmp_path / "runs" / "span"
    job_id = _submit(cluster, out_dir, "span", tmp_path / "tiny", "run.num_steps=2", "trainer.num_ranks=2",
                     "placement.trainer_nodes=[1,2]")  # fmt: skip
    _wait_for(lambda: not _job_listed(cluster, job_id), 600, "job did not end", lambda: _diagnostics(run_dir))

    job_out = (run_dir / f"slurm-{job_id}.out").read_text()
    assert "ended: RUN_STATE_DONE after 2 steps" in job_out, _diagnostics(run_dir)
    assert re.search(r"trainer\s+node2,node3\s+node2\s", job_out) and re.search(r"coordinator\s+node1\s", job_out)
    assert re.search(r"status: http://node1:\d+/status", job_out)
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert 'host = "node2"' in (run_dir / "config.toml").read_text()  # every address by hostname
    _make(cluster, "down", f"run.output_dir={out_dir}")
    assert not list((out_dir / ".up").glob("*.json")) and not _ours(cluster, run_dir)


def test_a_worker_killed_on_its_node_is_restarted_there_and_make_down_stops_every_node(cluster, tmp_path):
    out_dir, run_dir = tmp_path / "runs", tmp_path / "runs" / "heal"
    job_id = _submit(cluster, out_dir, "heal", tmp_path / "tiny", "run.num_steps=1000", "trainer.num_ranks=1",
                     "placement.trainer_nodes=[1]", "placement.rollout_nodes=[2]")  # fmt: skip
    metrics = run_dir / "metrics.jsonl"
    _wait_for(lambda: metrics.exists() and metrics.read_text(), 300, "no step", lambda: _diagnostics(run_dir))

    def worker() -> list[tuple[int, str]]:
        return [(pid, where) for pid, where in _ours(cluster, run_dir).items()
                if "-m services.rollout.main" in where and "srun" not in where]  # fmt: skip

    [(pid, where)] = worker()
    assert where.startswith("node3 ")
    os.kill(pid, 9)
    done = len(metrics.read_text().splitlines())
    _wait_for(lambda: "restarted by the launcher" in (run_dir / "logs" / "rollout-0.log").read_text(), 60,
              "worker not restarted", lambda: _diagnostics(run_dir))  # fmt: skip
    _wait_for(lambda: len(metrics.read_text().splitlines()) > done + 1, 300, "no step after the restart",
              lambda: _diagnostics(run_dir))  # fmt: skip
    [(new, where)] = worker()
    assert new != pid and where.startswith("node3 ")
    assert {where.split()[0] for where in _ours(cluster, run_dir).values()} >= {"node1", "node2", "node3"}

    down = _make(cluster, "down", f"run.output_dir={out_dir}")
    assert "stopping run heal (slurm)" in down
    assert not _job_listed(cluster, job_id)
    _wait_for(lambda: not _ours(cluster, run_dir), 10, "processes left on the nodes after make down",
              lambda: f": {_ours(cluster, run_dir)}")  # fmt: skip


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "run.tls"])
def test_make_up_inside_salloc_drives_the_nodes_from_the_login_node(cluster, tmp_path, tls):
    """`salloc -N3 make up`: the launcher runs on the login node and starts each service as a job step on its node.
    With run.tls every gRPC call across the nodes, and Redis on node1's address, speak mutual TLS."""
    if tls and not shutil.which("redis-server"):
        pytest.skip("run.tls needs a redis-server built with TLS on PATH (apt install redis-server)")
    out_dir, run_dir = tmp_path / "runs", tmp_path / "runs" / "alloc"
    args = [f"run.output_dir={out_dir}", "run.run_id=alloc", f"model.path={tmp_path / 'tiny'}", "model.create=true"]
    args += ["rollout.engine=hf", "coordinator.num_prompts=4", "coordinator.num_samples=4", "run.num_steps=2"]
    args += ["trainer.num_ranks=2", "placement.trainer_nodes=[1,2]", f"run.tls={str(tls).lower()}"]
    done = cluster.run("ctl", "salloc", "-N3", "make", "-s", "-C", str(REPO), "up", f"ARGS={' '.join(args)}",
                       timeout_s=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:] + _diagnostics(run_dir)
    assert "backend: slurm" in done.stdout and "ended: RUN_STATE_DONE after 2 steps" in done.stdout
    assert re.search(r"trainer\s+node2,node3\s+node2\s", done.stdout)
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert not _ours(cluster, run_dir)
    redis_conf = (run_dir / "redis" / "redis.conf").read_text()
    assert ("tls-auth-clients yes" in redis_conf) == tls and "bind node1" in redis_conf
