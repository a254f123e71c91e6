"""The Megatron-core backend (backend.Backend) over a GPTModel split by tensor and pipeline parallelism, DDP +
distributed optimizer across the remaining ranks.

Every rank of a data-parallel replica runs the same micro-batches (its share of the batch, packed and
token-bounded as in the FSDP2 backend) through Megatron's pipeline schedule; the last pipeline stage
computes the loss with the same pure objective.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core.distributed import finalize_model_grads
from megatron.core.pipeline_parallel import get_forward_backward_func
from torch import Tensor

from ..backend import BatchTokens, StepSums, microbatch_loss
from ..head import compile_head
from ..losses import token_logprobs_and_entropy
from ..packing import BatchPlan, Packed, Seq, pack, plan_batch
from . import head, mapping
from . import train_state as ts
from .attention import PackedRow
from .rope import rope_tables

if TYPE_CHECKING:
    from services.common.config import TrainerSection

_DEFAULT_CHUNK = 4096


class MegatronBackend:
    def __init__(self, model, ref_model, optimizer, cfg: TrainerSection, device, shape, lay):
        self.model, self.ref_model, self.optimizer = model, ref_model, optimizer
        self.cfg, self.device = cfg, device
        self.shape, self.layout = shape, lay
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.vocab_size = shape.vocab_size
        self.dp_rank, self.dp_size = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
        self.tp_group = ps.get_tensor_model_parallel_group()
        self.last_stage = ps.is_pipeline_last_stage()
        # One rank per replica's last stage writes each token's values, so a world sum gathers them.
        self.writer = self.last_stage and ps.get_tensor_model_parallel_rank() == 0
        self.chunk = cfg.memory.logprob_chunk_tokens or _DEFAULT_CHUNK
        self.dtype = torch.bfloat16 if cfg.dtype == "bfloat16" else torch.float32
        self._dummy = pack([Seq([0], [0])], [(0,)], [0, 1])
        compile_head()  # the fused head's softmax math as one inductor kernel per chunk (the GPU has inductor)

    @property
    def has_reference(self) -> bool:
        return self.ref_model is not None

    # -- the micro-batch plan and one packed row ---------------------------------------------------------

    def plan(self, seqs: list[Seq]) -> BatchPlan:
        # Every rank joins the gradient reduction, so each runs at least one (dummy) micro-batch.
        return plan_batch(seqs, self.dp_size, self.cfg.max_tokens_per_microbatch, min_microbatches=1)

    def _row(self, mb: Packed) -> tuple[Tensor, Tensor, PackedRow]:
        dev = self.device
        ids_1T, pos_1T = mb.input_ids_1T.to(dev, non_blocking=True), mb.position_ids_1T.to(dev, non_blocking=True)
        cu = torch.tensor([0, *itertools.accumulate(mb.seq_lens)], dtype=torch.int32, device=dev)
        cos, sin = rope_tables(pos_1T[0], self.shape.head_dim, self.shape.rope_theta, self.dtype)
        max_len = max(mb.seq_lens)
        row = PackedRow(
            qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=max_len, max_seqlen_kv=max_len,
            cos_T1D=cos, sin_T1D=sin,
        )  # fmt: skip
        return ids_1T, pos_1T, row

    def _head(self, *, hidden_states: Tensor, output_layer, output_weight, context, **_) -> Tensor:
        """GPTModel's output processor: logprobs ([R], or [2, R] with entropies) of the row's response tokens."""
        logit_index_R, targets_R, with_entropy, temperature = context
        hidden_RD = hidden_states[logit_index_R, 0]
        if temperature != 1.0:  # logits / temperature, the sampling distribution
            hidden_RD = hidden_RD / temperature
        weight_VD = output_weight if output_weight is not None else output_layer.weight
        if with_entropy:  # tensor_parallel == 1 (checked by the config)
            return torch.stack(token_logprobs_and_entropy(hidden_RD @ weight_VD.t(), targets_R))
        tp_rank = ps.get_tensor_model_parallel_rank()
        return head.token_logprobs(hidden_RD, weight_VD, targets_R, self.chunk, tp_rank, self.tp_group)

    def _run(
        self, model, mbs: list[Packed | None], loss_fn, forward_only: bool, temperature: float, with_entropy=False
    ) -> None:
        """Megatron's schedule over the micro-batches; loss_fn(mb, output) runs on the last stage."""

        def forward_step(data_iterator, model):
            mb = next(data_iterator)
            packed = mb or self._dummy  # a rank with fewer micro-batches runs dummy ones
            ids_1T, pos_1T, row = self._row(packed)
            ctx = (packed.logit_index_R.to(self.device), packed.targets_R.to(self.device), with_entropy, temperature)
            out = model(
                input_ids=ids_1T, position_ids=pos_1T, attention_mask=None, packed_seq_params=row,
                output_processor=self._head, output_processor_context=ctx,
            )  # fmt: skip
            return out, functools.partial(loss_fn, mb)

        get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter(mbs), model=[model], num_microbatches=len(mbs),
            seq_length=max((m or self._dummy).input_ids_1T.shape[1] for m in mbs), micro_batch_size=1,
            forward_only=forward_only,
        )  # fmt: skip

    # -- the batch driver's calls ----------------------------------------------------------------------

    @torch.no_grad()
    def logprobs(self, reference: bool, plan: BatchPlan, temperature: float) -> Tensor:
        model = self.ref_model if reference else self.model
        out_N = torch.zeros(plan.num_tokens, device=self.device)

        def store(mb, output):
            if mb is not None and self.writer:
                out_N[mb.token_index_R.to(self.device)] = output.float()
            return output.sum() * 0.0, torch.ones((), dtype=torch.int, device=self.device), {}

        model.eval()
        self._run(model, plan.rows[self.dp_rank], store, forward_only=True, temperature=temperature)
        dist.all_reduce(out_N)
        return out_N

    def step(self, plan: BatchPlan, batch: BatchTokens, temperature: float, lr: float) -> StepSums:
        old_N = torch.zeros_like(batch.rollout_logp_N)
        sums_4 = torch.zeros(4, device=self.device)
        with_entropy = self.cfg.loss.entropy_coef > 0

        def loss(mb, output):
            one = torch.ones((), dtype=torch.int, device=self.device)
            if mb is None:
                return output.sum() * 0.0, one, {}
            logp_R, entropy_R = (output[0], output[1]) if with_entropy else (output, None)
            weighted, stats_4 = microbatch_loss(self.cfg.loss, mb, batch, logp_R, entropy_R)
            if self.writer:
                sums_4.add_(stats_4)
                old_N[mb.token_index_R.to(self.device)] = logp_R.detach()
            # Summed, not averaged: with calculate_per_token_loss the schedule and DDP leave it unscaled.
            return weighted, one, {}

        self.model.train()
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        self._run(self.model, plan.rows[self.dp_rank], loss, False, temperature, with_entropy)
        finalize_model_grads([self.model], num_tokens=None)  # DP reduce-scatter, tied-embedding sync
        for group in self.optimizer.param_groups:  # as Megatron's own scheduler sets it
            group["lr"] = lr
        ok, grad_norm, _ = self.optimizer.step()
        if not ok:
            raise FloatingPointError("Megatron optimizer skipped the step (non-finite gradients)")
        return StepSums(sums_4, old_N, float(grad_norm))

    # -- weights out -----------------------------------------------------------------------------------

    @property
    def shares_weights(self) -> bool:
        """Every rank can gather and send its share of a refit where all layers are on every rank (no PP)."""
        return ps.get_pipeline_model_parallel_world_size() == 1

    def _hf_tensors(self, gather: bool = True) -> Iterator[tuple[str, Tensor]]:
        """(HF name, full tensor) of this stage's parameters, every rank of a TP group taking part in each
        gather; gather=False: meta tensors of the full shapes, without communication."""
        tp = self.layout.tp_size
        for name, param in self.model.module.named_parameters():
            if name == "output_layer.weight" and self.shape.tied:
                continue  # a copy of the embedding on a last stage without it
            split = tp > 1 and getattr(param, "tensor_model_parallel", False)
            if not gather:
                shards = [torch.empty(param.shape, dtype=param.dtype, device="meta")] * (tp if split else 1)
            elif split:
                shards = [torch.empty_like(param.data) for _ in range(tp)]
                dist.all_gather(shards, param.data.contiguous(), group=self.tp_group)
            else:
                shards = [param.data]
            for hf_name, t in mapping.to_hf(name, shards, self.layout).items():
                yield hf_name, t
                if hf_name == "model.embed_tokens.weight" and self.shape.tied:
                    yield "lm_head.weight", t  # vLLM and the rollout engines load lm_head by name

    def hf_layout(self, dtype: torch.dtype | None = None) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
        return tuple((k, _dtype_name(_cast(v, dtype)), tuple(v.shape)) for k, v in self._hf_tensors(gather=False))

    @torch.no_grad()
    def gather_share(self, owners: dict[str, int], on_device: bool, dtype: torch.dtype | None) -> dict[str, Tensor]:
        share = {k: _cast(v, dtype) for k, v in self._hf_tensors() if owners.get(k) == self.rank}
        return share if on_device else {k: v.cpu() for k, v in share.items()}

    @torch.no_grad()
    def full_state_dict(self, on_device: bool = False, dtype: torch.dtype | None = None) -> dict[str, Tensor]:
        """The HF state dict (TP shards gathered, every stage's layers) on rank 0, {} elsewhere: on CPU, or
        with on_device on this rank's GPU (pipeline stages other than rank 0's still come through the host)."""
        keep = on_device and ps.get_pipeline_model_parallel_world_size() == 1
        writer = self.dp_rank == 0 and ps.get_tensor_model_parallel_rank() == 0
        mine = {}
        for k, v in self._hf_tensors():
            if writer:
                mine[k] = _cast(v, dtype) if keep else _cast(v, dtype).cpu()
        if ps.get_pipeline_model_parallel_world_size() > 1:
            parts = [None] * self.world if self.rank == 0 else None
            dist.gather_object(mine, parts, dst=0)
            mine = {k: v for p in parts or [] for k, v in p.items()}
        return mine if self.rank == 0 else {}

    def save_train_state(self, folder: Path, policy_version: int) -> None:
        """Megatron's own per-rank files (train_state.py), not torch distributed checkpoint."""
        ts.save(folder, self.model.module, self.optimizer, policy_version, self.rank)

    def load_train_state(self, folder: Path) -> int:
        return ts.load(folder, self.model.module, self.optimizer, self.rank)


def _cast(t: Tensor, dtype: torch.dtype | None) -> Tensor:
    return t.to(dtype) if dtype and t.is_floating_point() else t


def _dtype_name(t: Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")
