"""GRPO math as pure functions on tensors: token logprobs, clipped policy loss, k3 KL, mismatch."""

from __future__ import annotations

import torch
from torch import Tensor


def token_logprobs(logits_TV: Tensor, targets_T: Tensor) -> Tensor:
    """Log-probability of each target token under its row of logits, computed in fp32."""
    logp_TV = torch.log_softmax(logits_TV.float(), dim=-1)
    return logp_TV.gather(-1, targets_T.unsqueeze(-1)).squeeze(-1)


def grpo_token_loss(
    logp_T: Tensor, old_logp_T: Tensor, advantages_T: Tensor, mask_T: Tensor, clip_eps: float
) -> Tensor:
    """Per-token PPO clipped surrogate, negated for minimisation; masked tokens contribute 0.

    Token-level (DAPO / Dr. GRPO style): the caller sums over tokens and divides by the batch's token
    count, so long responses are not down-weighted per token.
    """
    ratio_T = torch.exp(logp_T - old_logp_T)
    clipped_T = torch.clamp(ratio_T, 1.0 - clip_eps, 1.0 + clip_eps)
    surrogate_T = torch.minimum(ratio_T * advantages_T, clipped_T * advantages_T)
    return -surrogate_T * mask_T


def k3_kl(logp_T: Tensor, ref_logp_T: Tensor) -> Tensor:
    """Schulman's k3 estimator of KL(policy || reference) per sampled token: unbiased and >= 0."""
    log_ratio_T = ref_logp_T - logp_T
    return torch.exp(log_ratio_T) - log_ratio_T - 1.0


def mult_prob_error(logp_a_T: Tensor, logp_b_T: Tensor, mask_T: Tensor) -> Tensor:
    """Mean over unmasked tokens of exp(|logp_a - logp_b|); 1.0 means the two engines agree exactly."""
    mask_T = mask_T.to(logp_a_T.dtype)
    num_tokens = mask_T.sum()
    assert num_tokens > 0, "mult_prob_error needs at least one unmasked token"
    return (torch.exp((logp_a_T - logp_b_T).abs()) * mask_T).sum() / num_tokens
