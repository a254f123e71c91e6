"""Build Megatron-core GPT models from an HF checkpoint: parallel state, layer spec, HF weights, DDP, optimizer."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.transformer_layer import get_transformer_layer_offset
from safetensors import safe_open

from .attention import PackedFlashAttention
from .hf_config import Shape, check_layout, shape_of, transformer_config_kwargs
from .mapping import Layout


def init_parallel(tp: int, pp: int, seed: int) -> None:
    """Megatron's TP / PP / DP groups over the already-initialised default group (idempotent)."""
    if parallel_state.model_parallel_is_initialized():
        have = (
            parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_pipeline_model_parallel_world_size(),
        )
        if have != (tp, pp):
            raise ValueError(f"Megatron parallel state is already (tp, pp) = {have}, not {(tp, pp)}")
        return
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    model_parallel_cuda_manual_seed(seed)


def read_shape(model_dir: Path) -> Shape:
    return shape_of(json.loads((model_dir / "config.json").read_text()))


def transformer_config(shape: Shape, tp: int, pp: int, bf16: bool, recompute: str, world: int) -> TransformerConfig:
    check_layout(shape, tp, pp, world)
    dtype = torch.bfloat16 if bf16 else torch.float32
    kwargs = transformer_config_kwargs(shape, tp=tp, pp=pp, bf16=bf16, recompute=recompute)
    return TransformerConfig(**kwargs, activation_func=F.silu, params_dtype=dtype, pipeline_dtype=dtype)


def layer_spec():
    """Megatron's local spec (no Transformer Engine) with the packed flash attention as core attention."""
    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    spec.submodules.self_attention.submodules.core_attention = PackedFlashAttention
    return spec


def build_gpt(config: TransformerConfig, shape: Shape) -> GPTModel:
    """This pipeline stage's share of the model on the current GPU (random init, replaced by load_hf)."""
    model = GPTModel(
        config=config,
        transformer_layer_spec=layer_spec(),
        vocab_size=shape.vocab_size,
        max_sequence_length=shape.max_positions,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=shape.tied,
        position_embedding_type="none",  # PackedFlashAttention rotates q and k itself
    )
    # The local spec's torch RMSNorms are created in fp32 whatever params_dtype says (Megatron-LM casts the
    # whole model in its Float16Module); in the compute dtype they take torch's fused rms_norm kernel.
    return model.to(device=torch.cuda.current_device(), dtype=config.params_dtype)


def layout(config: TransformerConfig, shape: Shape) -> Layout:
    return Layout(
        shape=shape,
        tp_size=parallel_state.get_tensor_model_parallel_world_size(),
        tp_rank=parallel_state.get_tensor_model_parallel_rank(),
        layer_offset=get_transformer_layer_offset(config),
    )


def hf_source(name: str, shape: Shape) -> str:
    """Megatron's tied output layer on a last stage that lacks the embedding is a copy of embed_tokens."""
    return "embedding.word_embeddings.weight" if name == "output_layer.weight" and shape.tied else name


@torch.no_grad()
def load_hf(model: GPTModel, model_dir: Path, lay: Layout) -> None:
    """Copy every parameter's shard out of the HF safetensors files (only the tensors this stage needs)."""
    from . import mapping

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {model_dir}")
    where = {}
    for f in files:
        with safe_open(f, "pt") as st:
            where.update({k: f for k in st.keys()})
    for name, param in model.named_parameters():
        source = hf_source(name, lay.shape)
        needed = mapping.hf_sources(source, lay)
        missing = [n for n in needed if n not in where]
        if missing:
            raise KeyError(f"{model_dir} lacks {missing} (for Megatron parameter {name})")
        hf = {}
        for n in needed:
            with safe_open(where[n], "pt", device=str(param.device)) as st:
                hf[n] = st.get_tensor(n)
        shard = mapping.to_megatron(source, hf, lay)
        if shard.shape != param.shape:
            raise ValueError(f"{name}: HF gives {tuple(shard.shape)}, Megatron expects {tuple(param.shape)}")
        param.copy_(shard)


def wrap_ddp(model: GPTModel, config: TransformerConfig) -> DistributedDataParallel:
    ddp = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=True, bucket_size=None
    )
    return DistributedDataParallel(config=config, ddp_config=ddp, module=model)


def optimizer(model: DistributedDataParallel, lr: float, weight_decay: float, max_grad_norm: float, bf16: bool):
    """Adam(W) with fp32 main weights sharded over data-parallel ranks (Megatron's distributed optimizer)."""
    cfg = OptimizerConfig(
        optimizer="adam", lr=lr, weight_decay=weight_decay, adam_beta1=0.9, adam_beta2=0.999, adam_eps=1e-8,
        bf16=bf16, params_dtype=torch.bfloat16 if bf16 else torch.float32, use_distributed_optimizer=True,
        clip_grad=max_grad_norm,
    )  # fmt: skip
    opt = get_megatron_optimizer(cfg, [model])
    # Without Transformer Engine or Apex Megatron falls back to torch's AdamW in its multi-tensor (foreach)
    # form; the fused CUDA kernel does the same update in one pass over the fp32 state.
    for part in getattr(opt, "chained_optimizers", [opt]):
        for group in part.optimizer.param_groups:
            group.update(foreach=False, fused=True)
    return opt
