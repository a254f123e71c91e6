"""`make up` on a Docker host: one compose project per run, driven from here, taken down at its end."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from services.common.config import RunConfig, dump_toml

from .. import records
from ..drive import follow, shield_cleanup, stop_on_sigterm, wait_ready
from ..plan import Cluster, Plan, format_plan, place

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


def container_config(plan: Plan) -> RunConfig:
    """The plan's config with the paths the containers see."""
    cfg = plan.cfg.model_copy(deep=True)
    cfg.run.output_dir, cfg.model.path = RUNS, MODEL
    if cfg.task.prompts_path:
        cfg.task.prompts_path = PROMPTS
    return cfg


def compose_env(plan: Plan) -> dict[str, str]:
    """Everything compose.yaml reads, from the plan (host paths are absolute: compose runs from anywhere)."""
    cfg = plan.cfg
    env = {
        "GRPO_PROJECT": project_name(cfg.run.run_id),
        "GRPO_CONFIG": f"{RUNS}/{cfg.run.run_id}/config.toml",
        "GRPO_RUNS_DIR": str(Path(cfg.run.output_dir).resolve()),
        "GRPO_MODEL_DIR": str(Path(cfg.model.path).resolve()),
        "GRPO_DEVICE": plan.device,
        "GRPO_TRAINER_RANKS": str(cfg.trainer.num_ranks),
        "GRPO_STATUS_PORT": str(cfg.coordinator.http_port),
        "GRPO_CONTROL_PORT": str(cfg.coordinator.grpc_port),
        "GRPO_BIND": os.environ.get("GRPO_BIND", "127.0.0.1"),
    }
    if cfg.task.prompts_path:
        env["GRPO_PROMPTS_PATH"] = str(Path(cfg.task.prompts_path).resolve())
    return env


def gpu_override(plan: Plan) -> str:
    """A compose override with the plan's GPUs per service, or without GPU reservations on CPU."""
    if plan.device == "cpu":
        return "services:\n  trainer:\n    deploy: !reset {}\n  rollout:\n    deploy: !reset {}\n"
    lines = ["services:"]
    rollout = sorted({g for p in plan.placements if p.service.startswith("rollout-") for g in p.gpus})
    for service, gpus in (("trainer", plan.get("trainer").gpus), ("rollout", rollout)):
        ids = ", ".join(f'"{g}"' for g in gpus)
        lines += [f"  {service}:", "    deploy:", "      resources:", "        reservations:"]
        lines += ["          devices: !override", "            - driver: nvidia", f"              device_ids: [{ids}]"]
        lines += ["              capabilities: [gpu]"]
    return "\n".join(lines) + "\n"


def compose_command(project: str, override: Path) -> list[str]:
    return ["docker", "compose", "--project-name", project, "-f", str(COMPOSE_FILE), "-f", str(override)]


def up(cfg: RunConfig, dry_run: bool) -> int:
    plan = place(cfg, Cluster("docker", ("localhost",), host_gpus()))
    run_dir = Path(plan.cfg.run.output_dir) / plan.cfg.run.run_id
    env, override = compose_env(plan), run_dir / "compose.gpus.yaml"
    compose = compose_command(env["GRPO_PROJECT"], override)
    print(format_plan(plan))
    print("compose: " + " ".join(f"{k}={v}" for k, v in env.items()) + " " + " ".join(compose) + " up")
    if dry_run:
        return 0
    run_dir.mkdir(parents=True, exist_ok=True)
    Path(plan.cfg.model.path).mkdir(parents=True, exist_ok=True)  # the trainer writes a created model there
    override.write_text(gpu_override(plan))
    (run_dir / "config.toml").write_text(dump_toml(container_config(plan)))
    record = records.write(plan.cfg.run.output_dir, "docker", plan.cfg.run.run_id, compose=compose, env=env)
    return run(plan, compose, {**os.environ, **env}, record)


def run(plan: Plan, compose: list[str], env: dict[str, str], record: Path) -> int:
    stop_on_sigterm()
    try:
        # --wait: until every healthcheck passes (the model is loaded everywhere).
        subprocess.run([*compose, "up", "--detach", "--build", "--wait"], env=env, check=True)
        alive = _watch(compose, env)
        coordinator = f"127.0.0.1:{plan.cfg.coordinator.grpc_port}"
        wait_ready([coordinator], alive)
        return follow(plan.cfg, coordinator, plan.status_url, alive)
    except KeyboardInterrupt:
        print("\ninterrupted: taking the compose project down", file=sys.stderr)
        return 130
    finally:
        shield_cleanup()
        subprocess.run([*compose, "down", "--remove-orphans"], env=env)
        records.remove(record)


def _watch(compose: list[str], env: dict[str, str], every_s: float = 10.0):
    """A check that raises once a container of the project has exited (asks Docker every few seconds)."""
    last = [0.0]

    def check() -> None:
        if time.monotonic() - last[0] < every_s:
            return
        last[0] = time.monotonic()
        out = subprocess.run([*compose, "ps", "--all", "--status=exited", "--services"], env=env, capture_output=True)
        if out.stdout.strip():
            exited = out.stdout.decode().split()
            raise RuntimeError(f"container(s) exited: {', '.join(exited)}; see `docker compose logs`")

    return check
