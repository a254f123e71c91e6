"""The contract between the GRPO batch driver (engine.py) and a trainer backend (fsdp2/, megatron/).

A backend owns the sharded model, its reference and its optimizer, and knows how to run a packed micro-batch through
them; the driver owns the GRPO batch: the reference and pi_old passes, the minibatch split, the per-token weights, the
lr schedule's clock, the step's metrics, the checkpoint's layout. Per-call values (temperature, lr) are arguments.
A new backend (LoRA adapters, another parallel library) is one package implementing `Backend` plus one line in
`backends.py`. Every method is a collective: every rank calls it with the same arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

from .objective import TokenInputs, token_objective
from .packing import BatchPlan, Packed, Seq

if TYPE_CHECKING:
    from services.common.config import LossSection


@dataclass(frozen=True, slots=True)
class BatchTokens:
    """Per-token inputs of one optimizer step in the flat response-token layout (N tokens, on the device)."""

    advantages_N: Tensor
    rollout_logp_N: Tensor
    weights_N: Tensor
    """Each token's weight in the batch loss (the normaliser of cfg.loss.name folded in); 0 on an environment's."""
    mask_N: Tensor
    """1 on the policy's tokens, 0 on those an environment wrote (multi-turn): never in the loss, the KL, the
    entropy or the mismatch."""
    ref_logp_N: Tensor | None
    old_logp_N: Tensor | None = None
    """pi_old from a pass before the first optimizer step; None: the training forward's own logprobs."""


@dataclass(frozen=True, slots=True)
class StepSums:
    """What one optimizer step of a backend gives back, before any reduction over ranks."""

    sums_4: Tensor
    """[weighted loss, kl, entropy, is_weight] summed over this rank's policy tokens (0 on ranks that write none)."""
    logp_N: Tensor
    """The training forward's logprob of each token this rank computed, 0 elsewhere (a world sum gathers them)."""
    grad_norm: float


class Backend(Protocol):
    device: torch.device
    rank: int
    world: int
    vocab_size: int
    has_reference: bool
    """A frozen reference model is loaded (the KL term's)."""

    def plan(self, seqs: list[Seq]) -> BatchPlan:
        """The batch split over data-parallel ranks and token-bounded micro-batches (packing.plan_batch)."""

    def logprobs(self, reference: bool, plan: BatchPlan, temperature: float) -> Tensor:
        """Flat [N] logprobs of every response token (of the reference model if asked), the same on every rank."""

    def step(self, plan: BatchPlan, batch: BatchTokens, temperature: float, lr: float) -> StepSums:
        """Forward and backward every micro-batch with `microbatch_loss`, clip, one optimizer step at lr."""

    @property
    def shares_weights(self) -> bool:
        """Every rank can gather and send its share of a refit (gather_share)."""

    def hf_layout(self, dtype: torch.dtype | None = None) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
        """(HF name, dtype, full shape) of every tensor of the HF state dict, floating ones as cast to dtype."""

    def gather_share(self, owners: dict[str, int] | None, on_device: bool, dtype: torch.dtype | None) -> dict:
        """The full HF tensors this rank sends (owners[name] == rank; None: all, to rank 0)."""

    def full_state_dict(self, on_device: bool = False, dtype: torch.dtype | None = None) -> dict[str, Tensor]:
        """The unsharded HF state dict on rank 0, {} on the other ranks."""

    def save_train_state(self, folder: Path, policy_version: int) -> None:
        """The sharded training state (model, optimizer, RNG) in the backend's own format."""

    def load_train_state(self, folder: Path) -> int:
        """Restore what save_train_state wrote; returns its policy_version."""


def microbatch_loss(
    loss_cfg: LossSection, mb: Packed, batch: BatchTokens, logp_R: Tensor, entropy_R: Tensor | None
) -> tuple[Tensor, Tensor]:
    """A micro-batch's weighted objective summed over its tokens (to backward), and detached sums of [weighted loss,
    kl, entropy, is_weight] over its policy tokens: the same for every backend."""
    device = logp_R.device
    idx_R = mb.token_index_R.to(device)
    inputs = TokenInputs(
        logp_R=logp_R,
        # With one optimizer step per batch pi_old, the clip range's anchor, is the policy of this very forward, so
        # its logprobs are these, detached; a separate no-grad pass would only repeat them.
        old_logp_R=logp_R.detach() if batch.old_logp_N is None else batch.old_logp_N[idx_R],
        advantages_R=batch.advantages_N[idx_R],
        rollout_logp_R=batch.rollout_logp_N[idx_R],
        ref_logp_R=None if batch.ref_logp_N is None else batch.ref_logp_N[idx_R],
        entropy_R=entropy_R,
        segment_R=mb.segment_R.to(device),
        num_segments=len(mb.seq_indices),
        mask_R=batch.mask_N[idx_R],
    )
    terms = token_objective(loss_cfg, inputs)
    weighted_R = terms.loss_R * batch.weights_N[idx_R]
    mask_R = inputs.mask_R
    entropy_sum = torch.zeros((), device=device) if entropy_R is None else (entropy_R.detach() * mask_R).sum()
    sums = [
        weighted_R.detach().sum(),
        (terms.kl_R.detach() * mask_R).sum(),
        entropy_sum,
        (terms.is_weight_R * mask_R).sum(),
    ]
    return weighted_R.sum(), torch.stack(sums)
