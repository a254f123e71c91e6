"""DAPO's clip-higher: the PPO clipped surrogate with separate lower and upper clip ranges."""

from __future__ import annotations

import torch
from torch import Tensor


def clip_higher_token_loss(
    logp_T: Tensor,
    old_logp_T: Tensor,
    advantages_T: Tensor,
    clip_eps_low: float,
    clip_eps_high: float,
) -> Tensor:
    """Per-token clipped surrogate with the ratio clamped to [1 - eps_low, 1 + eps_high], negated.

    A larger upper range lets low-probability tokens with positive advantage grow, which keeps the
    policy's entropy from collapsing (DAPO, arXiv 2503.14476).
    """
    ratio_T = torch.exp(logp_T - old_logp_T)
    clipped_T = torch.clamp(ratio_T, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
    surrogate_T = torch.minimum(ratio_T * advantages_T, clipped_T * advantages_T)
    return -surrogate_T
