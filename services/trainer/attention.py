"""`sdpa_varlen`: causal attention per packed block (one flash varlen call per row on CUDA, else one
sdpa call per block), registered as a transformers attention implementation; the masks of blocks whose prompt
is shared by several responses."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

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
    packed_block_masks: Sequence[Tensor | None] | None = None,
    packed_shared_flash: SharedFlashLayout | None = None,
    **kwargs,
) -> tuple[Tensor, None]:
    """Causal attention within each block of the packed row (lengths from packed_seq_lens); a block with a mask
    in packed_block_masks (a prompt shared by several responses: shared_prompt_mask) attends under that mask;
    given packed_shared_flash (the engine's choice on CUDA in bf16), the whole row is one flash varlen call.

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
    scale = kwargs.get("scaling")
    if packed_shared_flash is not None:
        if not flash_varlen_supported(query_1HTD):
            raise RuntimeError(
                f"a row with shared prompts was laid out for the flash varlen kernel, which cannot run here "
                f"({query_1HTD.device.type}, {query_1HTD.dtype}): set trainer.fsdp2.flash_varlen = false"
            )
        return flash_varlen_shared(query_1HTD, key_1HKD, value_1HKD, packed_shared_flash, scale), None
    masks = packed_block_masks or [None] * len(packed_seq_lens)
    shared = any(m is not None for m in masks)
    if packed_cu_seqlens is not None and not shared and flash_varlen_supported(query_1HTD):
        return flash_varlen(query_1HTD, key_1HKD, value_1HKD, packed_cu_seqlens, max(packed_seq_lens), scale), None
    outputs, start = [], 0
    for num_tokens, mask_SS in zip(packed_seq_lens, masks, strict=True):
        span = slice(start, start + num_tokens)
        mask = None if mask_SS is None else mask_SS[None, None]
        out_1SHD, _ = sdpa_attention_forward(
            module, query_1HTD[:, :, span], key_1HKD[:, :, span], value_1HKD[:, :, span], mask, **kwargs
        )
        outputs.append(out_1SHD)
        start += num_tokens
    return torch.cat(outputs, dim=1), None


def shared_prompt_mask(prompt_len: int, response_lens: Sequence[int]) -> Tensor:
    """[G, G] bool, True where a query token may attend, for a prompt followed by several responses: causal
    within the prompt; each response sees the whole prompt and itself causally, never another response."""
    lens = torch.tensor([prompt_len, *response_lens])
    segment_G = torch.repeat_interleave(torch.arange(len(lens)), lens)
    num_tokens = int(lens.sum())
    causal_GG = torch.ones(num_tokens, num_tokens, dtype=torch.bool).tril()
    return causal_GG & ((segment_G[None, :] == 0) | (segment_G[None, :] == segment_G[:, None]))


def block_masks(seq_lens: Sequence[int], block_responses: Sequence[Sequence[int]]) -> list[Tensor | None]:
    """Per block of a packed row: None for one sequence (causal), else its shared_prompt_mask."""
    return [
        None if len(responses) <= 1 else shared_prompt_mask(num_tokens - sum(responses), responses)
        for num_tokens, responses in zip(seq_lens, block_responses, strict=True)
    ]


def row_mask(seq_lens: Sequence[int], block_responses: Sequence[Sequence[int]]) -> Tensor:
    """The whole row's [1, 1, T, T] bool mask (block-diagonal: causal blocks and shared-prompt blocks), for
    transformers' own sdpa, which takes a 4D mask as given."""
    blocks = [
        torch.ones(n, n, dtype=torch.bool).tril() if m is None else m
        for n, m in zip(seq_lens, block_masks(seq_lens, block_responses), strict=True)
    ]
    return torch.block_diag(*blocks)[None, None]


@dataclass(frozen=True, slots=True)
class SharedFlashLayout:
    """A row with shared prompts as one flash varlen call. The query sequences are the row's runs in row order
    (a whole unshared block; a shared block's prompt, then each of its responses); each response's keys are its
    prompt's, gathered again, followed by its own, so the kernel's bottom-right causal alignment (a query sees every
    key up to its own position counted from the end) gives it the whole prompt and itself causally."""

    cu_q_S1: Tensor
    """int32 starts of the query sequences, and T."""
    cu_k_S1: Tensor
    """int32 starts of the key sequences in the gathered keys, and their total."""
    kv_index_K: Tensor
    """Row position of each gathered key."""
    max_q: int
    max_k: int

    def to(self, device: torch.device) -> SharedFlashLayout:
        moved = (t.to(device, non_blocking=True) for t in (self.cu_q_S1, self.cu_k_S1, self.kv_index_K))
        return SharedFlashLayout(*moved, self.max_q, self.max_k)


def shared_flash_layout(seq_lens: Sequence[int], block_responses: Sequence[Sequence[int]]) -> SharedFlashLayout:
    q_lens, k_lens, kv_index, start = [], [], [], 0
    for num_tokens, responses in zip(seq_lens, block_responses, strict=True):
        prompt_len = num_tokens - sum(responses) if len(responses) > 1 else num_tokens
        q_lens.append(prompt_len)
        k_lens.append(prompt_len)
        kv_index.extend(range(start, start + prompt_len))
        cursor = start + prompt_len
        for response_len in responses if len(responses) > 1 else ():
            if response_len:
                q_lens.append(response_len)
                k_lens.append(prompt_len + response_len)
                kv_index.extend([*range(start, start + prompt_len), *range(cursor, cursor + response_len)])
                cursor += response_len
        start += num_tokens
    cu_q, cu_k = (torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32) for lens in (q_lens, k_lens))
    return SharedFlashLayout(cu_q, cu_k, torch.tensor(kv_index), max(q_lens), max(k_lens))


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
    cu, n = cu_seqlens_S1, max_len
    return _flash_varlen_forward(q_THD, k_TKD, v_TKD, cu, cu, n, n, scale).unsqueeze(0)


def flash_varlen_shared(
    query_1HTD: Tensor, key_1HKD: Tensor, value_1HKD: Tensor, layout: SharedFlashLayout, scale: float | None
) -> Tensor:
    """flash_varlen over a row with shared prompts (SharedFlashLayout); the gather's backward adds every
    response's gradient into its prompt's keys and values."""
    q_THD, k_TKD, v_TKD = (x[0].transpose(0, 1).contiguous() for x in (query_1HTD, key_1HKD, value_1HKD))
    k_KKD, v_KKD = k_TKD[layout.kv_index_K], v_TKD[layout.kv_index_K]
    cu_q, cu_k = layout.cu_q_S1, layout.cu_k_S1
    return _flash_varlen_forward(q_THD, k_KKD, v_KKD, cu_q, cu_k, layout.max_q, layout.max_k, scale).unsqueeze(0)


def _flash_varlen_forward(
    q_THD: Tensor, k_TKD: Tensor, v_TKD: Tensor, cu_q: Tensor, cu_k: Tensor, max_q: int, max_k: int, scale: float | None
) -> Tensor:
    return torch.ops.aten._flash_attention_forward(
        q_THD, k_TKD, v_TKD, cu_q, cu_k, max_q, max_k, 0.0, True, False, scale=scale
    )[0]


def register_attention() -> None:
    """Make `sdpa_varlen` a valid attn_implementation (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(SDPA_VARLEN, sdpa_varlen_attention)
