"""Per-token weights that turn summed token losses into the batch loss: token-mean, sequence-mean, Dr.GRPO.

The trainer sums weight * loss over every token of every micro-batch and rank, so each weight must
already hold the batch-wide normaliser: that keeps the gradient exact however the batch is split.

mask_N (1 on the policy's tokens, 0 on those an environment wrote into a multi-turn episode; None: all 1) gives
the environment's tokens weight 0, and the normalisers count the policy's tokens only.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _mask(response_lens_B: Tensor, mask_N: Tensor | None) -> Tensor:
    num_tokens = int(response_lens_B.sum())
    if mask_N is None:
        return torch.ones(num_tokens)
    assert mask_N.numel() == num_tokens, f"{mask_N.numel()} mask values for {num_tokens} response tokens"
    return mask_N.float().cpu()


def token_mean_weights(response_lens_B: Tensor, mask_N: Tensor | None = None) -> Tensor:
    """1 / N for each of the batch's N (policy) response tokens (GRPO / DAPO token-level loss)."""
    mask = _mask(response_lens_B, mask_N)
    num_tokens = float(mask.sum())
    assert num_tokens > 0, "a batch needs at least one response token of the policy"
    return mask / num_tokens


def sequence_mean_weights(response_lens_B: Tensor, mask_N: Tensor | None = None) -> Tensor:
    """1 / (B * len_i) for the tokens of sequence i, len_i counting its policy tokens: every sequence counts
    equally (GSPO)."""
    mask = _mask(response_lens_B, mask_N)
    segment_N = torch.repeat_interleave(torch.arange(response_lens_B.numel()), response_lens_B)
    counted_B = torch.zeros(response_lens_B.numel(), dtype=torch.float64).index_add(0, segment_N, mask.double())
    per_seq_B = 1.0 / (response_lens_B.numel() * counted_B.clamp(min=1.0))
    return (per_seq_B[segment_N] * mask.double()).float()


def constant_length_weights(response_lens_B: Tensor, max_tokens: int, mask_N: Tensor | None = None) -> Tensor:
    """1 / (B * max_tokens) for every policy token: Dr.GRPO's length-unbiased normaliser (arXiv 2503.20783).

    Dividing by each response's own length favours short correct answers and long wrong ones; a
    constant keeps every token's gradient the same size.
    """
    if max_tokens < 1:
        raise ValueError(f"Dr.GRPO's normaliser must be >= 1 token, got {max_tokens}")
    return _mask(response_lens_B, mask_N) / (response_lens_B.numel() * max_tokens)
