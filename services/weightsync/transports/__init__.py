"""The transports by name: the one place a refit's data plane is chosen. A new transport is a module here
with a Transport subclass, and one line in REGISTRY."""

from __future__ import annotations

import torch

from .base import Transport
from .collective import GlooTransport, NcclTransport
from .cuda_ipc import CudaIpcTransport
from .ucxx import UcxxTransport

REGISTRY: dict[str, type[Transport]] = {
    "gloo": GlooTransport,
    "nccl": NcclTransport,
    "cuda_ipc": CudaIpcTransport,
    "ucxx": UcxxTransport,
}
NAMES: tuple[str, ...] = tuple(REGISTRY)


def choose(configured: str) -> str:
    """The transport a configured name means: 'auto' is NCCL where a GPU is visible and gloo otherwise."""
    if configured == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    return configured


def kind(name: str) -> type[Transport]:
    if name not in REGISTRY:
        raise ValueError(f"transport must be one of {NAMES}, got {name!r}")
    return REGISTRY[name]


def several_senders() -> list[str]:
    """The transports over which several ranks may send one refit."""
    return [n for n, k in REGISTRY.items() if k.max_senders > 1]


class Transports:
    """One process's transports, each made on first use and kept (with the groups and buffers it owns)."""

    def __init__(self) -> None:
        self._made: dict[str, Transport] = {}

    def get(self, name: str) -> Transport:
        if name not in self._made:
            self._made[name] = kind(name)()
        return self._made[name]
