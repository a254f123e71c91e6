"""Entropy bonus: rewards keeping the policy's next-token distribution spread out."""

from __future__ import annotations

from torch import Tensor


def entropy_bonus_token_loss(entropy_T: Tensor, coef: float) -> Tensor:
    """-coef * H per token (H from token_logprobs_and_entropy), so minimising the loss raises entropy."""
    return -coef * entropy_T
