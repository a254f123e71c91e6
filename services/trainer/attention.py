"""`sdpa_varlen`: causal attention per packed sequence (one flash varlen call per row on CUDA, else one
sdpa call per sequence), registered as a transformers attention implementation."""

from __future__ import annotations

import torch
from torch import Tensor, nn

SDPA_VARLEN = "sdpa_varlen"


def sdpa_varlen_attention(
    module: nn.Module,
    query_1HTD: Tensor,
    key_1HKD: Tensor,
    value_1HKD: Tensor,
    attention_mask: Tensor | None,
    packed_seq_lens: tuple[int, ...] | None = None,
    packed_cu_seqlens: Tensor | None = None,
    **kwargs,
) -> tuple[Tensor, None]:
    """Causal attention within each sequence of the packed row (lengths from packed_seq_lens).

    transformers' own sdpa path turns packed position ids into a T x T block-causal mask, which rules
    out the flash kernel and spends FLOPs on every cross-sequence pair; one sdpa call per sequence is exact,
    need no mask and reach the flash kernel on GPU. transformers builds no mask for an implementation
    it does not know, so attention_mask arrives as None. With packed_cu_seqlens (int32 sequence starts
    on the device, given by the engine on CUDA) a bf16/fp16 row takes one flash varlen call instead.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if packed_seq_lens is None:  # an unpacked forward (a dummy pass): one sequence
        return sdpa_attention_forward(module, query_1HTD, key_1HKD, value_1HKD, attention_mask, **kwargs)
    assert attention_mask is None, "sdpa_varlen expects transformers to build no mask"
    assert sum(packed_seq_lens) == query_1HTD.shape[2], "packed_seq_lens must cover the row"
    if packed_cu_seqlens is not None and flash_varlen_supported(query_1HTD):
        scale = kwargs.get("scaling")
        return flash_varlen(query_1HTD, key_1HKD, value_1HKD, packed_cu_seqlens, max(packed_seq_lens), scale), None
    outputs, start = [], 0
    for num_tokens in packed_seq_lens:
        span = slice(start, start + num_tokens)
        out_1SHD, _ = sdpa_attention_forward(
            module, query_1HTD[:, :, span], key_1HKD[:, :, span], value_1HKD[:, :, span], None, **kwargs
        )
        outputs.append(out_1SHD)
        start += num_tokens
    return torch.cat(outputs, dim=1), None


def flash_varlen_supported(query_1HTD: Tensor) -> bool:
    return (
        query_1HTD.is_cuda
        and query_1HTD.dtype in (torch.bfloat16, torch.float16)
        and hasattr(torch.ops.aten, "_flash_attention_forward")
        and torch.backends.cuda.flash_sdp_enabled()
    )


def flash_varlen(
    query_1HTD: Tensor, key_1HKD: Tensor, value_1HKD: Tensor, cu_seqlens_S1: Tensor, max_len: int, scale: float | None
) -> Tensor:
    """Causal attention within each [cu[i], cu[i+1]) span of the row, one kernel; returns [1, T, H, D].

    aten's flash op (what torch.nn.attention.varlen wraps; its positional signature is stable across
    releases, the wrapper's is not) has an autograd formula and takes GQA's fewer kv heads as they are.
    """
    # The kernel wants a unit-stride head dim; these are views of [1, T, H, D] tensors, so no copy.
    q_THD, k_TKD, v_TKD = (x[0].transpose(0, 1).contiguous() for x in (query_1HTD, key_1HKD, value_1HKD))
    return _flash_varlen_forward(q_THD, k_TKD, v_TKD, cu_seqlens_S1, max_len, scale).unsqueeze(0)


def _flash_varlen_forward(
    q_THD: Tensor, k_TKD: Tensor, v_TKD: Tensor, cu_seqlens_S1: Tensor, max_len: int, scale: float | None
) -> Tensor:
    cu = cu_seqlens_S1
    return torch.ops.aten._flash_attention_forward(
        q_THD, k_TKD, v_TKD, cu, cu, max_len, max_len, 0.0, True, False, scale=scale
    )[0]


def register_attention() -> None:
    """Make `sdpa_varlen` a valid attn_implementation (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(SDPA_VARLEN, sdpa_varlen_attention)
