"""`make up` on a real Docker engine (deploy/docker/testhost.py: dockerd on a private socket, local stand-ins for Docker
Hub's images): the images build and a short run completes; a rollout container that crashes mid-run is started again
by compose's restart policy and the run completes every step; a trainer container killed mid-run takes the project
down and `make up` resumes it from its newest checkpoint. Needs root and Debian 12, and minutes (image build, model
loads): skipped unless GRPO_DOCKER_HOST_TEST=1 (`make test-docker`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy.docker import testhost
from services.common.ports import free_port
from services.coordinator.run_record import RunRecord

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("GRPO_DOCKER_HOST_TEST") != "1", reason="GRPO_DOCKER_HOST_TEST=1 (make test-docker)"
    ),
]

REPO = Path(__file__).resolve().parents[2]
# deploy/configs/local.toml (2 trainer ranks, vLLM) with a model of its own; a step takes ~0.3 s once warm, so the
# runs that are killed have steps enough to be killed mid-run.
TOY = ["model.create=true", "run.checkpoint_every=5"]


@pytest.fixture(scope="module")
def host():
    """The test host of GRPO_DOCKER_TEST_DIR; stopped at the end where this module started it."""
    folder = Path(os.environ.get("GRPO_DOCKER_TEST_DIR", "/tmp/grpo-docker"))
    running = testhost.Host(folder).answers()
    h = testhost.up(folder)
    yield h
    if not running:
        testhost.down(folder)


class Run:
    """`make up` (deploy.up, the Docker backend) of one run in tmp_path, its output in a file."""

    def __init__(self, host: testhost.Host, tmp_path: Path, run_id: str, *overrides: str):
        self.host, self.run_id, self.dir = host, run_id, tmp_path / run_id
        self.log = tmp_path / f"{run_id}.log"
        args = [f"run.run_id={run_id}", f"run.output_dir={tmp_path}", f"model.path={tmp_path}/model", *TOY]
        args += [f"coordinator.http_port={free_port()}", f"coordinator.grpc_port={free_port()}", *overrides]
        cmd = [sys.executable, "-m", "deploy.up", "--backend", "docker", "--config", "deploy/configs/local.toml", *args]
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(cmd, cwd=REPO, env=host.env, stdout=out, stderr=subprocess.STDOUT)

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def container(self, service: str) -> str:
        return f"grpo-{self.run_id}-{service}-1"

    def steps(self) -> list[int]:
        metrics = self.dir / "metrics.jsonl"
        rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
        return [row["step"] for row in rows if "step" in row]

    def wait(self, what, timeout_s: float = 1200):
        deadline = time.monotonic() + timeout_s
        while not (found := what()):
            assert self.proc.poll() is None, f"make up ended ({self.proc.returncode}) first:\n{self.output[-3000:]}"
            assert time.monotonic() < deadline, f"timed out:\n{self.output[-3000:]}"
            time.sleep(1)
        return found

    def finish(self, timeout_s: float = 1200) -> int:
        try:
            return self.proc.wait(timeout_s)
        finally:
            if self.proc.poll() is None:
                self.proc.terminate()
                self.proc.wait(120)

    def inspect(self, service: str, template: str) -> str:
        return self.host.docker("inspect", "--format", template, self.container(service)).strip()


def test_make_up_builds_and_completes_a_short_run(host, tmp_path):
    run = Run(host, tmp_path, "dk-short", "run.num_steps=3")
    assert run.finish() == 0, run.output[-3000:]
    assert "ended: RUN_STATE_DONE after 3 steps" in run.output
    # The project is down again; nothing of it is left running.
    assert host.docker("ps", "--quiet", "--filter", "label=com.docker.compose.project=grpo-dk-short") == ""


def test_a_crashed_rollout_container_is_restarted_by_compose_and_the_run_completes(host, tmp_path):
    run = Run(host, tmp_path, "dk-rollout", "run.num_steps=40")
    run.wait(lambda: len(run.steps()) >= 3)
    # A crash (its main process killed from outside): `docker kill` counts as a manual stop, which no restart policy
    # restarts; that case is the trainer's below (the project is taken down and resumed).
    os.kill(int(run.inspect("rollout", "{{.State.Pid}}")), 9)
    run.wait(lambda: int(run.inspect("rollout", "{{.RestartCount}}")) >= 1, timeout_s=60)
    assert run.finish() == 0, run.output[-3000:]
    assert "ended: RUN_STATE_DONE after 40 steps" in run.output and "resuming" not in run.output
    assert run.steps() == list(range(1, 41))


def test_a_killed_trainer_container_resumes_the_run_from_its_checkpoint(host, tmp_path):
    run = Run(host, tmp_path, "dk-trainer", "run.num_steps=40")
    run.wait(lambda: RunRecord(run.dir).latest() is not None and len(run.steps()) >= 3)  # a checkpoint to resume
    host.docker("kill", run.container("trainer"))
    assert run.finish() == 0, run.output[-3000:]
    assert "trainer died: resuming the run from step" in run.output
    assert "ended: RUN_STATE_DONE after 40 steps" in run.output
    assert run.steps() == list(range(1, 41))  # metrics.jsonl cut back to the checkpoint's rows, then continued
