"""HF <-> Megatron-core names and layouts (local layer spec), pure torch.

Megatron fuses q, k and v into one `linear_qkv` whose rows go group by group, [q heads of the group, k,
v], and gate and up into one `linear_fc1`, [gate; up]; tensor parallelism splits each by kv group / by
rows of gate and up, row-parallel layers (`linear_proj`, `linear_fc2`) by columns, and the vocabulary
by rows. `to_megatron` gives a rank its shard of an HF tensor; `to_hf` turns the gathered shards of a
Megatron parameter back into HF tensors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import Tensor

from .hf_config import Shape

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
# Megatron layer suffix -> (HF suffix, how TP splits it): "col" rows, "row" columns, "rep" replicated.
_LAYER_PARAMS = {
    "input_layernorm.weight": ("input_layernorm.weight", "rep"),
    "pre_mlp_layernorm.weight": ("post_attention_layernorm.weight", "rep"),
    "self_attention.linear_proj.weight": ("self_attn.o_proj.weight", "row"),
    "mlp.linear_fc2.weight": ("mlp.down_proj.weight", "row"),
}
_GLOBAL_PARAMS = {
    "embedding.word_embeddings.weight": ("model.embed_tokens.weight", "col"),
    "decoder.final_layernorm.weight": ("model.norm.weight", "rep"),
    "output_layer.weight": ("lm_head.weight", "col"),
}
_QKV = {"self_attention.linear_qkv.weight": "weight", "self_attention.linear_qkv.bias": "bias"}


@dataclass(frozen=True, slots=True)
class Layout:
    shape: Shape
    tp_size: int = 1
    tp_rank: int = 0
    layer_offset: int = 0
    """Global index of this pipeline stage's first layer (Megatron numbers layers per stage from 0)."""


def megatron_names(layout: Layout, num_local_layers: int, first: bool, last: bool) -> list[str]:
    """Every parameter name of one pipeline stage's GPTModel, in the local layer numbering."""
    names = ["embedding.word_embeddings.weight"] if first else []
    for i in range(num_local_layers):
        names += [f"decoder.layers.{i}.{s}" for s in _LAYER_PARAMS]
        names += [f"decoder.layers.{i}.self_attention.linear_qkv.weight", f"decoder.layers.{i}.mlp.linear_fc1.weight"]
        if layout.shape.qkv_bias:
            names.append(f"decoder.layers.{i}.self_attention.linear_qkv.bias")
    if last:
        names.append("decoder.final_layernorm.weight")
        if not layout.shape.tied:
            names.append("output_layer.weight")
    return names


def hf_sources(name: str, layout: Layout) -> list[str]:
    """The HF tensors a Megatron parameter is built from."""
    if name in _GLOBAL_PARAMS:
        return [_GLOBAL_PARAMS[name][0]]
    prefix, suffix = _split(name, layout)
    if suffix in _LAYER_PARAMS:
        return [f"{prefix}.{_LAYER_PARAMS[suffix][0]}"]
    if suffix in _QKV:
        return [f"{prefix}.self_attn.{p}_proj.{_QKV[suffix]}" for p in "qkv"]
    if suffix == "mlp.linear_fc1.weight":
        return [f"{prefix}.mlp.gate_proj.weight", f"{prefix}.mlp.up_proj.weight"]
    raise KeyError(f"no HF mapping for Megatron parameter {name!r}")


def to_megatron(name: str, hf: dict[str, Tensor], layout: Layout) -> Tensor:
    """This TP rank's shard of Megatron parameter `name`, from the HF tensors hf_sources(name) names."""
    srcs = [hf[s] for s in hf_sources(name, layout)]
    tp, r = layout.tp_size, layout.tp_rank
    if name in _GLOBAL_PARAMS:
        return _shard(srcs[0], _GLOBAL_PARAMS[name][1], tp, r)
    _, suffix = _split(name, layout)
    if suffix in _LAYER_PARAMS:
        return _shard(srcs[0], _LAYER_PARAMS[suffix][1], tp, r)
    if suffix in _QKV:
        return _fuse_qkv(*srcs, layout.shape, tp, r)
    gate, up = srcs
    return torch.cat([gate.chunk(tp, 0)[r], up.chunk(tp, 0)[r]])


def to_hf(name: str, shards: list[Tensor], layout: Layout) -> dict[str, Tensor]:
    """The HF tensors of Megatron parameter `name` from its TP shards in rank order (inverse of to_megatron)."""
    targets = hf_sources(name, layout)
    if name in _GLOBAL_PARAMS:
        return {targets[0]: _unshard(shards, _GLOBAL_PARAMS[name][1])}
    _, suffix = _split(name, layout)
    if suffix in _LAYER_PARAMS:
        return {targets[0]: _unshard(shards, _LAYER_PARAMS[suffix][1])}
    if suffix in _QKV:
        parts = [_split_qkv(s, layout.shape, len(shards)) for s in shards]
        return {t: torch.cat([p[i] for p in parts]) for i, t in enumerate(targets)}
    halves = [s.chunk(2, 0) for s in shards]
    return {targets[0]: torch.cat([h[0] for h in halves]), targets[1]: torch.cat([h[1] for h in halves])}


def _split(name: str, layout: Layout) -> tuple[str, str]:
    m = _LAYER.match(name)
    if not m:
        raise KeyError(f"no HF mapping for Megatron parameter {name!r}")
    return f"model.layers.{int(m.group(1)) + layout.layer_offset}", m.group(2)


def _shard(t: Tensor, how: str, tp: int, rank: int) -> Tensor:
    if how == "rep":
        return t
    return t.chunk(tp, dim=0 if how == "col" else 1)[rank]


def _unshard(shards: list[Tensor], how: str) -> Tensor:
    if how == "rep":
        return shards[0]
    return torch.cat(shards, dim=0 if how == "col" else 1)


def _fuse_qkv(q: Tensor, k: Tensor, v: Tensor, shape: Shape, tp: int, rank: int) -> Tensor:
    """Rows [q heads of group g, k_g, v_g] for each kv group g this rank holds (weights or biases)."""
    groups = shape.num_kv_heads
    per_group = shape.num_heads // groups
    q_g = q.reshape(groups, per_group * shape.head_dim, *q.shape[1:])
    k_g = k.reshape(groups, shape.head_dim, *k.shape[1:])
    v_g = v.reshape(groups, shape.head_dim, *v.shape[1:])
    fused = torch.cat([q_g, k_g, v_g], dim=1)  # [groups, (per_group + 2) * head_dim, ...]
    local = fused.chunk(tp, dim=0)[rank]
    return local.reshape(-1, *q.shape[1:]).contiguous()


def _split_qkv(fused: Tensor, shape: Shape, tp: int) -> tuple[Tensor, Tensor, Tensor]:
    groups = shape.num_kv_heads // tp
    per_group = shape.num_heads // shape.num_kv_heads
    g = fused.reshape(groups, (per_group + 2) * shape.head_dim, *fused.shape[1:])
    q, k, v = g.split([per_group * shape.head_dim, shape.head_dim, shape.head_dim], dim=1)
    return tuple(x.reshape(-1, *fused.shape[1:]) for x in (q, k, v))
