"""The FSDP2 policy (plus a frozen reference) held by every rank; every public method is a collective."""

from __future__ import annotations

import resource
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from services.common.config import RunConfig, TrainerSection
from services.weightsync.manifest import tensor_checksum

from .checkpoint import write_hf
from .losses import grpo_token_loss, k3_kl, mult_prob_error, token_logprobs
from .packing import Packed, Seq, plan, response_offsets


class Engine:
    """Every rank calls the same method with the same arguments; each computes its share of the batch."""

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

    def logprobs(self, seqs: list[Seq]) -> list[Tensor]:
        """Current-policy logprob of every response token, one CPU tensor per sequence, on every rank."""
        flat_N = self._flat_logprobs(self.model, seqs, self._plan(seqs))
        offsets = response_offsets(seqs)
        return [flat_N[offsets[i] : offsets[i + 1]] for i in range(len(seqs))]

    def train(self, seqs: list[Seq], advantages: list[float], rollout_logprobs: list[list[float]]) -> dict[str, float]:
        """One GRPO optimizer step over the whole batch; bumps policy_version. Returns the step's metrics."""
        plans = self._plan(seqs)
        start = time.perf_counter()
        old_N = self._flat_logprobs(self.model, seqs, plans)
        ref_N = None if self.ref_model is None else self._flat_logprobs(self.ref_model, seqs, plans)
        logprobs_s = time.perf_counter() - start

        rollout_N = torch.tensor([lp for seq_lps in rollout_logprobs for lp in seq_lps], dtype=torch.float32)
        response_lens = torch.tensor([len(s.response_ids) for s in seqs])
        adv_N = torch.repeat_interleave(torch.tensor(advantages, dtype=torch.float32), response_lens)
        mismatch = mult_prob_error(old_N, rollout_N, torch.ones_like(old_N)).item()

        start = time.perf_counter()
        loss, kl, grad_norm = self._step(plans, old_N, ref_N, adv_N)
        training_s = time.perf_counter() - start
        logprobs_s, training_s, peak_mem_GiB = self._max_over_ranks([logprobs_s, training_s, self._peak_mem_GiB()])
        self.policy_version += 1
        return {
            "loss": loss,
            "grad_norm": grad_norm,
            "kl": kl,
            "num_tokens": float(sum(s.num_tokens for s in seqs)),
            "mismatch/mult_prob_error": mismatch,
            "timing/logprobs_s": logprobs_s,
            "timing/policy_training_s": training_s,
            "peak_mem_GiB": peak_mem_GiB,
        }

    def full_state_dict(self) -> dict[str, Tensor]:
        """The unsharded HF state dict on CPU on rank 0, {} on the other ranks."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        sd = get_model_state_dict(self.model, options=options)
        # vLLM and the rollout engines load lm_head by name; a missing key would leave them stale.
        assert self.rank != 0 or "lm_head.weight" in sd, "full state dict lacks lm_head.weight"
        return sd

    def save(self, path: Path) -> dict[str, str]:
        """Write an HF checkpoint (rank 0); returns per-tensor checksums there, {} elsewhere."""
        sd = self.full_state_dict()
        if self.rank != 0:
            return {}
        write_hf(sd, self.model_dir, path)
        return {name: tensor_checksum(t) for name, t in sd.items()}

    def _plan(self, seqs: list[Seq]) -> list[list[Packed | None]]:
        # FSDP2 gathers each layer's weights with a collective in every forward and backward, so all
        # ranks must run the same number of micro-batches: the short ranks pad with None (a dummy pass).
        plans = plan(seqs, self.world, self.cfg.max_tokens_per_microbatch)
        num_steps = max(len(p) for p in plans)
        return [p + [None] * (num_steps - len(p)) for p in plans]

    @torch.no_grad()
    def _flat_logprobs(self, model: nn.Module, seqs: list[Seq], plans: list[list[Packed | None]]) -> Tensor:
        out_N = torch.zeros(response_offsets(seqs)[-1], device=self.device)
        for mb in plans[self.rank]:
            if mb is None:
                self._dummy_logits(model)
                continue
            out_N[mb.token_index_R.to(self.device)] = self._forward_logprobs(model, mb)
        # Each token is written by exactly one rank and is 0 elsewhere, so a sum gathers them exactly.
        dist.all_reduce(out_N)
        return out_N.cpu()

    def _forward_logprobs(self, model: nn.Module, mb: Packed) -> Tensor:
        # attention_mask=None + restarting position_ids make attention block-diagonal per sequence;
        # use_cache=False is required, a cache silently disables that detection in transformers.
        logits_1RV = model(
            input_ids=mb.input_ids_1T.to(self.device),
            position_ids=mb.position_ids_1T.to(self.device),
            use_cache=False,
            logits_to_keep=mb.logit_index_R.to(self.device),
        ).logits
        return token_logprobs(logits_1RV[0], mb.targets_R.to(self.device))

    def _dummy_logits(self, model: nn.Module) -> Tensor:
        one_11 = torch.zeros(1, 1, dtype=torch.long, device=self.device)
        return model(input_ids=one_11, position_ids=one_11, use_cache=False, logits_to_keep=1).logits

    def _step(
        self, plans: list[list[Packed | None]], old_N: Tensor, ref_N: Tensor | None, adv_N: Tensor
    ) -> tuple[float, float, float]:
        """Forward/backward every micro-batch, clip, step; returns global per-token loss and kl, grad norm."""
        # FSDP2 averages gradients over ranks, so scaling each rank's token sum by world / N gives the
        # exact gradient of the global per-token mean even when ranks hold different token counts.
        scale = self.world / old_N.numel()
        sums_2 = torch.zeros(2, device=self.device)
        for mb in plans[self.rank]:
            if mb is None:
                (self._dummy_logits(self.model).sum() * 0.0).backward()
                continue
            loss_R, kl_R = self._token_losses(mb, old_N, ref_N, adv_N)
            (loss_R.sum() * scale).backward()
            sums_2 += torch.stack([loss_R.detach().sum(), kl_R.detach().sum()])
        grad_norm = nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        if isinstance(grad_norm, DTensor):
            grad_norm = grad_norm.full_tensor()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        dist.all_reduce(sums_2)
        loss, kl = (sums_2 / old_N.numel()).tolist()
        return loss, kl, grad_norm.item()

    def _token_losses(self, mb: Packed, old_N: Tensor, ref_N: Tensor | None, adv_N: Tensor) -> tuple[Tensor, Tensor]:
        idx_R = mb.token_index_R
        logp_R = self._forward_logprobs(self.model, mb)
        old_R, adv_R = old_N[idx_R].to(self.device), adv_N[idx_R].to(self.device)
        pg_R = grpo_token_loss(logp_R, old_R, adv_R, torch.ones_like(logp_R), self.cfg.clip_eps)
        if ref_N is None:
            return pg_R, torch.zeros_like(pg_R)
        kl_R = k3_kl(logp_R, ref_N[idx_R].to(self.device))
        return pg_R + self.cfg.kl_beta * kl_R, kl_R

    def _max_over_ranks(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def _peak_mem_GiB(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**30
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB


def build_engine(cfg: RunConfig, device: torch.device) -> Engine:
    """Load the policy (and the reference when kl_beta > 0) sharded over all ranks, plus AdamW."""
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    torch.manual_seed(cfg.run.seed)
    model = _load_sharded(cfg.model.path, mesh)
    ref_model = None
    if cfg.trainer.kl_beta > 0:
        ref_model = _load_sharded(cfg.model.path, mesh).requires_grad_(False).eval()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.trainer.lr, weight_decay=cfg.trainer.weight_decay)
    return Engine(model, ref_model, optimizer, cfg.trainer, Path(cfg.model.path), device)


def _load_sharded(path: str, mesh: DeviceMesh) -> nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    # One FSDP unit per decoder layer, so only one layer's full weights exist at a time.
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model
