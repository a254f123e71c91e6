"""Per-token weights that turn summed token losses into the batch loss: token-mean, sequence-mean, Dr.GRPO.

The trainer sums weight * loss over every token of every micro-batch and rank, so each weight must
already hold the batch-wide normaliser: that keeps the gradient exact however the batch is split.
"""

from __future__ import annotations

import torch
from torch import Tensor


def token_mean_weights(response_lens_B: Tensor) -> Tensor:
    """1 / N for each of the batch's N response tokens (GRPO / DAPO token-level loss)."""
    num_tokens = int(response_lens_B.sum())
    assert num_tokens > 0, "a batch needs at least one response token"
    return torch.full((num_tokens,), 1.0 / num_tokens)


def sequence_mean_weights(response_lens_B: Tensor) -> Tensor:
    """1 / (B * len_i) for the tokens of sequence i: every sequence counts equally (GSPO)."""
    per_seq_B = 1.0 / (response_lens_B.numel() * response_lens_B.double())
    return torch.repeat_interleave(per_seq_B, response_lens_B).float()


def constant_length_weights(response_lens_B: Tensor, max_tokens: int) -> Tensor:
    """1 / (B * max_tokens) for every token: Dr.GRPO's length-unbiased normaliser (arXiv 2503.20783).

    Dividing by each response's own length favours short correct answers and long wrong ones; a
    constant keeps every token's gradient the same size.
    """
    if max_tokens < 1:
        raise ValueError(f"Dr.GRPO's normaliser must be >= 1 token, got {max_tokens}")
    num_tokens = int(response_lens_B.sum())
    return torch.full((num_tokens,), 1.0 / (response_lens_B.numel() * max_tokens))
