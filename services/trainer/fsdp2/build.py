"""Build every rank's FSDP2 engine: load policy and reference, checkpoint activations, shard with FSDP2, AdamW."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from services.common.lm_head import install_fp32_lm_head

from ..attention import SDPA_VARLEN, register_attention
from ..engine import Engine
from ..head import compile_head, install_packed_logprobs
from .backend import FSDP2Backend

if TYPE_CHECKING:  # pydantic stays out of the import path: the GPU bench image lacks it
    from services.common.config import RunConfig, TrainerSection

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# Selective checkpointing keeps the outputs of these (the FLOPs) and recomputes everything else (norms,
# activations, rotary, residual adds: cheap to redo, but their fp32 intermediates are much of the memory).
_SAVED_OPS = (
    "mm",
    "addmm",
    "bmm",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
)


def build(cfg: RunConfig, device: torch.device) -> Engine:
    """Load the policy (and the reference when kl_beta > 0) from model.path, sharded over all ranks."""
    trainer = cfg.trainer
    policy = load_model(cfg.model.path, torch.float32, trainer.fsdp2.attn_implementation)
    ref = None
    if trainer.loss.kl_beta > 0:
        ref = load_model(cfg.model.path, _DTYPES[trainer.dtype], trainer.fsdp2.attn_implementation)
    return assemble_engine(policy, ref, trainer, Path(cfg.model.path), device, cfg.model.lm_head_fp32)


def load_model(path: str, dtype: torch.dtype, attn_implementation: str) -> nn.Module:
    from transformers import AutoModelForCausalLM

    if attn_implementation == SDPA_VARLEN:
        register_attention()
    # safetensors only: a .bin in the folder would be a pickle, and model.path may be an export of ours.
    return AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, attn_implementation=attn_implementation, use_safetensors=True
    )


def assemble_engine(
    model: nn.Module,
    ref_model: nn.Module | None,
    cfg: TrainerSection,
    model_dir: Path,
    device: torch.device,
    lm_head_fp32: bool = True,
) -> Engine:
    """Shard already-built fp32 models (the master weights) on a mesh of every rank, then add AdamW."""
    for m in (model, ref_model):
        # The engine's packed rows carry their attention layout in the kwargs of cfg's implementation; a model
        # built with another one would ignore them and attend across the row's sequences.
        loaded = getattr(m.config, "_attn_implementation", None) if m is not None else cfg.fsdp2.attn_implementation
        if loaded != cfg.fsdp2.attn_implementation:
            raise ValueError(
                f"the model was built with attn_implementation={loaded!r} but trainer.fsdp2.attn_implementation is "
                f"{cfg.fsdp2.attn_implementation!r}: load it with build.load_model(path, dtype, that implementation)"
            )
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    if lm_head_fp32 and cfg.dtype != "float32":  # in an fp32 run the head is fp32 already
        for m in (model, ref_model):
            if m is not None:
                install_fp32_lm_head(m)
    if cfg.fsdp2.compile_layers:  # before the wrappers: the compiled modules keep their names in the state dict
        compile_layers(model)
        compile_head()
    apply_activation_checkpointing(model, cfg.memory.activation_checkpointing)
    compute_dtype = _DTYPES[cfg.dtype]
    # On one rank a shard is the whole parameter: resharding after forward would only cast and copy
    # every layer's weights again for backward, for no memory saved but the bf16 copy.
    keep_unsharded = mesh.size() == 1 and not cfg.fsdp2.cpu_offload
    shard(model, mesh, compute_dtype, cfg.fsdp2.cpu_offload, device, reshard_after_forward=not keep_unsharded)
    install_packed_logprobs(model)
    if ref_model is not None:
        ref_model.requires_grad_(False).eval()
        if cfg.fsdp2.compile_layers:
            compile_layers(ref_model)
        shard(ref_model, mesh, compute_dtype, cfg.fsdp2.ref_cpu_offload, device)
        install_packed_logprobs(ref_model)
    # Fused AdamW: one kernel per step on GPU, one vectorised pass per tensor on CPU (offloaded shards too) in
    # place of ~8 ops each; the same kernel everywhere, so offloading changes no bit of the step.
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, fused=True)
    return Engine(FSDP2Backend(model, ref_model, optimizer, cfg, device), cfg, model_dir)


def shard(
    model: nn.Module,
    mesh: DeviceMesh,
    compute_dtype: torch.dtype,
    offload: bool,
    device: torch.device,
    reshard_after_forward: bool = True,
) -> None:
    """One FSDP unit per decoder layer, so only one layer's full weights exist at a time (between forward
    and backward too, unless reshard_after_forward is False).

    Except on one rank in fp32 without offload: there every unit would hold its whole layer and FSDP2 would only
    add DTensor bookkeeping to each forward, backward and optimizer step (a sixth of a 135M step on 2 CPU
    cores: bench/README.md), so the model stays a plain module on the device, the same arithmetic bit for bit.
    """
    if mesh.size() == 1 and not offload and compute_dtype == torch.float32:
        model.to(device)
        return
    # Parameters stay in their loaded dtype (fp32 master weights); forward/backward run in compute_dtype
    # and gradients are reduced in fp32, so bf16 rounding never accumulates across ranks.
    mp = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    # fully_shard moves the shards to the mesh's device, or keeps them in (pinned) CPU memory when offloading.
    offload_policy = CPUOffloadPolicy(pin_memory=device.type == "cuda") if offload else OffloadPolicy()
    for layer in model.model.layers:
        fully_shard(
            layer, mesh=mesh, mp_policy=mp, offload_policy=offload_policy, reshard_after_forward=reshard_after_forward
        )
    fully_shard(model, mesh=mesh, mp_policy=mp, offload_policy=offload_policy)


def compile_layers(model: nn.Module) -> None:
    """Compile each decoder layer's RMSNorms and MLP in place (one graph each, shared by all layers).

    Regional, not the whole layer: attention takes per-row Python kwargs (sequence lengths) that would
    make dynamo recompile for every micro-batch. dynamic=True: row lengths differ on every micro-batch.
    """
    for layer in model.model.layers:
        for module in (layer.input_layernorm, layer.post_attention_layernorm, layer.mlp):
            module.compile(dynamic=True)
    model.model.norm.compile(dynamic=True)
    compile_rotary(model)


_COMPILED_ROTARY: dict[str, Callable] = {}


def compile_rotary(model: nn.Module) -> None:
    """HF's apply_rotary_pos_emb is ~6 elementwise kernels per layer forward and more in backward (8 % of
    a 1.5B step on the H200); compiled, one kernel each way. It is a function of the model's modeling
    module, looked up at call time, so the compiled one replaces it there (for every model of that family
    in this process, the same math)."""
    modeling = sys.modules[type(model.model.layers[0].self_attn).__module__]
    fn = getattr(modeling, "apply_rotary_pos_emb", None)
    if fn is None or modeling.__name__ in _COMPILED_ROTARY:
        return
    _COMPILED_ROTARY[modeling.__name__] = modeling.apply_rotary_pos_emb = torch.compile(fn, dynamic=True)


def apply_activation_checkpointing(model: nn.Module, mode: str) -> None:
    """Wrap each decoder layer (before sharding, so FSDP's gathers stay outside the recomputed region)."""
    if mode == "off":
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    if mode == "layer":
        options = {}
    elif mode == "selective":
        options = {"context_fn": _selective_contexts}
    else:
        raise ValueError(f"trainer.memory.activation_checkpointing must be off, layer or selective, got {mode!r}")
    layers = model.model.layers
    for i, layer in enumerate(layers):
        layers[i] = checkpoint_wrapper(layer, preserve_rng_state=False, **options)


def _selective_contexts():
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    aten = torch.ops.aten
    saved = {getattr(aten, name).default for name in _SAVED_OPS if hasattr(aten, name)}

    def policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
        return CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)
