"""RL losses as pure functions on tensors, one module per loss; the trainer composes them in objective.py."""

from .aggregation import constant_length_weights, sequence_mean_weights, token_mean_weights
from .dapo import clip_higher_token_loss
from .entropy import entropy_bonus_token_loss
from .grpo import grpo_token_loss
from .gspo import gspo_token_loss, segment_mean
from .importance import sequence_is_weights, token_is_weights
from .kl import k1_kl, k3_kl
from .logprobs import token_logprobs, token_logprobs_and_entropy
from .mismatch import mult_prob_error

__all__ = [
    "clip_higher_token_loss",
    "constant_length_weights",
    "entropy_bonus_token_loss",
    "grpo_token_loss",
    "gspo_token_loss",
    "k1_kl",
    "k3_kl",
    "mult_prob_error",
    "segment_mean",
    "sequence_is_weights",
    "sequence_mean_weights",
    "token_is_weights",
    "token_logprobs",
    "token_logprobs_and_entropy",
    "token_mean_weights",
]
