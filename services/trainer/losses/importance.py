"""Truncated importance sampling (TIS) of the rollout engine / trainer mismatch, per token or per sequence."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _truncated_exp(log_weights: Tensor, truncation: float) -> Tensor:
    # Clamp on the log scale: a sequence-level log weight can exceed fp32's exp range (~88), and
    # min(inf, C) must still be C rather than inf or NaN.
    return torch.exp(torch.clamp(log_weights.detach(), max=math.log(truncation)))


def token_is_weights(old_logp_T: Tensor, rollout_logp_T: Tensor, truncation: float) -> Tensor:
    """min(pi_trainer / pi_rollout, truncation) per token, without gradient.

    The rollout engine sampled from its own (slightly different) numerics; weighting the loss by this
    ratio makes the gradient the trainer policy's, and truncation bounds the variance (Yao et al. 2025).
    """
    return _truncated_exp(old_logp_T - rollout_logp_T, truncation)


def sequence_is_weights(
    old_logp_T: Tensor,
    rollout_logp_T: Tensor,
    segment_T: Tensor,
    num_segments: int,
    truncation: float,
    mask_T: Tensor | None = None,
) -> Tensor:
    """min(prod_t pi_trainer / pi_rollout, truncation) of each token's sequence, without gradient; the product runs
    over the tokens where mask_T is 1 (the policy's; all where None)."""
    diff_T = old_logp_T - rollout_logp_T
    if mask_T is not None:
        diff_T = diff_T * mask_T.to(diff_T.dtype)
    log_weight_S = torch.zeros(num_segments, dtype=diff_T.dtype, device=diff_T.device).index_add(0, segment_T, diff_T)
    return _truncated_exp(log_weight_S, truncation)[segment_T]
