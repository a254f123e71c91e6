"""Shared fixtures: a real Redis, a tiny local model, service processes on free ports."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.procs import Service, spawn, stop_all
from services.common.config import ModelSection, RunConfig, dump_toml, load_config
from services.common.ports import free_port


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
