"""The GRPO batch driver every rank runs over its backend (backend.py): one Train call is the reference and pi_old
passes, cfg.minibatches optimizer steps at the scheduled lr, and the step's metrics; every public method is a
collective."""

from __future__ import annotations

import dataclasses
import itertools
import resource
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import Tensor

from services.weightsync.kernels.checksum import tensor_checksum

from . import checkpoint
from .backend import Backend, BatchTokens
from .losses import mult_prob_error
from .lr_schedule import lr_factor
from .manifest import write_manifest
from .objective import loss_weights
from .packing import BatchPlan, Seq, response_offsets

if TYPE_CHECKING:  # pydantic stays out of the import path: the GPU bench image lacks it
    from services.common.config import TrainerSection


class Engine:
    """Every rank calls the same method with the same arguments; its backend computes the rank's share."""

    def __init__(self, backend: Backend, cfg: TrainerSection, model_dir: Path):
        self.backend, self.cfg, self.model_dir = backend, cfg, model_dir
        self.device, self.rank, self.world = backend.device, backend.rank, backend.world
        self.vocab_size = backend.vocab_size
        self.policy_version = 0
        self.optimizer_steps = 0
        """Optimizer steps taken (policy_version x cfg.minibatches after a restore): the lr schedule's clock."""

    def logprobs(self, seqs: list[Seq], temperature: float = 1.0) -> list[Tensor]:
        """Current-policy logprob of every response token under softmax(logits / temperature), one CPU tensor per
        sequence, on every rank."""
        flat_N = self.backend.logprobs(False, self.backend.plan(seqs), temperature).cpu()
        offsets = response_offsets(seqs)
        return [flat_N[offsets[i] : offsets[i + 1]] for i in range(len(seqs))]

    def train(
        self,
        seqs: list[Seq],
        advantages: list[float],
        rollout_logprobs: list[list[float]],
        temperature: float = 1.0,
        max_tokens: int = 0,
    ) -> dict[str, float]:
        """cfg.minibatches optimizer steps over the batch; bumps policy_version. Returns the step's metrics.

        temperature: the batch's sampling temperature (logprobs are of softmax(logits / temperature)); max_tokens:
        its generation budget (TrainRequest.max_tokens), Dr.GRPO's default normaliser."""
        if len(seqs) < self.cfg.minibatches:
            raise ValueError(f"a batch of {len(seqs)} sequences cannot make trainer.minibatches={self.cfg.minibatches}")
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        plan = self.backend.plan(seqs)
        start = time.perf_counter()
        ref_N = self.backend.logprobs(True, plan, temperature) if self.backend.has_reference else None
        old_N = self.backend.logprobs(False, plan, temperature) if self.cfg.minibatches > 1 else None
        logprobs_s = time.perf_counter() - start

        start = time.perf_counter()
        if old_N is None:
            batch = self._batch_tokens(seqs, advantages, rollout_logprobs, ref_N, max_tokens)
            metrics = self._step(plan, batch, temperature)
        else:
            metrics = self._minibatch_steps(seqs, advantages, rollout_logprobs, ref_N, old_N, temperature, max_tokens)
        training_s = time.perf_counter() - start
        logprobs_s, training_s, peak_mem_GiB = self._max_over_ranks([logprobs_s, training_s, self._peak_mem_GiB()])
        self.policy_version += 1
        num_tokens = float(sum(s.num_tokens for s in seqs))
        return {
            **metrics,
            "num_tokens": num_tokens,
            "throughput/tokens_per_s_per_gpu": num_tokens / max(training_s, 1e-9) / self.world,
            "timing/logprobs_s": logprobs_s,
            "timing/policy_training_s": training_s,
            "peak_mem_GiB": peak_mem_GiB,
        }

    def _minibatch_steps(
        self,
        seqs: list[Seq],
        advantages: list[float],
        rollout: list[list[float]],
        ref_N: Tensor | None,
        old_N: Tensor,
        temperature: float,
        max_tokens: int,
    ) -> dict[str, float]:
        """One optimizer step per contiguous slice of the batch; pi_old and the reference come from the whole
        batch's passes before the first step. Metrics: the mean over steps, the mismatch of pi_old."""
        offsets = response_offsets(seqs)
        bounds = [round(k * len(seqs) / self.cfg.minibatches) for k in range(self.cfg.minibatches + 1)]
        steps = []
        for lo, hi in itertools.pairwise(bounds):
            tokens = slice(offsets[lo], offsets[hi])
            part = self._batch_tokens(
                seqs[lo:hi], advantages[lo:hi], rollout[lo:hi], None if ref_N is None else ref_N[tokens], max_tokens
            )
            part = dataclasses.replace(part, old_logp_N=old_N[tokens])
            steps.append(self._step(self.backend.plan(seqs[lo:hi]), part, temperature))
        metrics = {k: sum(m[k] for m in steps) / len(steps) for k in steps[0]}
        rollout_N = torch.tensor([lp for lps in rollout for lp in lps], device=old_N.device)
        policy_N = torch.tensor([m for s in seqs for m in s.mask()], device=old_N.device) > 0
        metrics["mismatch/mult_prob_error"] = mult_prob_error(old_N[policy_N], rollout_N[policy_N]).item()
        return metrics

    def _step(self, plan: BatchPlan, batch: BatchTokens, temperature: float) -> dict[str, float]:
        """One optimizer step of the backend at the scheduled lr; the loss terms and mismatch over the policy's
        tokens, from every rank's sums and logprobs."""
        cfg = self.cfg
        lr = cfg.lr * lr_factor(self.optimizer_steps, cfg.lr_schedule, cfg.lr_warmup_steps, cfg.lr_schedule_steps)
        out = self.backend.step(plan, batch, temperature, lr)
        self.optimizer_steps += 1
        dist.all_reduce(out.sums_4)
        dist.all_reduce(out.logp_N)  # each token was written by exactly one rank
        policy_N = batch.mask_N > 0
        mismatch = mult_prob_error(out.logp_N[policy_N], batch.rollout_logp_N[policy_N]).item()
        return {
            **self._loss_metrics(out.sums_4, int(policy_N.sum())),
            "mismatch/mult_prob_error": mismatch,
            "grad_norm": out.grad_norm,
        }

    def _loss_metrics(self, sums_4: Tensor, num_tokens: int) -> dict[str, float]:
        """Sums of [weighted loss, kl, entropy, is_weight] over num_tokens policy tokens -> the step's metrics."""
        loss, kl, entropy, is_weight = sums_4.tolist()
        metrics = {"loss": loss, "kl": kl / num_tokens}
        if self.cfg.loss.entropy_coef > 0:  # only computed then: it costs another pass over the vocabulary
            metrics["entropy"] = entropy / num_tokens
        if self.cfg.loss.importance_sampling != "off":
            metrics["mismatch/is_weight_mean"] = is_weight / num_tokens
        return metrics

    def _batch_tokens(
        self,
        seqs: list[Seq],
        advantages: list[float],
        rollout_logprobs: list[list[float]],
        ref_N: Tensor | None,
        max_tokens: int,
    ) -> BatchTokens:
        response_lens_B = torch.tensor([len(s.response_ids) for s in seqs])
        adv_N = torch.repeat_interleave(torch.tensor(advantages, dtype=torch.float32), response_lens_B)
        rollout_N = torch.tensor([lp for seq_lps in rollout_logprobs for lp in seq_lps], dtype=torch.float32)
        mask_N = torch.tensor([m for s in seqs for m in s.mask()], dtype=torch.float32)
        weights_N = loss_weights(self.cfg.loss, response_lens_B, max_tokens, mask_N)
        d = self.device
        return BatchTokens(adv_N.to(d), rollout_N.to(d), weights_N.to(d), mask_N.to(d), ref_N)

    # -- weights out: the backend's ---------------------------------------------------------------------

    @property
    def shares_weights(self) -> bool:
        return self.backend.shares_weights

    def hf_layout(self, dtype: torch.dtype | None = None) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
        return self.backend.hf_layout(dtype)

    def gather_share(
        self, owners: dict[str, int] | None, on_device: bool, dtype: torch.dtype | None
    ) -> dict[str, Tensor]:
        return self.backend.gather_share(owners, on_device, dtype)

    def full_state_dict(self, on_device: bool = False, dtype: torch.dtype | None = None) -> dict[str, Tensor]:
        sd = self.backend.full_state_dict(on_device, dtype)
        # vLLM and the rollout engines load lm_head by name; a missing key would leave them stale.
        assert self.rank != 0 or "lm_head.weight" in sd, "full state dict lacks lm_head.weight"
        return sd

    # -- checkpoints -------------------------------------------------------------------------------------

    def save(self, path: Path, train_state: bool = True) -> dict[str, str]:
        """Write the HF export (and the sharded training state) to path; per-tensor checksums on rank 0."""
        sd = self.full_state_dict()
        staging = checkpoint.staging_dir(path)
        if self.rank == 0:
            checkpoint.reset_dir(staging)
        dist.barrier()
        if train_state:
            self.backend.save_train_state(staging / checkpoint.TRAIN_STATE, self.policy_version)
        if self.rank != 0:
            return {}
        checkpoint.write_hf(sd, self.model_dir, staging)
        # Last, once every rank's files are in: Load trusts nothing the manifest does not vouch for.
        write_manifest(staging)
        checkpoint.publish_dir(staging, path)
        return {name: tensor_checksum(t) for name, t in sd.items()}

    def load(self, path: Path) -> int:
        """Restore policy, optimizer, policy_version and RNG from a checkpoint written by save()."""
        self.policy_version = self.backend.load_train_state(path / checkpoint.TRAIN_STATE)
        self.optimizer_steps = self.policy_version * self.cfg.minibatches
        return self.policy_version

    def _max_over_ranks(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def _peak_mem_GiB(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**30
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB (process max)
