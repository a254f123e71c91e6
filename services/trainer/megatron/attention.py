"""Packed causal attention for Megatron's layer spec: RoPE per packed sequence, then one flash varlen call.

Megatron's local DotProductAttention materialises [heads, seq, seq] scores (it ran out of memory at 8 x 2048
tokens on an H200) and refuses packed sequences; Transformer Engine's fused attention cannot be brought to our
GPU machine. This module takes the `core_attention` slot of the local spec instead: the packed row arrives
in Megatron's `thd` layout ([tokens, heads, head_dim]) and goes through aten's flash varlen kernel (GQA kv
heads as they are, causal within each cu_seqlens span), so no seq^2 tensor ever exists.

RoPE is applied here rather than by GPTModel (built with position_embedding_type="none"): the row's
positions restart per sequence, and one gather of a cos/sin table by position id rotates the whole row
in a few fused pointwise ops, where Megatron's `thd` RoPE loops over the sequences with a host sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.module import MegatronModule
from torch import Tensor

from ..attention import _flash_varlen_forward


@dataclass
class PackedRow(PackedSeqParams):
    """Megatron's packed-sequence parameters plus the row's rotary cos/sin ([tokens, 1, head_dim])."""

    cos_T1D: Tensor | None = None
    sin_T1D: Tensor | None = None


def rope_tables(position_ids_T: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """HF's default RoPE (rotate-half convention): fp32 angles, cast to the compute dtype."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=position_ids_T.device).float() / head_dim)
    angles_TD = position_ids_T.float()[:, None] * inv_freq[None, :]
    emb_TD = torch.cat([angles_TD, angles_TD], dim=-1)
    return emb_TD.cos().to(dtype)[:, None, :], emb_TD.sin().to(dtype)[:, None, :]


def _rotate(x_THD: Tensor, cos_T1D: Tensor, sin_T1D: Tensor) -> Tensor:
    x1, x2 = x_THD.chunk(2, dim=-1)
    return x_THD * cos_T1D + torch.cat([-x2, x1], dim=-1) * sin_T1D


def _rotate_qk(q_THD: Tensor, k_TKD: Tensor, cos_T1D: Tensor, sin_T1D: Tensor) -> tuple[Tensor, Tensor]:
    return _rotate(q_THD, cos_T1D, sin_T1D), _rotate(k_TKD, cos_T1D, sin_T1D)


# One inductor kernel for both rotations, forward and backward (row lengths vary: dynamic shapes).
_rotate_qk_compiled = torch.compile(_rotate_qk, dynamic=True)


class PackedFlashAttention(MegatronModule):
    """Drop-in `core_attention` (same constructor and forward as Megatron's DotProductAttention)."""

    def __init__(
        self, config, layer_number: int, attn_mask_type, attention_type: str, attention_dropout=None,
        softmax_scale: float | None = None, cp_comm_type=None, pg_collection=None,
    ):  # fmt: skip
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("PackedFlashAttention does not do context parallelism")
        self.softmax_scale = softmax_scale or config.kv_channels**-0.5

    def forward(
        self, query: Tensor, key: Tensor, value: Tensor, attention_mask, attn_mask_type=None,
        attention_bias=None, packed_seq_params: PackedRow | None = None,
    ) -> Tensor:  # fmt: skip
        row = packed_seq_params
        if not isinstance(row, PackedRow) or row.qkv_format != "thd":
            raise ValueError("PackedFlashAttention takes packed rows only (a PackedRow in thd format)")
        q_THD, k_TKD = _rotate_qk_compiled(query, key, row.cos_T1D, row.sin_T1D)
        out_THD = _flash_varlen_forward(
            q_THD.contiguous(), k_TKD.contiguous(), value.contiguous(), row.cu_seqlens_q, row.max_seqlen_q,
            self.softmax_scale,
        )  # fmt: skip
        return out_THD.reshape(out_THD.shape[0], -1)
