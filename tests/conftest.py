"""Shared fixtures: a real Redis, a tiny local model, service processes on free ports."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from deploy.procs import Service, spawn, stop_all
from services.common.config import ModelSection, RunConfig, dump_toml, load_config
from services.common.ports import free_port

LONG_MODULES = {
    # Deploy on a real Slurm cluster (one node, then three in network namespaces): ~7 min on 2 cores.
    "test_deploy_slurm.py",
    "test_deploy_slurm_nodes.py",
    # The launcher's fault drills (signals, kill -9, a hung or killed worker, scaling mid-run): ~3.5 min.
    "test_deploy_survive.py",
    "test_deploy_scale.py",
    # Smoke runs of the benchmark scripts (bench/step_ab.py, bench/vs_trl.py): ~2 min.
    "test_step_ab.py",
    "test_vs_trl.py",
}
"""Modules marked `long`: `make test-long` runs them, `make test` does not, so `make test` stays under 30 minutes on
2 cores; CI (.ci/run) runs both."""


def _processes() -> dict[int, str]:
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                out[int(entry)] = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            except OSError:  # gone meanwhile
                continue
    return out


_AT_START = set(_processes())
_OURS = ("redis-server", "services.", "deploy.", "torchrun", "vllm", "slurmd", "slurmctld")


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Name the service processes a test started and left running: a leaked Redis or worker holds its port and its
    memory for the rest of the suite (CI once failed a placement test on a port held by something left over)."""
    time.sleep(1.0)  # processes stopped by the last teardown are reaped
    left = {pid: cmd for pid, cmd in _processes().items() if pid not in _AT_START and pid != os.getpid()}
    leaked = {pid: cmd for pid, cmd in left.items() if any(name in cmd for name in _OURS)}
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if leaked and reporter is not None:
        reporter.ensure_newline()
        reporter.write_line(f"processes left running by the tests ({len(leaked)}):", yellow=True)
        for pid, cmd in sorted(leaked.items()):
            reporter.write_line(f"  {pid}: {cmd[:200]}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in LONG_MODULES:
            item.add_marker(pytest.mark.long)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory) -> str:
    from services.common.redis_server import start_redis

    port = free_port()
    proc = start_redis(port, tmp_path_factory.mktemp("redis"))
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from services.common.tinymodel import create_tiny_model

    return create_tiny_model(ModelSection(path=str(tmp_path_factory.mktemp("models") / "tiny")), seed=0)


class Services:
    """Service processes started by a test, all stopped (process groups included) at teardown."""

    def __init__(self, tmp_path: Path):
        self.tmp_path, self.started = tmp_path, []

    def config(self, overrides: list[str]) -> tuple[RunConfig, Path]:
        cfg = load_config(None, overrides)
        path = self.tmp_path / f"config-{len(self.started)}.toml"
        path.write_text(dump_toml(cfg))
        return cfg, path

    def start(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Service:
        service = spawn(name, args, self.tmp_path / "logs", env)
        self.started.append(service)
        return service


@pytest.fixture
def services(tmp_path):
    s = Services(tmp_path)
    yield s
    stop_all(s.started)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct as an HF folder, built once from the PyPI GGUF and cached under runs/models/."""
    from services.common.models import build_model

    return build_model("smollm2-135m-instruct", Path(__file__).resolve().parents[1] / "runs" / "models")
