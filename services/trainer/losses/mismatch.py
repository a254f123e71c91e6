"""How far the trainer's logprobs are from the rollout engine's on the sampled tokens."""

from __future__ import annotations

import torch
from torch import Tensor


def mult_prob_error(logp_a_T: Tensor, logp_b_T: Tensor) -> Tensor:
    """Mean over the tokens of exp(|logp_a - logp_b|); 1.0 means the two engines agree exactly."""
    num_tokens = logp_a_T.numel()
    assert num_tokens > 0, "mult_prob_error needs at least one token"
    return torch.exp((logp_a_T - logp_b_T).abs()).sum() / num_tokens
