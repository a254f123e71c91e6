"""The FSDP2 policy (plus a frozen reference) held by every rank; every public method is a collective."""

from __future__ import annotations

import dataclasses
import itertools
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from services.weightsync.kernels.checksum import tensor_checksum

from . import checkpoint
from .attention import SDPA_VARLEN, block_masks, row_mask, shared_flash_layout
from .losses import mult_prob_error, token_logprobs, token_logprobs_and_entropy
from .lr_schedule import lr_factor
from .manifest import write_manifest
from .objective import TokenInputs, loss_weights, token_objective
from .packing import Packed, Seq, plan, response_offsets

if TYPE_CHECKING:  # pydantic stays out of the import path: the GPU bench image lacks it
    from services.common.config import TrainerSection


@dataclass(frozen=True, slots=True)
class BatchTokens:
    """Per-token inputs of one Train call in the flat response-token layout (N tokens, on the device)."""

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


class Engine:
    """Every rank calls the same method with the same arguments; each computes its share of the batch."""

    temperature: float = 1.0
    """Of the batch being scored: logprobs are of softmax(logits / temperature), the sampling distribution."""
    max_tokens: int = 0
    """Generation budget of the batch being trained (TrainRequest.max_tokens): Dr.GRPO's default normaliser."""

    def __init__(
        self,
        model: nn.Module,
        ref_model: nn.Module | None,
        optimizer: torch.optim.Optimizer,
        cfg: TrainerSection,
        model_dir: Path,
        device: torch.device,
    ):
        self.model, self.ref_model, self.optimizer = model, ref_model, optimizer
        self.cfg, self.model_dir, self.device = cfg, model_dir, device
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.vocab_size: int = model.config.vocab_size
        self.policy_version = 0
        self.optimizer_steps = 0
        """Optimizer steps taken (policy_version x cfg.minibatches after a restore): the lr schedule's clock."""
        self._state_refs: list[tuple[str, Tensor]] | None = None

    def logprobs(self, seqs: list[Seq]) -> list[Tensor]:
        """Current-policy logprob of every response token, one CPU tensor per sequence, on every rank."""
        flat_N = self._flat_logprobs(self.model, seqs, self._plan(seqs)).cpu()
        offsets = response_offsets(seqs)
        return [flat_N[offsets[i] : offsets[i + 1]] for i in range(len(seqs))]

    def train(self, seqs: list[Seq], advantages: list[float], rollout_logprobs: list[list[float]]) -> dict[str, float]:
        """cfg.minibatches optimizer steps over the batch; bumps policy_version. Returns the step's metrics."""
        if len(seqs) < self.cfg.minibatches:
            raise ValueError(f"a batch of {len(seqs)} sequences cannot make trainer.minibatches={self.cfg.minibatches}")
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        plans = self._plan(seqs)
        start = time.perf_counter()
        ref_N = None if self.ref_model is None else self._flat_logprobs(self.ref_model, seqs, plans)
        old_N = self._flat_logprobs(self.model, seqs, plans) if self.cfg.minibatches > 1 else None
        logprobs_s = time.perf_counter() - start

        start = time.perf_counter()
        if old_N is None:
            metrics = self._step(plans, self._batch_tokens(seqs, advantages, rollout_logprobs, ref_N))
        else:
            metrics = self._minibatch_steps(seqs, advantages, rollout_logprobs, ref_N, old_N)
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
        self, seqs: list[Seq], advantages: list[float], rollout: list[list[float]], ref_N: Tensor | None, old_N: Tensor
    ) -> dict[str, float]:
        """One optimizer step per contiguous slice of the batch; pi_old and the reference come from the whole
        batch's passes before the first step. Metrics: the mean over steps, the mismatch of pi_old."""
        offsets = response_offsets(seqs)
        bounds = [round(k * len(seqs) / self.cfg.minibatches) for k in range(self.cfg.minibatches + 1)]
        steps = []
        for lo, hi in itertools.pairwise(bounds):
            tokens = slice(offsets[lo], offsets[hi])
            part = self._batch_tokens(
                seqs[lo:hi], advantages[lo:hi], rollout[lo:hi], None if ref_N is None else ref_N[tokens]
            )
            part = dataclasses.replace(part, old_logp_N=old_N[tokens])
            steps.append(self._step(self._plan(seqs[lo:hi]), part))
        metrics = {k: sum(m[k] for m in steps) / len(steps) for k in steps[0]}
        rollout_N = torch.tensor([lp for lps in rollout for lp in lps], device=old_N.device)
        policy_N = torch.tensor([m for s in seqs for m in s.mask()], device=old_N.device) > 0
        metrics["mismatch/mult_prob_error"] = mult_prob_error(old_N[policy_N], rollout_N[policy_N]).item()
        return metrics

    @property
    def shares_weights(self) -> bool:
        """Every rank can gather and send its share of a refit (gather_share); offloaded shards of a GPU
        run are gathered through the host, by rank 0 (full_state_dict)."""
        return not (self.cfg.fsdp2.cpu_offload and self.device.type == "cuda")

    def hf_layout(self, dtype: torch.dtype | None = None) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
        """(name, dtype, full shape) of every tensor of the HF state dict, floating ones as cast to dtype."""
        out = []
        for name, t in self.model.state_dict().items():
            cast = dtype if dtype and t.is_floating_point() else t.dtype
            out.append((name, str(cast).removeprefix("torch."), tuple(t.shape)))
        return tuple(out)

    def gather_share(
        self, owners: dict[str, int] | None, on_device: bool, dtype: torch.dtype | None
    ) -> dict[str, Tensor]:
        """The full tensors this rank sends (owners[name] == rank; None: all of them, to rank 0), cast to
        dtype; every rank takes part in every gather, one parameter at a time, and keeps only its own."""
        out = {}
        with torch.no_grad():  # DTensor's to_local records an autograd node per parameter otherwise
            for name, t in self._state_tensors():
                full = t
                if isinstance(t, DTensor):
                    # On one rank the shard is the whole tensor: DTensor's gather would only add host time.
                    full = t.to_local() if self.world == 1 else t.full_tensor()
                    assert full.shape == t.shape, (name, full.shape, t.shape)
                if (0 if owners is None else owners.get(name)) == self.rank:
                    full = full.detach().to(dtype) if dtype and full.is_floating_point() else full.detach()
                    out[name] = full if on_device else full.cpu()
        return out

    def _state_tensors(self) -> list[tuple[str, Tensor]]:
        """The state dict's (name, tensor) pairs, from references taken once: state_dict() walks the module tree
        and runs FSDP2's hooks on every call (with the autograd nodes above, 6.6-9.3 ms of each refit of the 1.31B
        shape on an H200 against 0.7-1.2 ms: bench/results/gpu_vllm/gpu_vllm_refit_gather.json). The tensors it holds
        stay the same objects: a plain module's parameters, or FSDP2's sharded parameters, whose local shards the
        optimizer updates in place. load() takes them again."""
        if self._state_refs is None:
            self._state_refs = list(self.model.state_dict(keep_vars=True).items())
        return self._state_refs

    def full_state_dict(self, on_device: bool = False, dtype: torch.dtype | None = None) -> dict[str, Tensor]:
        """The unsharded HF state dict on rank 0, {} on the other ranks: on CPU, or with on_device left on
        this rank's device (a GPU refit then never crosses PCIe), floating tensors cast to dtype if given."""
        if on_device and self.shares_weights:
            sd = self.gather_share(None, True, dtype)
        else:
            sd = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            if dtype:
                sd = {k: v.to(dtype) if v.is_floating_point() else v for k, v in sd.items()}
        # vLLM and the rollout engines load lm_head by name; a missing key would leave them stale.
        assert self.rank != 0 or "lm_head.weight" in sd, "full state dict lacks lm_head.weight"
        return sd

    def save(self, path: Path, train_state: bool = True) -> dict[str, str]:
        """Write the HF export (and the sharded training state) to path; per-tensor checksums on rank 0."""
        sd = self.full_state_dict()
        staging = checkpoint.staging_dir(path)
        if self.rank == 0:
            checkpoint.reset_dir(staging)
        dist.barrier()
        if train_state:
            self._save_train_state(staging / checkpoint.TRAIN_STATE)
        if self.rank != 0:
            return {}
        checkpoint.write_hf(sd, self.model_dir, staging)
        # Last, once every rank's files are in: Load trusts nothing the manifest does not vouch for.
        write_manifest(staging)
        checkpoint.publish_dir(staging, path)
        return {name: tensor_checksum(t) for name, t in sd.items()}

    def load(self, path: Path) -> int:
        """Restore policy, optimizer, policy_version and RNG from a checkpoint written by save()."""
        self.policy_version = self._load_train_state(path / checkpoint.TRAIN_STATE)
        self.optimizer_steps = self.policy_version * self.cfg.minibatches
        self._state_refs = None
        return self.policy_version

    def _save_train_state(self, folder: Path) -> None:
        """Collective: the sharded training state (torch distributed checkpoint)."""
        checkpoint.save_train_state(folder, self.model, self.optimizer, self.policy_version, self.rank)

    def _load_train_state(self, folder: Path) -> int:
        return checkpoint.load_train_state(folder, self.model, self.optimizer, self.rank)

    def _plan(self, seqs: list[Seq]) -> list[list[Packed | None]]:
        # FSDP2 gathers each layer's weights with a collective in every forward and backward, so all
        # ranks must run the same number of micro-batches: the short ranks pad with None (a dummy pass).
        plans = plan(seqs, self.world, self.cfg.max_tokens_per_microbatch, self._share_prompts)
        num_steps = max(len(p) for p in plans)
        return [p + [None] * (num_steps - len(p)) for p in plans]

    def _batch_tokens(
        self, seqs: list[Seq], advantages: list[float], rollout_logprobs: list[list[float]], ref_N: Tensor | None
    ) -> BatchTokens:
        response_lens_B = torch.tensor([len(s.response_ids) for s in seqs])
        adv_N = torch.repeat_interleave(torch.tensor(advantages, dtype=torch.float32), response_lens_B)
        rollout_N = torch.tensor([lp for seq_lps in rollout_logprobs for lp in seq_lps], dtype=torch.float32)
        mask_N = torch.tensor([m for s in seqs for m in s.mask()], dtype=torch.float32)
        weights_N = loss_weights(self.cfg.loss, response_lens_B, self.max_tokens, mask_N)
        d = self.device
        return BatchTokens(adv_N.to(d), rollout_N.to(d), weights_N.to(d), mask_N.to(d), ref_N)

    @torch.no_grad()
    def _flat_logprobs(self, model: nn.Module, seqs: list[Seq], plans: list[list[Packed | None]]) -> Tensor:
        out_N = torch.zeros(response_offsets(seqs)[-1], device=self.device)
        for mb in plans[self.rank]:
            if mb is None:
                self._dummy_logits(model)
                continue
            out_N[mb.token_index_R.to(self.device)] = self._forward(model, mb, with_entropy=False)[0]
        # Without a backward nothing reshards layers kept unsharded after forward (one rank); a later
        # load() or step would otherwise leave a stale bf16 copy in use.
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()
        # Each token is written by exactly one rank and is 0 elsewhere, so a sum gathers them exactly.
        dist.all_reduce(out_N)
        return out_N

    def _forward(self, model: nn.Module, mb: Packed, with_entropy: bool) -> tuple[Tensor, Tensor | None]:
        """Logprobs (and entropies) of the row's response tokens."""
        # attention_mask=None + restarting position_ids make attention block-diagonal per sequence;
        # use_cache=False is required, a cache silently disables that detection in transformers.
        ids_1T, pos_1T = mb.input_ids_1T.to(self.device), mb.position_ids_1T.to(self.device)
        logit_index_R, targets_R = mb.logit_index_R.to(self.device), mb.targets_R.to(self.device)
        packed = self._packed_attention_kwargs(mb)
        if self.cfg.memory.logprob_chunk_tokens and not with_entropy:
            chunk = self.cfg.memory.logprob_chunk_tokens
            logp_R = model.packed_logprobs(ids_1T, pos_1T, logit_index_R, targets_R, chunk, self.temperature, **packed)
            return logp_R, None
        logits_1RV = model(
            input_ids=ids_1T, position_ids=pos_1T, use_cache=False, logits_to_keep=logit_index_R, **packed
        ).logits
        if self.temperature != 1.0:
            logits_1RV = logits_1RV / self.temperature
        if with_entropy:
            return token_logprobs_and_entropy(logits_1RV[0], targets_R)
        return token_logprobs(logits_1RV[0], targets_R), None

    @property
    def _share_prompts(self) -> bool:
        """Responses to one prompt share its tokens in a row: the attention paths that take a per-block mask."""
        return self.cfg.fsdp2.share_prompts and self.cfg.fsdp2.attn_implementation in ("sdpa", SDPA_VARLEN)

    def _packed_attention_kwargs(self, mb: Packed) -> dict:
        impl = self.cfg.fsdp2.attn_implementation
        if impl == "sdpa":  # transformers' block-causal mask from the position ids cannot say "shared prompt"
            return (
                {"attention_mask": row_mask(mb.seq_lens, mb.block_responses).to(self.device)}
                if mb.shares_prompts
                else {}
            )
        if impl != SDPA_VARLEN:
            return {}
        flash = self.cfg.fsdp2.flash_varlen and self.device.type == "cuda"
        if mb.shares_prompts:
            if flash and self.cfg.dtype != "float32":  # one kernel; the per-block masks are never built
                layout = shared_flash_layout(mb.seq_lens, mb.block_responses).to(self.device)
                return {"packed_seq_lens": mb.seq_lens, "packed_shared_flash": layout}
            masks = block_masks(mb.seq_lens, mb.block_responses)
            return {
                "packed_seq_lens": mb.seq_lens,
                "packed_block_masks": [m if m is None else m.to(self.device) for m in masks],
            }
        if not flash:
            return {"packed_seq_lens": mb.seq_lens}
        cu_seqlens = torch.tensor([0, *itertools.accumulate(mb.seq_lens)], dtype=torch.int32)
        return {"packed_seq_lens": mb.seq_lens, "packed_cu_seqlens": cu_seqlens.to(self.device)}

    def _dummy_logits(self, model: nn.Module) -> Tensor:
        one_11 = torch.zeros(1, 1, dtype=torch.long, device=self.device)
        return model(input_ids=one_11, position_ids=one_11, use_cache=False, logits_to_keep=1).logits

    def _step(self, plans: list[list[Packed | None]], batch: BatchTokens) -> dict[str, float]:
        """Forward/backward every micro-batch, clip, step; returns the batch's loss terms and grad norm."""
        old_N = torch.zeros_like(batch.rollout_logp_N)
        sums_4 = torch.zeros(4, device=self.device)
        mbs = plans[self.rank]
        for i, mb in enumerate(mbs):
            self._accumulate_unsharded(last=i == len(mbs) - 1)
            if mb is None:
                (self._dummy_logits(self.model).sum() * 0.0).backward()
                continue
            loss, stats_4, logp_R = self._microbatch_loss(mb, batch)
            loss.backward()
            sums_4 += stats_4
            old_N[mb.token_index_R.to(self.device)] = logp_R
        grad_norm = self._clip_and_step()
        return {**self._step_metrics(sums_4, old_N, batch), "grad_norm": grad_norm}

    def _accumulate_unsharded(self, last: bool) -> None:
        """On one rank FSDP's reduce after a micro-batch is a cast and a copy, and the next micro-batch's
        gather another: until the last one, gradients accumulate unsharded (in fp32, the reduce dtype) and
        the layers stay gathered. With more ranks that would cost a full fp32 gradient per rank."""
        if self.world == 1 and not self.cfg.fsdp2.cpu_offload and isinstance(self.model, FSDPModule):
            self.model.set_requires_gradient_sync(last)
            self.model.set_reshard_after_backward(last)

    def _clip_and_step(self) -> float:
        grad_norm = nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        if isinstance(grad_norm, DTensor):
            grad_norm = grad_norm.full_tensor()
        cfg = self.cfg
        lr = cfg.lr * lr_factor(self.optimizer_steps, cfg.lr_schedule, cfg.lr_warmup_steps, cfg.lr_schedule_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer_steps += 1
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm.item()

    def _step_metrics(self, sums_4: Tensor, old_N: Tensor, batch: BatchTokens) -> dict[str, float]:
        """The step's loss terms and mismatch over the policy's tokens, from every rank's sums and logprobs."""
        dist.all_reduce(sums_4)
        dist.all_reduce(old_N)  # each token was written by exactly one rank
        policy_N = batch.mask_N > 0
        mismatch = mult_prob_error(old_N[policy_N], batch.rollout_logp_N[policy_N]).item()
        return {**self._loss_metrics(sums_4, int(policy_N.sum())), "mismatch/mult_prob_error": mismatch}

    def _loss_metrics(self, sums_4: Tensor, num_tokens: int) -> dict[str, float]:
        """Sums of [weighted loss, kl, entropy, is_weight] over num_tokens policy tokens -> the step's metrics."""
        loss, kl, entropy, is_weight = sums_4.tolist()
        metrics = {"loss": loss, "kl": kl / num_tokens}
        if self.cfg.loss.entropy_coef > 0:  # only computed then: it costs another pass over the vocabulary
            metrics["entropy"] = entropy / num_tokens
        if self.cfg.loss.importance_sampling != "off":
            metrics["mismatch/is_weight_mean"] = is_weight / num_tokens
        return metrics

    def _microbatch_loss(self, mb: Packed, batch: BatchTokens) -> tuple[Tensor, Tensor, Tensor]:
        """Scaled loss to backward, detached sums of [weighted loss, kl, entropy, is_weight], detached logprobs."""
        logp_R, entropy_R = self._forward(self.model, mb, with_entropy=self.cfg.loss.entropy_coef > 0)
        loss, stats = self._token_loss(mb, batch, logp_R, entropy_R)
        # FSDP2 averages gradients over ranks; the weights already hold the batch-wide normaliser, so
        # scaling by world size gives the exact gradient however tokens are spread over the ranks.
        return loss * self.world, stats, logp_R.detach()

    def _token_loss(self, mb: Packed, batch: BatchTokens, logp_R: Tensor, entropy_R: Tensor | None):
        """The micro-batch's weighted objective summed over its tokens, and detached sums of [weighted loss,
        kl, entropy, is_weight]."""
        idx_R = mb.token_index_R.to(self.device)
        inputs = TokenInputs(
            logp_R=logp_R,
            # With one optimizer step per batch pi_old, the clip range's anchor, is the policy of this very
            # forward, so its logprobs are these, detached; a separate no-grad pass would only repeat them.
            old_logp_R=logp_R.detach() if batch.old_logp_N is None else batch.old_logp_N[idx_R],
            advantages_R=batch.advantages_N[idx_R],
            rollout_logp_R=batch.rollout_logp_N[idx_R],
            ref_logp_R=None if batch.ref_logp_N is None else batch.ref_logp_N[idx_R],
            entropy_R=entropy_R,
            segment_R=mb.segment_R.to(self.device),
            num_segments=len(mb.seq_indices),
            mask_R=batch.mask_N[idx_R],
        )
        terms = token_objective(self.cfg.loss, inputs)
        weighted_R = terms.loss_R * batch.weights_N[idx_R]
        mask_R = inputs.mask_R
        entropy_sum = torch.zeros((), device=self.device) if entropy_R is None else (entropy_R.detach() * mask_R).sum()
        sums = [
            weighted_R.detach().sum(),
            (terms.kl_R.detach() * mask_R).sum(),
            entropy_sum,
            (terms.is_weight_R * mask_R).sum(),
        ]
        return weighted_R.sum(), torch.stack(sums)

    def _max_over_ranks(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def _peak_mem_GiB(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**30
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB (process max)
