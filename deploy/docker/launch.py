"""`make up` on a Docker host: one compose project per run, supervised from here, taken down at its end."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from services.common import auth
from services.common.config import RunConfig
from services.common.redis_server import redis_settings, write_private

from .. import records, stopping
from ..placement import Cluster, Placement, format_placement, place
from ..placement.assign import DOCKER_REDIS_PORT
from ..placement.gpus import colocated
from ..procs import ServiceDied
from ..resuming import run_resuming
from ..supervise import run_to_end, shield_cleanup, stop_on_sigterm, wait_ready

COMPOSE_FILE = Path(__file__).with_name("compose.yaml")
# Where the containers see the run's folders (compose.yaml mounts them there).
RUNS, MODEL, PROMPTS = "/runs", "/model", "/prompts.jsonl"


def host_gpus() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines()) if out.returncode == 0 else 0


def project_name(run_id: str) -> str:
    # Compose project names: lowercase letters, digits, dashes and underscores.
    return "grpo-" + re.sub(r"[^a-z0-9_-]", "-", run_id.lower())


def container_config(placement: Placement) -> RunConfig:
    """The placement's config with the paths the containers see."""
    cfg = placement.cfg.model_copy(deep=True)
    cfg.run.output_dir, cfg.model.path = RUNS, MODEL
    if cfg.run.resume:  # the run's own folder (run.resume keeps run_id), as the containers see it
        cfg.run.resume = f"{RUNS}/{cfg.run.run_id}"
    if cfg.task.prompts_path:
        cfg.task.prompts_path = PROMPTS
    return cfg


def write_redis_conf(cfg: RunConfig, run_dir: Path) -> Path:
    """The Redis container's settings in run_dir/redis.conf (0600: the password is in it): `make run`'s locked Redis
    (services/common/redis_server.py) on the project's network, its files in the container's /data volume."""
    # The run folder's secret, as `make run` gives its Redis (this process has loaded none; None: this process's).
    secret = auth.run_secret(run_dir) if cfg.run.locked else None
    lines = redis_settings(DOCKER_REDIS_PORT, "0.0.0.0", "/data", secret)  # the container's interfaces, never published
    # The clients are other containers. Protected mode refuses them wherever the default user keeps `nopass`, which
    # `user default off` (a locked run) leaves set (Redis 7 reads no `bind` exemption); locked, only the services'
    # user logs in, with the password.
    lines.append("protected-mode no")
    return write_private(run_dir / "redis.conf", lines)


def compose_env(placement: Placement) -> dict[str, str]:
    """Everything compose.yaml reads, from the placement (host paths are absolute: compose runs from anywhere)."""
    cfg = placement.cfg
    env = {
        "GRPO_PROJECT": project_name(cfg.run.run_id),
        "GRPO_CONFIG": f"{RUNS}/{cfg.run.run_id}/config.toml",
        "GRPO_REDIS_CONF": f"{RUNS}/{cfg.run.run_id}/redis.conf",
        "GRPO_RUNS_DIR": str(Path(cfg.run.output_dir).resolve()),
        "GRPO_MODEL_DIR": str(Path(cfg.model.path).resolve()),
        "GRPO_DEVICE": placement.device,
        "GRPO_TRAINER_RANKS": str(cfg.trainer.num_ranks),
        "GRPO_TRAINER_THREADS": str(placement.get("trainer").threads),
        "GRPO_ROLLOUT_THREADS": str(placement.get("rollout-0").threads),
        "GRPO_STATUS_PORT": str(cfg.coordinator.http_port),
        "GRPO_CONTROL_PORT": str(cfg.coordinator.grpc_port),
        "GRPO_BIND": os.environ.get("GRPO_BIND", "127.0.0.1"),
    }
    if placement.device == "cuda":
        env["GRPO_ROLLOUT_GPUS"] = ",".join(map(str, rollout_container_gpus(placement)))
    if cfg.task.prompts_path:
        env["GRPO_PROMPTS_PATH"] = str(Path(cfg.task.prompts_path).resolve())
    return env


def rollout_gpus(placement: Placement) -> list[int]:
    """Host GPUs the rollout container reserves: those of all its workers."""
    return sorted({g for a in placement.services if a.service.startswith("rollout-") for g in a.gpus or ()})


def rollout_container_gpus(placement: Placement) -> list[int]:
    """Each worker's GPU as the rollout container numbers its GPUs (from 0)."""
    pool = rollout_gpus(placement)
    workers = [placement.get(f"rollout-{i}") for i in range(placement.cfg.rollout.num_workers)]
    return [pool.index(a.gpus[0]) for a in workers]


def gpu_override(placement: Placement) -> str:
    """A compose override with the placement's GPUs per service, or without GPU reservations on CPU."""
    if placement.device == "cpu":
        return "services:\n  trainer:\n    deploy: !reset {}\n  rollout:\n    deploy: !reset {}\n"
    lines = ["services:"]
    for service, gpus in (("trainer", placement.get("trainer").gpus), ("rollout", rollout_gpus(placement))):
        ids = ", ".join(f'"{g}"' for g in gpus)
        lines += [f"  {service}:"]
        if colocated(placement.cfg):
            # CUDA IPC handles and torch's shared reference counters cross containers only in one IPC namespace.
            lines += ["    ipc: host"]
        lines += ["    deploy:", "      resources:", "        reservations:"]
        lines += ["          devices: !override", "            - driver: nvidia", f"              device_ids: [{ids}]"]
        lines += ["              capabilities: [gpu]"]
    return "\n".join(lines) + "\n"


def compose_command(project: str, override: Path) -> list[str]:
    return ["docker", "compose", "--project-name", project, "-f", str(COMPOSE_FILE), "-f", str(override)]


def detect() -> bool:
    """A Docker engine answers (`docker info`)."""
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def up(cfg: RunConfig, dry_run: bool, argv: list[str]) -> int:
    placement = place(cfg, Cluster("docker", ("localhost",), host_gpus()))
    run_dir = Path(placement.cfg.run.output_dir) / placement.cfg.run.run_id
    env, override = compose_env(placement), run_dir / "compose.gpus.yaml"
    compose = compose_command(env["GRPO_PROJECT"], override)
    print(format_placement(placement))
    print("compose: " + " ".join(f"{k}={v}" for k, v in env.items()) + " " + " ".join(compose) + " up")
    if dry_run:
        return 0
    run_dir.mkdir(parents=True, exist_ok=True)
    Path(placement.cfg.model.path).mkdir(parents=True, exist_ok=True)  # the trainer writes a created model there
    override.write_text(gpu_override(placement))
    placement.write_configs(run_dir, container_config(placement))
    if placement.start_redis:
        write_redis_conf(placement.cfg, run_dir)
    run_id = placement.cfg.run.run_id
    record = records.write(placement.cfg.run.output_dir, "docker", run_id, compose=compose, env=env)
    try:
        # A dead trainer, weightsync, coordinator or Redis (or the rollout container past its restarts): the project
        # is taken down and started again on the run's newest checkpoint, up to run.max_restarts (deploy/resuming.py).
        return run_resuming(
            placement, run_dir, lambda p: run(p, compose, {**os.environ, **env}), "make up", container_config
        )
    finally:
        records.remove(record)


def stop(record: dict) -> list[str]:
    stopped = stopping.stop_launcher(record)
    env = {**os.environ, **record["env"]}
    subprocess.run([*record["compose"], "down", "--remove-orphans"], env=env, check=True)
    return [*stopped, f"compose project {record['env'].get('GRPO_PROJECT', '')} (down --remove-orphans)"]


def run(placement: Placement, compose: list[str], env: dict[str, str]) -> int:
    """One start of the compose project, to the run's end or a container's exit (ServiceDied), then down."""
    stop_on_sigterm()
    try:
        # --wait: until every healthcheck passes (the model is loaded everywhere).
        subprocess.run([*compose, "up", "--detach", "--build", "--wait"], env=env, check=True)
        alive = watch(compose, env)
        coordinator = f"127.0.0.1:{placement.cfg.coordinator.grpc_port}"
        wait_ready([coordinator], alive)
        return run_to_end(placement.cfg, coordinator, placement.status_url, alive)
    except KeyboardInterrupt:
        print("\ninterrupted: taking the compose project down", file=sys.stderr)
        return 130
    finally:
        shield_cleanup()
        # Named volumes stay: a resumed run's Redis starts from its append-only file, as `make run`'s does.
        subprocess.run([*compose, "down", "--remove-orphans"], env=env)


def watch(compose: list[str], env: dict[str, str], every_s: float = 10.0):
    """A check that raises ServiceDied once a container of the project has exited (asks Docker every few seconds);
    the rollout container counts once compose's restart policy has given up on it."""
    last = [0.0]

    def check() -> None:
        if time.monotonic() - last[0] < every_s:
            return
        last[0] = time.monotonic()
        out = subprocess.run(
            [*compose, "ps", "--all", "--status=exited", "--services"], env=env, capture_output=True, text=True
        )
        exited = out.stdout.split()
        if exited:
            logs = subprocess.run(
                [*compose, "logs", "--no-color", "--tail=15", exited[0]], env=env, capture_output=True, text=True
            )
            tail = (logs.stdout + logs.stderr).strip()
            message = f"container(s) exited: {', '.join(exited)}; last lines of {exited[0]}:\n{tail}"
            raise ServiceDied(exited[0], message)

    return check
