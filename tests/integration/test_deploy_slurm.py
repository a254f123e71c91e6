"""`make up` / `make down` against a real single-node Slurm (slurm-wlm + munge, daemons started here)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from deploy.ranks import launches_ranks
from services.common.ports import free_port

pytestmark = pytest.mark.skipif(
    shutil.which("slurmctld") is None,
    reason="slurmctld not installed: apt-get install slurm-wlm munge (.ci/run does it before make test)",
)
REPO = Path(__file__).resolve().parents[2]

# From notes/deps_transport.md section 4: no cgroup plugins, our own ports, sockets and state, and
# config_overrides so the node's declared CPUs and memory need not match the machine.
SLURM_CONF = """\
ClusterName=grpotest
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={dir}/munge.sock
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
NodeName=localhost NodeAddr=127.0.0.1 CPUs=2 RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""


def _wait_for(predicate, timeout_s: float, what: str, details=lambda: "") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what} within {timeout_s:.0f}s{details()}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def slurm_env(tmp_path_factory):
    """Environment of a running single-node cluster: munged, slurmctld, slurmd as our foreground children."""
    d = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool"):
        (d / sub).mkdir()
    key = d / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o600)
    conf = d / "slurm.conf"
    conf.write_text(SLURM_CONF.format(dir=d, ctld_port=free_port(), d_port=free_port()))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_"))}
    env["SLURM_CONF"] = str(conf)
    munge = [f"--socket={d}/munge.sock", f"--key-file={key}", f"--pid-file={d}/munged.pid"]
    munge += [f"--log-file={d}/munged.log", f"--seed-file={d}/munged.seed"]
    # Foreground daemons, so they are ours to stop and reap (PID 1 here reaps no orphans).
    daemons = [subprocess.Popen(["munged", "-F", "--force", *munge], env=env, stderr=subprocess.DEVNULL)]
    _wait_for((d / "munge.sock").exists, 10, "munged did not create its socket")
    for cmd in (["slurmctld", "-D", "-i"], ["slurmd", "-D", "-N", "localhost"]):
        daemons.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    sinfo = ["sinfo", "--noheader", "--format=%t"]
    _wait_for(
        lambda: subprocess.run(sinfo, env=env, capture_output=True, text=True).stdout.strip() == "idle",
        60,
        "no idle node",
    )
    yield env
    for p in reversed(daemons):
        p.terminate()
        p.wait(timeout=30)


def _make(target: str, env: dict, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    cmd = ["make", "-s", target, f"ARGS={' '.join(args)}"]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)


def _job_listed(env: dict, job_id: str) -> bool:
    out = subprocess.run(["squeue", "--noheader", f"--jobs={job_id}"], env=env, capture_output=True, text=True)
    return bool(out.stdout.strip())


def _processes_mentioning(text: str) -> list[str]:
    """Live (not zombie) processes whose command line mentions text."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z" and int(pid) != os.getpid():
            found.append(f"{pid}: {cmdline}")
    return found


def _diagnostics(run_dir: Path) -> str:
    text = ""
    for log in sorted(run_dir.glob("slurm-*.out")) + sorted((run_dir / "logs").glob("*.log")):
        text += f"\n== {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-25:])
    return text


def _submit(env: dict, out_dir: Path, run_id: str, tiny_model: Path, *overrides: str) -> str:
    args = [f"run.output_dir={out_dir}", f"run.run_id={run_id}", f"model.path={tiny_model}", "rollout.engine=hf"]
    args += ["coordinator.num_prompts=4", "coordinator.num_samples=4", *overrides]
    up = _make("up", env, *args)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "backend: sbatch" in up.stdout
    return re.search(r"submitted batch job (\d+)", up.stdout).group(1)


def test_batch_job_runs_every_step_and_leaves_nothing(slurm_env, tmp_path, tiny_model):
    out_dir, run_dir = tmp_path / "runs", tmp_path / "runs" / "batch"
    job_id = _submit(slurm_env, out_dir, "batch", tiny_model, "run.num_steps=2", "trainer.num_ranks=2")
    _wait_for(lambda: not _job_listed(slurm_env, job_id), 600, "batch job did not end", lambda: _diagnostics(run_dir))

    job_out = (run_dir / f"slurm-{job_id}.out").read_text()
    assert "ended: RUN_STATE_DONE after 2 steps" in job_out, _diagnostics(run_dir)
    assert re.search(r"status: http://localhost:\d+/status", job_out)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    # The services ran as job steps, each with its log, all reading the config the launcher wrote.
    assert {p.stem for p in (run_dir / "logs").glob("*.log")} == {
        "redis",
        "weightsync",
        "trainer",
        "rollout-0",
        "coordinator",
    }
    assert 'host = "localhost"' in (run_dir / "config.toml").read_text()

    down = _make("down", slurm_env, f"run.output_dir={out_dir}")
    assert down.returncode == 0, down.stdout + down.stderr
    assert not list((out_dir / ".up").glob("*.json"))
    assert not _processes_mentioning(str(run_dir))


def test_make_down_stops_a_running_job(slurm_env, tmp_path, tiny_model):
    out_dir, run_dir = tmp_path / "runs", tmp_path / "runs" / "stopme"
    job_id = _submit(
        slurm_env, out_dir, "stopme", tiny_model, "run.num_steps=1000", "trainer.num_ranks=1", "run.checkpoint_every=1"
    )
    metrics = run_dir / "metrics.jsonl"
    _wait_for(lambda: metrics.exists() and metrics.read_text(), 300, "no step finished", lambda: _diagnostics(run_dir))
    assert _job_listed(slurm_env, job_id)
    assert _processes_mentioning(str(run_dir))

    # A rollout worker killed inside the job is started again as a new job step, and the run goes on.
    [worker] = [p for p in _processes_mentioning(str(run_dir)) if "-m services.rollout.main" in p and "srun" not in p]
    os.kill(int(worker.split(":")[0]), 9)
    done = len(metrics.read_text().splitlines())
    log = run_dir / "logs" / "rollout-0.log"
    _wait_for(
        lambda: "restarted by the launcher" in log.read_text(),
        60,
        "worker not restarted",
        lambda: _diagnostics(run_dir),
    )
    _wait_for(lambda: len(metrics.read_text().splitlines()) > done + 1, 300, "no step after the restart",
              lambda: _diagnostics(run_dir))  # fmt: skip

    # A trainer rank killed: the launcher stops every step and resumes the run from its newest checkpoint.
    [rank] = [p for p in _processes_mentioning(str(run_dir)) if "-m services.trainer.main" in p and "srun" not in p
              and not launches_ranks(p)]  # fmt: skip
    os.kill(int(rank.split(":")[0]), 9)
    job_out = run_dir / f"slurm-{job_id}.out"
    _wait_for(lambda: "trainer died: resuming the run from step" in job_out.read_text(), 120, "no resume",
              lambda: _diagnostics(run_dir))  # fmt: skip
    resumed_at = int(re.search(r"resuming the run from step (\d+)", job_out.read_text()).group(1))
    _wait_for(lambda: json.loads(metrics.read_text().splitlines()[-1])["step"] > resumed_at + 1, 300,
              "no step after the resume", lambda: _diagnostics(run_dir))  # fmt: skip
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == list(range(1, len(steps) + 1))  # the redone steps appear once

    down = _make("down", slurm_env, f"run.output_dir={out_dir}")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "stopping run stopme (slurm)" in down.stdout
    assert not _job_listed(slurm_env, job_id)
    _wait_for(lambda: not _processes_mentioning(str(run_dir)), 10, "processes left after make down")
    assert not list((out_dir / ".up").glob("*.json"))
