"""Megatron's training state: one file per rank, for an exact resume on the same layout.

The distributed optimizer runs a torch AdamW over this rank's fp32 main-weight shards; its state dict
(moments and per-parameter step) and those shards are saved as they are, beside the bf16 module weights
(the cast of the main weights after the last step, so the two agree), the policy version and the RNG.
Megatron's save_parameter_state is not used: it leaves out torch AdamW's per-parameter step tensors and
then fails to load into an optimizer that has stepped. A different layout is refused (no resharding).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from torch import nn


def _layout() -> dict[str, int]:
    return {
        "world": dist.get_world_size(),
        "tensor_parallel": ps.get_tensor_model_parallel_world_size(),
        "pipeline_parallel": ps.get_pipeline_model_parallel_world_size(),
    }


def _inner(optimizer) -> list[torch.optim.Optimizer]:
    """The torch optimizers over this rank's fp32 main-weight shards (one per chained Megatron optimizer)."""
    return [part.optimizer for part in getattr(optimizer, "chained_optimizers", [optimizer])]


def save(folder: Path, module: nn.Module, optimizer, policy_version: int, rank: int) -> None:
    """Collective: every rank writes its own file."""
    if rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    inner = _inner(optimizer)
    state = {
        "layout": _layout(),
        "module": module.state_dict(),
        "optimizers": [opt.state_dict() for opt in inner],
        "main_params": [[p.detach().cpu() for g in opt.param_groups for p in g["params"]] for opt in inner],
        "policy_version": policy_version,
        "rng_cpu": torch.get_rng_state(),
        "rng_cuda": torch.cuda.get_rng_state(),
    }
    torch.save(state, folder / f"rank{rank}.pt")
    dist.barrier()


@torch.no_grad()
def load(folder: Path, module: nn.Module, optimizer, rank: int) -> int:
    """Restore what save() wrote on the same layout; returns the policy version."""
    own = folder / f"rank{rank}.pt"
    if not own.is_file():
        raise ValueError(f"{folder} holds no Megatron training state for rank {rank} (saved with fewer ranks?)")
    # Our own file: tensors, dicts and the optimizer's plain hyper-parameters only.
    state = torch.load(own, map_location="cpu", weights_only=True)
    if state["layout"] != _layout():
        raise ValueError(f"{folder} was saved with layout {state['layout']}; this trainer is {_layout()}")
    module.load_state_dict(state["module"])
    for opt, saved, mains in zip(_inner(optimizer), state["optimizers"], state["main_params"], strict=True):
        opt.load_state_dict(saved)
        params = [p for g in opt.param_groups for p in g["params"]]
        for p, value in zip(params, mains, strict=True):
            p.copy_(value)
    torch.set_rng_state(state["rng_cpu"])
    torch.cuda.set_rng_state(state["rng_cuda"])
    return int(state["policy_version"])
