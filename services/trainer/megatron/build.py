"""Build every rank's Megatron-core engine: the GPTModel in its TP / PP layout from an HF checkpoint, DDP, the
distributed optimizer."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from ..engine import Engine
from . import model as mm
from .backend import MegatronBackend

if TYPE_CHECKING:
    from services.common.config import RunConfig, TrainerSection


def build(cfg: RunConfig, device: torch.device) -> Engine:
    """Policy (and reference when kl_beta > 0) from model.path's HF safetensors, in the TP / PP layout."""
    trainer = cfg.trainer
    if device.type != "cuda":
        raise ValueError("trainer.backend=megatron needs a CUDA GPU per rank (megatron-core runs forward on CUDA)")
    return assemble(trainer, Path(cfg.model.path), device, cfg.run.seed)


def assemble(trainer: TrainerSection, model_dir: Path, device: torch.device, seed: int = 0) -> Engine:
    tp, pp = trainer.megatron.tensor_parallel, trainer.megatron.pipeline_parallel
    mm.init_parallel(tp, pp, seed)
    shape = mm.read_shape(model_dir)
    bf16 = trainer.dtype == "bfloat16"
    config = mm.transformer_config(shape, tp, pp, bf16, trainer.memory.activation_checkpointing, dist.get_world_size())
    lay = mm.layout(config, shape)
    policy = mm.build_gpt(config, shape)
    mm.load_hf(policy, model_dir, lay)
    ref = None
    if trainer.loss.kl_beta > 0:
        ref = mm.build_gpt(config, shape)
        mm.load_hf(ref, model_dir, lay)
        ref.requires_grad_(False).eval()
    ddp = mm.wrap_ddp(policy, config)
    opt = mm.optimizer(ddp, trainer.lr, trainer.weight_decay, trainer.max_grad_norm, bf16)
    return Engine(MegatronBackend(ddp, ref, opt, trainer, device, shape, lay), trainer, model_dir)
