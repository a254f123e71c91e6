"""GRPO's token-level clipped policy loss (symmetric clip range)."""

from __future__ import annotations

from torch import Tensor

from .dapo import clip_higher_token_loss


def grpo_token_loss(logp_T: Tensor, old_logp_T: Tensor, advantages_T: Tensor, clip_eps: float) -> Tensor:
    """Per-token PPO clipped surrogate, negated for minimisation.

    Token-level (DAPO / Dr. GRPO style): the caller sums over tokens and divides by the batch's token
    count, so long responses are not down-weighted per token.
    """
    return clip_higher_token_loss(logp_T, old_logp_T, advantages_T, clip_eps, clip_eps)
