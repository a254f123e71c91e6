"""The configured per-token objective: policy loss x importance weight + KL penalty - entropy bonus."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .losses import (
    clip_higher_token_loss,
    constant_length_weights,
    entropy_bonus_token_loss,
    grpo_token_loss,
    gspo_token_loss,
    k1_kl,
    k3_kl,
    sequence_is_weights,
    sequence_mean_weights,
    token_is_weights,
    token_mean_weights,
)

if TYPE_CHECKING:  # pydantic stays out of the import path: the GPU bench image lacks it
    from services.common.config import LossSection

LOSSES = ("grpo", "dapo", "gspo", "dr_grpo")


@dataclass(frozen=True, slots=True)
class TokenInputs:
    """One micro-batch's response tokens (R of them, from num_segments sequences)."""

    logp_R: Tensor
    """Current policy, with gradient."""
    old_logp_R: Tensor
    """Policy that the clip range is measured from (no gradient)."""
    advantages_R: Tensor
    rollout_logp_R: Tensor
    ref_logp_R: Tensor | None
    entropy_R: Tensor | None
    segment_R: Tensor
    """Index of each token's sequence within the micro-batch, in [0, num_segments)."""
    num_segments: int
    mask_R: Tensor | None = None
    """1 on the policy's tokens, 0 on an environment's (multi-turn); None: all the policy's. Their loss weights are
    0 already (loss_weights); this keeps them out of the per-sequence ratios (GSPO, sequence IS weights)."""


@dataclass(frozen=True, slots=True)
class TokenTerms:
    loss_R: Tensor
    kl_R: Tensor
    is_weight_R: Tensor


def policy_loss(cfg: LossSection, x: TokenInputs) -> Tensor:
    """The clipped surrogate of cfg.name, per token."""
    if cfg.name in ("grpo", "dr_grpo"):
        return grpo_token_loss(x.logp_R, x.old_logp_R, x.advantages_R, cfg.clip_eps)
    if cfg.name == "dapo":
        return clip_higher_token_loss(x.logp_R, x.old_logp_R, x.advantages_R, cfg.clip_eps_low, cfg.clip_eps_high)
    if cfg.name == "gspo":
        return gspo_token_loss(
            x.logp_R,
            x.old_logp_R,
            x.advantages_R,
            x.segment_R,
            x.num_segments,
            cfg.clip_eps_low,
            cfg.clip_eps_high,
            x.mask_R,
        )
    raise ValueError(f"trainer.loss.name must be one of {LOSSES}, got {cfg.name!r}")


def importance_weights(cfg: LossSection, x: TokenInputs) -> Tensor:
    """Truncated IS weights of cfg.importance_sampling, per token (1 when off)."""
    if cfg.importance_sampling == "off":
        return torch.ones_like(x.logp_R)
    if cfg.importance_sampling == "token":
        return token_is_weights(x.old_logp_R, x.rollout_logp_R, cfg.is_truncation)
    if cfg.importance_sampling == "sequence":
        return sequence_is_weights(
            x.old_logp_R, x.rollout_logp_R, x.segment_R, x.num_segments, cfg.is_truncation, x.mask_R
        )
    raise ValueError(
        f"trainer.loss.importance_sampling must be off, token or sequence, got {cfg.importance_sampling!r}"
    )


def token_objective(cfg: LossSection, x: TokenInputs) -> TokenTerms:
    """Per-token loss to be summed with loss_weights; also the per-token KL and IS weight for metrics."""
    is_weight_R = importance_weights(cfg, x)
    loss_R = is_weight_R * policy_loss(cfg, x)
    kl_R = torch.zeros_like(loss_R)
    if x.ref_logp_R is not None:
        kl_R = (k3_kl if cfg.kl_estimator == "k3" else k1_kl)(x.logp_R, x.ref_logp_R)
        loss_R = loss_R + cfg.kl_beta * kl_R
    if x.entropy_R is not None:
        loss_R = loss_R + entropy_bonus_token_loss(x.entropy_R, cfg.entropy_coef)
    return TokenTerms(loss_R, kl_R, is_weight_R)


def loss_weights(
    cfg: LossSection, response_lens_B: Tensor, max_tokens: int = 0, mask_N: Tensor | None = None
) -> Tensor:
    """Weight of every response token of the batch (flat layout) in the batch loss; max_tokens is the batch's
    generation budget, Dr.GRPO's normaliser where trainer.loss.dr_grpo_norm_tokens is 0. mask_N: 1 on the policy's
    tokens, 0 on an environment's, which then weigh 0 and count in no normaliser (None: all the policy's)."""
    if cfg.name == "gspo":
        return sequence_mean_weights(response_lens_B, mask_N)
    if cfg.name == "dr_grpo":
        return constant_length_weights(response_lens_B, cfg.dr_grpo_norm_tokens or max_tokens, mask_N)
    return token_mean_weights(response_lens_B, mask_N)
