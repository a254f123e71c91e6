"""trainer: the update (loss, memory, FSDP2, Megatron-core) and its ranks."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from .base import _non_default, _Section


class LossSection(_Section):
    """The policy objective: `trainer.loss = "dapo"` (a string) is shorthand for `trainer.loss.name = "dapo"`."""

    name: Literal["grpo", "dapo", "gspo", "dr_grpo"] = "grpo"
    """Policy loss: grpo (token-level clipped, clip_eps), dapo (token-level clip-higher, clip_eps_low/high),
    gspo (sequence-level ratio, clip_eps_low/high, sequence-mean), dr_grpo (clip_eps, constant normaliser)."""
    clip_eps: float = Field(default=0.2, gt=0)
    """PPO clip range of the importance ratio."""
    clip_eps_low: float = Field(default=0.2, gt=0, lt=1)
    """Lower clip range (ratio >= 1 - clip_eps_low) of dapo and gspo; GSPO's paper uses 3e-4."""
    clip_eps_high: float = Field(default=0.28, gt=0)
    """Upper clip range (ratio <= 1 + clip_eps_high) of dapo and gspo; DAPO uses 0.28, GSPO 4e-4."""
    dr_grpo_norm_tokens: int = Field(default=0, ge=0)
    """Dr.GRPO's constant per-sequence normaliser in tokens; 0 = the batch's generation budget, which the
    coordinator sends with each Train call (coordinator.max_tokens)."""
    kl_beta: float = Field(default=0.0, ge=0)
    """Weight of the KL penalty to the reference model (see kl_estimator); 0 = no reference model."""
    kl_estimator: Literal["k1", "k3"] = "k3"
    """Per-token estimator of KL(policy || reference) weighted by kl_beta: k1 = log ratio, k3 = Schulman's k3."""
    entropy_coef: float = Field(default=0.0, ge=0)
    """Weight of the entropy bonus (subtracted from the loss); > 0 also reports `entropy`."""
    importance_sampling: Literal["off", "token", "sequence"] = "off"
    """Truncated importance-sampling correction of the rollout/trainer mismatch (NeMo-RL's
    use_importance_sampling_correction): weight the policy loss by min(pi_trainer / pi_rollout, is_truncation),
    per token or per sequence (product over the sequence's tokens)."""
    is_truncation: float = Field(default=2.0, gt=0)
    """Upper bound of the importance weights (TIS)."""


class MemorySection(_Section):
    """Memory-for-compute trades that both backends honour."""

    activation_checkpointing: Literal["off", "layer", "selective"] = "off"
    """Recompute activations in backward: off, every decoder layer, or selective (matmul and attention outputs
    kept, the cheap pointwise ops recomputed)."""
    logprob_chunk_tokens: int = Field(default=0, ge=0)
    """Fused lm_head + logprob: response tokens per chunk of the fp32 softmax math over the bf16 logits, so the
    fp32 [tokens, vocab] log-softmax and its gradient never exist; 0 = plain logits and log_softmax (the megatron
    backend always chunks, 0 = its default chunk). Not used for trainer.loss.entropy_coef > 0 (the entropy needs
    the full distribution)."""


class Fsdp2Section(_Section):
    """Options of the FSDP2 backend only; the megatron backend refuses any that is not its default."""

    cpu_offload: bool = False
    """Keep the policy's sharded parameters, gradients and optimizer state in CPU memory (FSDP2
    CPUOffloadPolicy); the optimizer then steps on the CPU."""
    ref_cpu_offload: bool = False
    """Keep the reference model's shards in CPU memory, moved to the device one layer at a time."""
    attn_implementation: Literal["sdpa", "sdpa_varlen", "flex_attention"] = "sdpa_varlen"
    """Attention over packed rows: sdpa_varlen (one causal sdpa call per packed block: no T x T mask, no cross-sequence
    FLOPs; bench/trainer_cpu.py measures it against sdpa), sdpa
    (transformers builds a T x T block-causal mask from the position ids), flex_attention (block-sparse mask; compiled
    on first use, GPU). The megatron backend always runs its packed flash attention."""
    flash_varlen: bool = True
    """With sdpa_varlen on CUDA in bf16: one flash-attention varlen call per packed row (cu_seqlens) instead of
    one sdpa call per sequence; on CPU, or in fp32, sdpa_varlen always calls sdpa per sequence."""
    share_prompts: bool = True
    """Responses to the same prompt (a GRPO group) share one copy of its tokens in a packed row: the prompt's forward
    and backward run once per group instead of once per response, the same logprobs and gradients up to float
    summation order. With sdpa and sdpa_varlen (a mask per shared block); flex_attention packs every sequence whole."""
    compile_layers: bool = False
    """torch.compile (dynamic shapes) every decoder layer's RMSNorms and MLP and the fused head's softmax math,
    fusing their pointwise ops; GPU (CPU needs a C++ compiler and compiles slowly)."""


class MegatronSection(_Section):
    """Options of the megatron backend only; the fsdp2 backend refuses any that is not its default."""

    tensor_parallel: int = Field(default=1, ge=1)
    """Megatron tensor-parallel size (heads, kv groups, MLP and vocabulary split over this many ranks)."""
    pipeline_parallel: int = Field(default=1, ge=1)
    """Megatron pipeline-parallel size (layers split into this many stages); data parallel takes the rest."""


# A subsection's key given flat on trainer (the layout before the nesting): the subsection it lives in now.
_MOVED = {
    **{key: "loss" for key in LossSection.model_fields if key != "name"},
    **{key: "memory" for key in MemorySection.model_fields},
    **{key: "fsdp2" for key in Fsdp2Section.model_fields},
    **{key: "megatron" for key in MegatronSection.model_fields},
}


class TrainerSection(_Section):
    backend: Literal["fsdp2", "megatron"] = "fsdp2"
    """fsdp2 (HF model sharded by FSDP2; CPU or GPU; options in trainer.fsdp2) or megatron (megatron-core GPTModel
    with tensor and pipeline parallelism, distributed optimizer; one CUDA GPU per rank, Python >= 3.12; options in
    trainer.megatron)."""
    host: str = "127.0.0.1"
    """Interface rank 0's gRPC service binds to."""
    num_ranks: int = Field(default=2, ge=1)
    """Trainer ranks started by torchrun (gloo on CPU, NCCL on GPU); with megatron, tensor_parallel x
    pipeline_parallel x the data-parallel size."""
    num_threads: int = Field(default=1, ge=1)
    """Intra-op threads of each rank on CPU (torch.set_num_threads and OMP_NUM_THREADS); more than cores / ranks
    only makes the ranks and the rollout workers fight over the cores."""
    grpc_port: int = Field(default=0, ge=0, le=65535)
    """gRPC port served by rank 0; 0 = a free port chosen at launch."""
    checkpoint_root: str = ""
    """A folder where Trainer.Save may write and Trainer.Load may read, besides the run's own folder
    (`<run.output_dir>/<run.run_id>`); empty = the run folder only. Any other path, symlinks followed, is refused
    (INVALID_ARGUMENT): the paths come from callers, and a checkpoint is written and read only where the run keeps
    its own."""
    lr: float = Field(default=1e-6, gt=0)
    """AdamW learning rate (1e-6 is verl's and TRL's GRPO default; small models take 1e-5)."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """The lr after warmup: constant, or a linear / half-cosine decay to 0 at the run's last optimizer step
    (trainer.lr_schedule_steps), as TRL's and transformers' lr_scheduler_type."""
    lr_warmup_steps: int = Field(default=0, ge=0)
    """Optimizer steps of linear warmup from 0 to trainer.lr."""
    lr_schedule_steps: int = Field(default=0, ge=0)
    """Optimizer steps the schedule spans; 0 = run.num_steps x trainer.minibatches (set when the config loads)."""
    weight_decay: float = Field(default=0.0, ge=0)
    """AdamW weight decay."""
    max_grad_norm: float = Field(default=1.0, gt=0)
    """Gradient clipping norm."""
    max_tokens_per_microbatch: int = Field(default=4096, ge=16)
    """Token budget of one forward/backward."""
    minibatches: int = Field(default=1, ge=1)
    """Optimizer steps per Train call (verl's ppo_mini_batch_size, as a count): the batch is split into this
    many mini-batches of whole sequences, one AdamW step each, each normalised on its own. With more than one,
    pi_old (the clip range's anchor) comes from a no-grad pass before the first step, timed in
    timing/logprobs_s; with one, pi_old is the training forward itself and that pass is skipped."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Compute dtype; bfloat16 keeps fp32 master weights, optimizer state and gradient reduction (FSDP2
    MixedPrecisionPolicy)."""
    loss: LossSection = LossSection()
    """The policy objective ([trainer.loss]); `trainer.loss = "dapo"` is short for `trainer.loss.name = "dapo"`."""
    memory: MemorySection = MemorySection()
    """Activation recomputation and the fused logprob head ([trainer.memory])."""
    fsdp2: Fsdp2Section = Fsdp2Section()
    """FSDP2-only options ([trainer.fsdp2]): offload, attention kernel, compiled layers."""
    megatron: MegatronSection = MegatronSection()
    """Megatron-only options ([trainer.megatron]): tensor and pipeline parallel sizes."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_flat_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        moved = [f"trainer.{k} moved to trainer.{_MOVED[k]}.{k}" for k in data if k in _MOVED]
        if moved:
            raise ValueError("; ".join(moved))
        return data

    @field_validator("loss", mode="before")
    @classmethod
    def _loss_shorthand(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value  # trainer.loss = "dapo"

    @model_validator(mode="after")
    def _check_backend(self) -> TrainerSection:
        tp, pp = self.megatron.tensor_parallel, self.megatron.pipeline_parallel
        if self.backend == "fsdp2":
            if megatron_only := _non_default(self.megatron):
                raise ValueError(
                    f"trainer.megatron.{megatron_only[0]} is a Megatron option: it needs trainer.backend = 'megatron'"
                )
            return self
        if self.num_ranks % (tp * pp):
            raise ValueError(
                "trainer.num_ranks must be a multiple of trainer.megatron.tensor_parallel * pipeline_parallel"
            )
        if fsdp2_only := _non_default(self.fsdp2):
            raise ValueError(f"trainer.fsdp2.{fsdp2_only[0]} is an FSDP2 option; the megatron backend does not take it")
        if self.dtype != "bfloat16":
            raise ValueError("trainer.backend = 'megatron' computes in bfloat16 (flash attention): set trainer.dtype")
        if self.lr_schedule != "constant" or self.lr_warmup_steps:
            raise ValueError(
                "trainer.lr_schedule and trainer.lr_warmup_steps are FSDP2 options so far: the megatron "
                "backend trains at a constant trainer.lr"
            )
        if self.loss.entropy_coef > 0 and tp > 1:
            raise ValueError(
                "trainer.loss.entropy_coef > 0 needs trainer.megatron.tensor_parallel = 1 with the megatron backend"
            )
        return self
