"""The trainer backend registry (services/trainer/backends.py): every configurable backend has a build function and
a class keeping the whole `Backend` contract of the batch driver (megatron's read from its source: megatron-core is
on GPU machines only)."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import typing
from pathlib import Path

import pytest

from services.common.config import TrainerSection
from services.trainer.backend import Backend
from services.trainer.backends import BACKENDS

ROOT = Path(__file__).resolve().parents[2]
CLASSES = {"fsdp2": "FSDP2Backend", "megatron": "MegatronBackend"}


def _contract() -> dict[str, int]:
    """Each member of the Protocol: its number of parameters after self (-1: an attribute or property)."""
    members = {name: -1 for name in typing.get_type_hints(Backend)}
    for name, member in vars(Backend).items():
        if name.startswith("_"):
            continue
        if inspect.isfunction(member):
            members[name] = len(inspect.signature(member).parameters) - 1
        elif isinstance(member, property):
            members[name] = -1
    return members


def test_every_configurable_backend_is_registered():
    assert set(BACKENDS) == set(typing.get_args(TrainerSection.model_fields["backend"].annotation))


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_every_backend_keeps_the_contract(name):
    module, _, function = BACKENDS[name].partition(":")
    source = ROOT / Path(importlib.util.find_spec(module).origin).relative_to(ROOT)
    assert function in {f.name for f in ast.parse(source.read_text()).body if isinstance(f, ast.FunctionDef)}
    backend_file = source.with_name("backend.py")
    cls = next(
        c for c in ast.parse(backend_file.read_text()).body if isinstance(c, ast.ClassDef) and c.name == CLASSES[name]
    )
    methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
    init = ast.unparse(methods["__init__"])
    for member, arity in _contract().items():
        if arity < 0:  # set in __init__ or a property
            assert f"self.{member}" in init or member in methods, (name, member)
        else:
            assert member in methods, (name, member)
            assert len(methods[member].args.args) - 1 == arity, (name, member)
