"""Per-token estimators of KL(policy || reference) from the sampled tokens' logprobs."""

from __future__ import annotations

import torch
from torch import Tensor


def k1_kl(logp_T: Tensor, ref_logp_T: Tensor) -> Tensor:
    """k1 = log(pi / pi_ref): unbiased, but negative on some tokens and high variance."""
    return logp_T - ref_logp_T


def k3_kl(logp_T: Tensor, ref_logp_T: Tensor) -> Tensor:
    """Schulman's k3 estimator of KL(policy || reference) per sampled token: unbiased and >= 0."""
    log_ratio_T = ref_logp_T - logp_T
    return torch.exp(log_ratio_T) - log_ratio_T - 1.0
