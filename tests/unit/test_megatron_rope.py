"""The Megatron backend's RoPE over a packed row equals transformers' Qwen2 rotary embedding applied to each
sequence on its own (positions restart per sequence), without CUDA or megatron-core."""

import torch
from transformers import Qwen2Config
from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding, apply_rotary_pos_emb

from services.trainer.megatron.rope import rope_tables, rotate_qk


def test_packed_rope_equals_hf_per_sequence():
    heads, kv_heads, head_dim, theta, lens = 4, 2, 16, 1e6, (5, 7, 3)
    cfg = Qwen2Config(hidden_size=heads * head_dim, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      rope_theta=theta, max_position_embeddings=64)  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    q_THD = torch.randn(sum(lens), heads, head_dim, generator=gen)
    k_TKD = torch.randn(sum(lens), kv_heads, head_dim, generator=gen)
    positions_T = torch.cat([torch.arange(n) for n in lens])

    cos, sin = rope_tables(positions_T, head_dim, theta, torch.float32)
    q_got, k_got = rotate_qk(q_THD, k_TKD, cos, sin)

    rotary, start = Qwen2RotaryEmbedding(cfg), 0
    for n in lens:
        span = slice(start, start + n)
        q_1HnD, k_1KnD = q_THD[span].transpose(0, 1)[None], k_TKD[span].transpose(0, 1)[None]
        hf_cos, hf_sin = rotary(q_1HnD, torch.arange(n)[None])
        q_hf, k_hf = apply_rotary_pos_emb(q_1HnD, k_1KnD, hf_cos, hf_sin)
        assert (q_got[span] - q_hf[0].transpose(0, 1)).abs().max() < 1e-5
        assert (k_got[span] - k_hf[0].transpose(0, 1)).abs().max() < 1e-5
        start += n
    assert not torch.allclose(q_got, q_THD)  # positions other than 0 were rotated
