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

from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.module import MegatronModule
from torch import Tensor

from ..attention import _flash_varlen_forward
from .rope import rotate_qk


@dataclass
class PackedRow(PackedSeqParams):
    """Megatron's packed-sequence parameters plus the row's rotary cos/sin ([tokens, 1, head_dim])."""

    cos_T1D: Tensor | None = None
    sin_T1D: Tensor | None = None


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
        q_THD, k_TKD = rotate_qk(query, key, row.cos_T1D, row.sin_T1D)
        cu, n = row.cu_seqlens_q, row.max_seqlen_q  # self-attention: the keys' blocks are the queries'
        out_THD = _flash_varlen_forward(
            q_THD.contiguous(), k_TKD.contiguous(), value.contiguous(), cu, cu, n, n, self.softmax_scale
        )
        return out_THD.reshape(out_THD.shape[0], -1)
