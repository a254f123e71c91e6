"""The FSDP2 backend: an HF causal LM (plus a frozen reference) sharded over every rank with fully_shard, AdamW;
packed rows go through the model with the attention layout of trainer.fsdp2.attn_implementation."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from .. import checkpoint
from ..attention import SDPA_VARLEN, block_masks, row_mask, shared_flash_layout
from ..backend import BatchTokens, StepSums, microbatch_loss
from ..losses import token_logprobs, token_logprobs_and_entropy
from ..packing import BatchPlan, Packed, Seq, plan_batch

if TYPE_CHECKING:  # pydantic stays out of the import path: the GPU bench image lacks it
    from services.common.config import TrainerSection


class FSDP2Backend:
    def __init__(
        self,
        model: nn.Module,
        ref_model: nn.Module | None,
        optimizer: torch.optim.Optimizer,
        cfg: TrainerSection,
        device: torch.device,
    ):
        self.model, self.ref_model, self.optimizer = model, ref_model, optimizer
        self.cfg, self.device = cfg, device
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.vocab_size: int = model.config.vocab_size
        self._state_refs: list[tuple[str, Tensor]] | None = None

    @property
    def has_reference(self) -> bool:
        return self.ref_model is not None

    def plan(self, seqs: list[Seq]) -> BatchPlan:
        return plan_batch(seqs, self.world, self.cfg.max_tokens_per_microbatch, self._share_prompts)

    @torch.no_grad()
    def logprobs(self, reference: bool, plan: BatchPlan, temperature: float) -> Tensor:
        model = self.ref_model if reference else self.model
        out_N = torch.zeros(plan.num_tokens, device=self.device)
        for mb in plan.rows[self.rank]:
            if mb is None:
                self._dummy_logits(model)
                continue
            out_N[mb.token_index_R.to(self.device)] = self._forward(model, mb, False, temperature)[0]
        # Without a backward nothing reshards layers kept unsharded after forward (one rank); a later
        # load() or step would otherwise leave a stale bf16 copy in use.
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()
        # Each token is written by exactly one rank and is 0 elsewhere, so a sum gathers them exactly.
        dist.all_reduce(out_N)
        return out_N

    def step(self, plan: BatchPlan, batch: BatchTokens, temperature: float, lr: float) -> StepSums:
        """Forward/backward every micro-batch, clip, step."""
        logp_N = torch.zeros_like(batch.rollout_logp_N)
        sums_4 = torch.zeros(4, device=self.device)
        with_entropy = self.cfg.loss.entropy_coef > 0
        mbs = plan.rows[self.rank]
        for i, mb in enumerate(mbs):
            self._accumulate_unsharded(last=i == len(mbs) - 1)
            if mb is None:
                (self._dummy_logits(self.model).sum() * 0.0).backward()
                continue
            logp_R, entropy_R = self._forward(self.model, mb, with_entropy, temperature)
            loss, stats_4 = microbatch_loss(self.cfg.loss, mb, batch, logp_R, entropy_R)
            # FSDP2 averages gradients over ranks; the weights already hold the batch-wide normaliser, so
            # scaling by world size gives the exact gradient however tokens are spread over the ranks.
            (loss * self.world).backward()
            sums_4 += stats_4
            logp_N[mb.token_index_R.to(self.device)] = logp_R.detach()
        return StepSums(sums_4, logp_N, self._clip_and_step(lr))

    def _forward(
        self, model: nn.Module, mb: Packed, with_entropy: bool, temperature: float
    ) -> tuple[Tensor, Tensor | None]:
        """Logprobs (and entropies) of the row's response tokens under softmax(logits / temperature)."""
        # attention_mask=None + restarting position_ids make attention block-diagonal per sequence;
        # use_cache=False is required, a cache silently disables that detection in transformers.
        ids_1T, pos_1T = mb.input_ids_1T.to(self.device), mb.position_ids_1T.to(self.device)
        logit_index_R, targets_R = mb.logit_index_R.to(self.device), mb.targets_R.to(self.device)
        packed = self._packed_attention_kwargs(mb)
        if self.cfg.memory.logprob_chunk_tokens and not with_entropy:
            chunk = self.cfg.memory.logprob_chunk_tokens
            logp_R = model.packed_logprobs(ids_1T, pos_1T, logit_index_R, targets_R, chunk, temperature, **packed)
            return logp_R, None
        logits_1RV = model(
            input_ids=ids_1T, position_ids=pos_1T, use_cache=False, logits_to_keep=logit_index_R, **packed
        ).logits
        if temperature != 1.0:
            logits_1RV = logits_1RV / temperature
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

    def _accumulate_unsharded(self, last: bool) -> None:
        """On one rank FSDP's reduce after a micro-batch is a cast and a copy, and the next micro-batch's
        gather another: until the last one, gradients accumulate unsharded (in fp32, the reduce dtype) and
        the layers stay gathered. With more ranks that would cost a full fp32 gradient per rank."""
        if self.world == 1 and not self.cfg.fsdp2.cpu_offload and isinstance(self.model, FSDPModule):
            self.model.set_requires_gradient_sync(last)
            self.model.set_reshard_after_backward(last)

    def _clip_and_step(self, lr: float) -> float:
        grad_norm = nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        if isinstance(grad_norm, DTensor):
            grad_norm = grad_norm.full_tensor()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm.item()

    # -- weights out -----------------------------------------------------------------------------------

    @property
    def shares_weights(self) -> bool:
        """Every rank can gather and send its share of a refit (gather_share); offloaded shards of a GPU
        run are gathered through the host, by rank 0 (full_state_dict)."""
        return not (self.cfg.fsdp2.cpu_offload and self.device.type == "cuda")

    def hf_layout(self, dtype: torch.dtype | None = None) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
        out = []
        for name, t in self.model.state_dict().items():
            cast = dtype if dtype and t.is_floating_point() else t.dtype
            out.append((name, str(cast).removeprefix("torch."), tuple(t.shape)))
        return tuple(out)

    def gather_share(
        self, owners: dict[str, int] | None, on_device: bool, dtype: torch.dtype | None
    ) -> dict[str, Tensor]:
        """Cast to dtype; every rank takes part in every gather, one parameter at a time, and keeps only its own."""
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
        optimizer updates in place. load_train_state() takes them again."""
        if self._state_refs is None:
            self._state_refs = list(self.model.state_dict(keep_vars=True).items())
        return self._state_refs

    def full_state_dict(self, on_device: bool = False, dtype: torch.dtype | None = None) -> dict[str, Tensor]:
        """On CPU, or with on_device left on this rank's device (a GPU refit then never crosses PCIe), floating
        tensors cast to dtype if given."""
        if on_device and self.shares_weights:
            return self.gather_share(None, True, dtype)
        sd = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if dtype:
            sd = {k: v.to(dtype) if v.is_floating_point() else v for k, v in sd.items()}
        return sd

    def save_train_state(self, folder: Path, policy_version: int) -> None:
        """torch distributed checkpoint of the sharded model and optimizer (checkpoint.py)."""
        checkpoint.save_train_state(folder, self.model, self.optimizer, policy_version, self.rank)

    def load_train_state(self, folder: Path) -> int:
        version = checkpoint.load_train_state(folder, self.model, self.optimizer, self.rank)
        self._state_refs = None
        return version
