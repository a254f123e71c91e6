"""Typed run configuration: one section per service, TOML plus dotted overrides, validated up front."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


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


class ModelSection(_Section):
    path: str = "runs/models/tiny-qwen2"
    """HF model directory (config, safetensors, tokenizer) used by trainer and rollout."""
    create: bool = True
    """Create a small random Qwen2 model at `path` if it does not exist (no hub access)."""
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


class TaskSection(_Section):
    name: Literal["class_continuation", "jsonl"] = "class_continuation"
    """Built-in toy task, or prompts from `prompts_path` (one JSON object per line)."""
    prompts_path: str = ""
    """JSONL with {"prompt": str, "reward": "exact_match"|"class_continuation", "answer": str}."""
    prompt_len: int = Field(default=4, ge=1)
    """Symbols per built-in prompt."""


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
    max_tokens: int = Field(default=8, ge=1)
    """Maximum generated tokens per completion."""
    temperature: float = Field(default=1.0, gt=0.0)
    """Sampling temperature (1.0 keeps rollout logprobs equal to the sampling distribution)."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass."""
    ignore_eos: bool = True
    """Generate exactly max_tokens (the built-in task scores fixed-length answers)."""
    dynamic_sampling: bool = False
    """Train only on groups whose rewards differ (DAPO): an all-equal group has zero advantage everywhere."""
    overlong_buffer_tokens: int = Field(default=0, ge=0)
    """DAPO overlong shaping: the last this many tokens before max_tokens cost up to overlong_penalty; 0 = off."""
    overlong_penalty: float = Field(default=1.0, ge=0)
    """Reward subtracted from a response that reaches max_tokens (with overlong_buffer_tokens > 0)."""
    batch_timeout_s: float = Field(default=600.0, gt=0)
    """A step fails if its batch is not complete within this time."""
    rpc_timeout_s: float = Field(default=600.0, gt=0)
    """Deadline of each Train / PublishWeights call."""


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
    max_model_len: int = Field(default=256, ge=16)
    """vLLM context length."""
    kv_cache_GiB: int = Field(default=1, ge=1)
    """vLLM CPU KV cache size (VLLM_CPU_KVCACHE_SPACE)."""


class TrainerSection(_Section):
    backend: Literal["fsdp2", "megatron"] = "fsdp2"
    """fsdp2 (HF model sharded by FSDP2; CPU or GPU) or megatron (megatron-core GPTModel with tensor and pipeline
    parallelism, distributed optimizer; one CUDA GPU per rank, Python >= 3.12)."""
    tensor_parallel: int = Field(default=1, ge=1)
    """Megatron tensor-parallel size (heads, kv groups, MLP and vocabulary split over this many ranks)."""
    pipeline_parallel: int = Field(default=1, ge=1)
    """Megatron pipeline-parallel size (layers split into this many stages); data parallel takes the rest."""
    host: str = "127.0.0.1"
    """Interface rank 0's gRPC service binds to."""
    num_ranks: int = Field(default=2, ge=1)
    """FSDP2 ranks started by torchrun (gloo on CPU, NCCL on GPU)."""
    grpc_port: int = Field(default=0, ge=0, le=65535)
    """gRPC port served by rank 0; 0 = a free port chosen at launch."""
    lr: float = Field(default=3e-3, gt=0)
    """AdamW learning rate."""
    weight_decay: float = Field(default=0.0, ge=0)
    """AdamW weight decay."""
    max_grad_norm: float = Field(default=1.0, gt=0)
    """Gradient clipping norm."""
    clip_eps: float = Field(default=0.2, gt=0)
    """PPO clip range of the importance ratio."""
    kl_beta: float = Field(default=0.0, ge=0)
    """Weight of the KL penalty to the reference model (see kl_estimator); 0 = no reference model."""
    max_tokens_per_microbatch: int = Field(default=4096, ge=16)
    """Token budget of one forward/backward."""
    minibatches: int = Field(default=1, ge=1)
    """Optimizer steps per Train call (verl's ppo_mini_batch_size, as a count): the batch is split into this
    many mini-batches of whole sequences, one AdamW step each, each normalised on its own. With more than one,
    pi_old (the clip range's anchor) comes from a no-grad pass before the first step, timed in
    timing/logprobs_s; with one, pi_old is the training forward itself and that pass is skipped."""
    loss: Literal["grpo", "dapo", "gspo", "dr_grpo"] = "grpo"
    """Policy loss: grpo (token-level clipped, clip_eps), dapo (token-level clip-higher, clip_eps_low/high),
    gspo (sequence-level ratio, clip_eps_low/high, sequence-mean), dr_grpo (clip_eps, constant normaliser)."""
    clip_eps_low: float = Field(default=0.2, gt=0, lt=1)
    """Lower clip range (ratio >= 1 - clip_eps_low) of dapo and gspo; GSPO's paper uses 3e-4."""
    clip_eps_high: float = Field(default=0.28, gt=0)
    """Upper clip range (ratio <= 1 + clip_eps_high) of dapo and gspo; DAPO uses 0.28, GSPO 4e-4."""
    dr_grpo_norm_tokens: int = Field(default=0, ge=0)
    """Dr.GRPO's constant per-sequence normaliser in tokens; 0 = coordinator.max_tokens (the generation budget)."""
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
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Compute dtype; bfloat16 keeps fp32 master weights, optimizer state and gradient reduction (FSDP2
    MixedPrecisionPolicy)."""
    activation_checkpointing: Literal["off", "layer", "selective"] = "off"
    """Recompute activations in backward: off, every decoder layer, or selective (matmul and attention outputs
    kept, the cheap pointwise ops recomputed)."""
    cpu_offload: bool = False
    """Keep the policy's sharded parameters, gradients and optimizer state in CPU memory (FSDP2
    CPUOffloadPolicy); the optimizer then steps on the CPU."""
    ref_cpu_offload: bool = False
    """Keep the reference model's shards in CPU memory, moved to the device one layer at a time."""
    attn_implementation: Literal["sdpa", "sdpa_varlen", "flex_attention"] = "sdpa"
    """Attention over packed rows: sdpa (transformers builds a block-causal mask from the position ids), sdpa_varlen
    (one causal sdpa call per packed sequence: no mask, no cross-sequence FLOPs; best on GPU), flex_attention
    (block-sparse mask; compiled on first use, GPU)."""
    flash_varlen: bool = True
    """With sdpa_varlen on CUDA in bf16: one flash-attention varlen call per packed row (cu_seqlens) instead of
    one sdpa call per sequence; on CPU, or in fp32, sdpa_varlen always calls sdpa per sequence."""
    logprob_chunk_tokens: int = Field(default=0, ge=0)
    """Fused lm_head + logprob: response tokens per chunk of the fp32 softmax math over the bf16 logits, so the
    fp32 [tokens, vocab] log-softmax and its gradient never exist; 0 = plain logits and log_softmax. Not used
    for entropy_coef > 0 (the entropy needs the full distribution)."""
    compile_layers: bool = False
    """torch.compile (dynamic shapes) every decoder layer's RMSNorms and MLP and the fused head's softmax math,
    fusing their pointwise ops; GPU (CPU needs a C++ compiler and compiles slowly)."""

    @model_validator(mode="after")
    def _check_backend(self) -> TrainerSection:
        if self.backend == "fsdp2":
            if self.tensor_parallel > 1 or self.pipeline_parallel > 1:
                raise ValueError("trainer.tensor_parallel / pipeline_parallel > 1 need trainer.backend = 'megatron'")
            return self
        if self.num_ranks % (self.tensor_parallel * self.pipeline_parallel):
            raise ValueError("trainer.num_ranks must be a multiple of tensor_parallel * pipeline_parallel")
        fsdp2_only = [k for k in ("cpu_offload", "ref_cpu_offload", "compile_layers") if getattr(self, k)]
        if fsdp2_only:
            raise ValueError(f"trainer.{fsdp2_only[0]} is an FSDP2 option; the megatron backend does not take it")
        if self.dtype != "bfloat16":
            raise ValueError("trainer.backend = 'megatron' computes in bfloat16 (flash attention): set trainer.dtype")
        if self.entropy_coef > 0 and self.tensor_parallel > 1:
            raise ValueError("trainer.entropy_coef > 0 needs tensor_parallel = 1 with the megatron backend")
        return self


class WeightsyncSection(_Section):
    host: str = "127.0.0.1"
    """Interface of the control service and of the transfer rendezvous store."""
    grpc_port: int = Field(default=0, ge=0, le=65535)
    """gRPC control port; 0 = a free port chosen at launch."""
    store_port: int = Field(default=0, ge=0, le=65535)
    """TCPStore port for transfer-group rendezvous; 0 = a free port chosen at launch."""
    bucket_bytes: int = Field(default=256 * 2**20, ge=2**10)
    """Bytes per transfer bucket. Each bucket costs a hand-off (~0.6 ms over CUDA IPC on an H200): a
    colocated 1.3B refit received in 31-34 ms with 64 MiB buckets, 13-15 ms with 256 MiB, 9-11 ms with 1 GiB
    (`bench/multigpu.py --colocated --bucket-bytes`, bench/README.md); the sender's ring holds num_buffers."""
    timeout_s: float = Field(default=120.0, gt=0)
    """Deadline of one refit, rendezvous included."""
    transport: Literal["auto", "gloo", "nccl", "cuda_ipc", "ucxx"] = "auto"
    """Data plane of a refit: auto = nccl with a GPU, gloo without; cuda_ipc when trainer and rollout share
    one GPU; ucxx when workers join mid-run (they pull the current version from the trainer by themselves)."""
    num_buffers: int = Field(default=2, ge=1, le=4)
    """Bucket buffers in flight on the sender: packing bucket i+1 overlaps sending bucket i."""
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
    """Where `make up` puts trainer ranks and rollout workers on a Slurm allocation or Docker host."""

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
        if self.coordinator.overlong_buffer_tokens > self.coordinator.max_tokens:
            raise ValueError("coordinator.overlong_buffer_tokens must be <= coordinator.max_tokens")
        if self.trainer.minibatches > self.coordinator.num_prompts * self.coordinator.num_samples:
            raise ValueError("trainer.minibatches must be <= coordinator.num_prompts * coordinator.num_samples")
        if self.task.name == "jsonl" and not self.task.prompts_path:
            raise ValueError("task.prompts_path is required when task.name = 'jsonl'")
        return self


class ConfigError(ValueError):
    """A config file or override that does not validate; the message names the key."""


def _parse_value(raw: str) -> object:
    # TOML scalar syntax for values (numbers, booleans, quoted strings); anything else is a bare string.
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def apply_override(data: dict, override: str) -> None:
    if "=" not in override:
        raise ConfigError(f"override {override!r} is not of the form section.key=value")
    key, raw = override.split("=", 1)
    parts = key.strip().split(".")
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {key!r}: {part!r} is not a section")
    node[parts[-1]] = _parse_value(raw.strip())


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
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        errors = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise ConfigError(f"invalid config: {errors}") from None


def dump_toml(cfg: RunConfig) -> str:
    """The whole config as TOML, so every child process reads exactly what was validated."""
    lines = []
    for section, values in cfg.model_dump().items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {_toml_value(value)}" for key, value in values.items()]
        lines.append("")
    return "\n".join(lines)


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
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
    return load_config(args.config, args.overrides), args
