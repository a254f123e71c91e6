"""Per-token log-probabilities and entropies from logits, in fp32 whatever the compute dtype."""

from __future__ import annotations

import torch
from torch import Tensor


def token_logprobs(logits_TV: Tensor, targets_T: Tensor) -> Tensor:
    """Log-probability of each target token under its row of logits, computed in fp32."""
    logp_TV = torch.log_softmax(logits_TV.float(), dim=-1)
    return logp_TV.gather(-1, targets_T.unsqueeze(-1)).squeeze(-1)


def token_logprobs_and_entropy(logits_TV: Tensor, targets_T: Tensor) -> tuple[Tensor, Tensor]:
    """Target logprobs plus the entropy of each row's full distribution, from one log_softmax."""
    logp_TV = torch.log_softmax(logits_TV.float(), dim=-1)
    entropy_T = -(logp_TV.exp() * logp_TV).sum(-1)
    return logp_TV.gather(-1, targets_T.unsqueeze(-1)).squeeze(-1), entropy_T
