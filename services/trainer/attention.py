"""`sdpa_varlen`: causal sdpa per packed sequence, registered as a transformers attention implementation."""

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
    **kwargs,
) -> tuple[Tensor, None]:
    """One causal sdpa call per sequence of the packed row (lengths from packed_seq_lens).

    transformers' own sdpa path turns packed position ids into a T x T block-causal mask, which rules
    out the flash kernel and spends FLOPs on every cross-sequence pair; per-sequence calls are exact,
    need no mask and reach the flash kernel on GPU. transformers builds no mask for an implementation
    it does not know, so attention_mask arrives as None.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if packed_seq_lens is None:  # an unpacked forward (a dummy pass): one sequence
        return sdpa_attention_forward(module, query_1HTD, key_1HKD, value_1HKD, attention_mask, **kwargs)
    assert attention_mask is None, "sdpa_varlen expects transformers to build no mask"
    assert sum(packed_seq_lens) == query_1HTD.shape[2], "packed_seq_lens must cover the row"
    outputs, start = [], 0
    for num_tokens in packed_seq_lens:
        span = slice(start, start + num_tokens)
        out_1SHD, _ = sdpa_attention_forward(
            module, query_1HTD[:, :, span], key_1HKD[:, :, span], value_1HKD[:, :, span], None, **kwargs
        )
        outputs.append(out_1SHD)
        start += num_tokens
    return torch.cat(outputs, dim=1), None


def register_attention() -> None:
    """Make `sdpa_varlen` a valid attn_implementation (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(SDPA_VARLEN, sdpa_varlen_attention)
