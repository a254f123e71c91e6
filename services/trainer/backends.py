"""The trainer backends by trainer.backend: a new one is a package implementing `backend.Backend` whose build
function returns an `engine.Engine` over it, plus one line here. Imported on use: megatron-core exists only on GPU
machines."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from services.common.config import RunConfig

    from .engine import Engine

BACKENDS = {
    "fsdp2": "services.trainer.fsdp2.build:build",
    "megatron": "services.trainer.megatron.build:build",
}


def build_engine(cfg: RunConfig, device: torch.device) -> Engine:
    """Every rank's engine over the configured backend, the policy (and reference) loaded from model.path."""
    torch.manual_seed(cfg.run.seed)
    module, _, name = BACKENDS[cfg.trainer.backend].partition(":")
    return getattr(importlib.import_module(module), name)(cfg, device)
