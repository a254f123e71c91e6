"""model: the policy (path, or the shape of a tiny random model)."""

from __future__ import annotations

from pydantic import Field

from .base import _Section


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
