"""rollout: the workers and their engine."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from .base import _non_default, _Section


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
    fp32 between them; "all" runs vLLM's CUDA kernels, which round where the trainer's eager bf16 modules do
    (what it did to the logprob mismatch: bench/README.md, CUDA vLLM on one GPU)."""

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
    this: one batched call generates more tokens a second than one call per prompt (docs/tuning.md)."""
    num_threads: int = Field(default=1, ge=1)
    """Intra-op (OMP) threads of each worker on CPU; more than the cores it shares with the trainer oversubscribes
    them (docs/tuning.md has the figures)."""
    kv_cache_GiB: int = Field(default=1, ge=1)
    """vLLM CPU KV cache size (VLLM_CPU_KVCACHE_SPACE)."""
    cpu_compile: bool = False
    """vLLM's CPU build with torch.compile (inductor) instead of eager: faster generation, a longer engine start
    (docs/tuning.md has both). Off by default so tests and short runs start fast; ignored on a GPU
    (rollout.gpu.enforce_eager)."""
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
