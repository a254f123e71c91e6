"""GSPO: one importance ratio per sequence (geometric mean of its token ratios), clipped per sequence."""

from __future__ import annotations

import torch
from torch import Tensor


def segment_mean(values_T: Tensor, segment_T: Tensor, num_segments: int, mask_T: Tensor | None = None) -> Tensor:
    """Mean of values_T within each segment (sequence), over the tokens where mask_T is 1 (all where None); one
    value per segment."""
    weights_T = torch.ones_like(values_T) if mask_T is None else mask_T.to(values_T.dtype)
    sums_S = torch.zeros(num_segments, dtype=values_T.dtype, device=values_T.device)
    counts_S = torch.zeros_like(sums_S)
    sums_S = sums_S.index_add(0, segment_T, values_T * weights_T)
    counts_S = counts_S.index_add(0, segment_T, weights_T)
    return sums_S / counts_S.clamp(min=1.0)


def gspo_token_loss(
    logp_T: Tensor,
    old_logp_T: Tensor,
    advantages_T: Tensor,
    segment_T: Tensor,
    num_segments: int,
    clip_eps_low: float,
    clip_eps_high: float,
    mask_T: Tensor | None = None,
) -> Tensor:
    """GSPO-token loss per token, negated: every token of sequence i carries s_i = exp(mean_t log ratio).

    Written as s_i,t = sg[s_i] * exp(logp_t - sg[logp_t]) (GSPO-token, arXiv 2507.18071) so the value is
    s_i on each token and the gradient of the sequence mean of the token losses equals that of s_i.
    Aggregate with sequence-mean weights (1 / (num_sequences * len_i)) to get GSPO's objective. mask_T (1 on the
    policy's tokens; None: all) keeps an environment's tokens out of the sequence ratio.
    """
    mean_log_ratio_S = segment_mean(logp_T - old_logp_T, segment_T, num_segments, mask_T)
    seq_ratio_T = torch.exp(mean_log_ratio_S)[segment_T]
    ratio_T = seq_ratio_T.detach() * torch.exp(logp_T - logp_T.detach())
    clipped_T = torch.clamp(ratio_T, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
    surrogate_T = torch.minimum(ratio_T * advantages_T, clipped_T * advantages_T)
    return -surrogate_T
