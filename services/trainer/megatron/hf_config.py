"""Megatron TransformerConfig / GPTModel arguments from an HF config (Qwen2 / Llama shapes), pure."""

from __future__ import annotations

from dataclasses import dataclass

SUPPORTED = ("qwen2", "llama")


class MegatronConfigError(ValueError):
    """The HF model or the parallel layout cannot be built by this backend."""


@dataclass(frozen=True, slots=True)
class Shape:
    """What the HF config says about the model, in the names the mapping and the model builder use."""

    model_type: str
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden: int
    vocab_size: int
    tied: bool
    qkv_bias: bool
    rms_eps: float
    rope_theta: float
    max_positions: int


def shape_of(hf: dict) -> Shape:
    """Read an HF config.json dict; anything this backend would silently get wrong is an error."""
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED:
        raise MegatronConfigError(f"megatron backend builds model_type {SUPPORTED}, got {model_type!r}")
    rope_scaling = hf.get("rope_scaling") or {}
    if rope_scaling.get("rope_type", rope_scaling.get("type", "default")) != "default":
        raise MegatronConfigError(f"megatron backend supports plain RoPE only, got rope_scaling={rope_scaling}")
    if hf.get("hidden_act", "silu") != "silu":
        raise MegatronConfigError(f"megatron backend builds SwiGLU MLPs, got hidden_act={hf['hidden_act']!r}")
    heads = hf["num_attention_heads"]
    kv = hf.get("num_key_value_heads") or heads
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    return Shape(
        model_type=model_type,
        num_layers=hf["num_hidden_layers"],
        hidden=hf["hidden_size"],
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        ffn_hidden=hf["intermediate_size"],
        vocab_size=hf["vocab_size"],
        tied=bool(hf.get("tie_word_embeddings", False)),
        # Qwen2 always has q/k/v biases; Llama has them only with attention_bias.
        qkv_bias=model_type == "qwen2" or bool(hf.get("attention_bias", False)),
        rms_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=float(hf.get("rope_theta", 10000.0)),
        max_positions=int(hf.get("max_position_embeddings", 4096)),
    )


def check_layout(shape: Shape, tp: int, pp: int, world: int) -> None:
    """TP splits heads, kv groups, the MLP and the vocabulary; PP splits the layers; DP takes the rest."""
    if world % (tp * pp):
        raise MegatronConfigError(f"num_ranks={world} is not a multiple of tensor_parallel*pipeline_parallel={tp * pp}")
    for what, n in (
        ("num_attention_heads", shape.num_heads),
        ("num_key_value_heads", shape.num_kv_heads),
        ("intermediate_size", shape.ffn_hidden),
        ("vocab_size", shape.vocab_size),
    ):
        if n % tp:
            raise MegatronConfigError(f"{what}={n} is not divisible by tensor_parallel={tp}")
    if shape.num_layers % pp:
        raise MegatronConfigError(f"num_hidden_layers={shape.num_layers} is not divisible by pipeline_parallel={pp}")


def transformer_config_kwargs(shape: Shape, *, tp: int, pp: int, bf16: bool, recompute: str) -> dict:
    """Keyword arguments of megatron.core TransformerConfig (activation_func is added by the builder)."""
    kwargs = dict(
        num_layers=shape.num_layers,
        hidden_size=shape.hidden,
        num_attention_heads=shape.num_heads,
        num_query_groups=shape.num_kv_heads,
        kv_channels=shape.head_dim,
        ffn_hidden_size=shape.ffn_hidden,
        normalization="RMSNorm",
        layernorm_epsilon=shape.rms_eps,
        gated_linear_unit=True,
        add_bias_linear=False,
        add_qkv_bias=shape.qkv_bias,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        sequence_parallel=False,
        bf16=bf16,
        # Per-token losses: the schedule neither averages over micro-batches nor DDP over ranks; our
        # token weights already hold the batch-wide normaliser, so the gradient is an exact sum.
        calculate_per_token_loss=True,
        variable_seq_lengths=True,  # packed rows differ in length; PP sends the shapes along
        moe_token_dispatcher_type="alltoall",  # no experts here; the default (allgather) refuses the line above
        apply_rope_fusion=False,
        bias_activation_fusion=True,  # SwiGLU as one compiled kernel that saves only its input
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,  # needs apex
        deallocate_pipeline_outputs=True,
    )
    if recompute == "layer":
        kwargs.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    elif recompute == "selective":
        # Flash attention keeps no score matrix, so recomputing it saves nothing: recompute the norms
        # and the MLP (its [tokens, 2 x ffn] activations are the bulk of a layer's memory) instead.
        kwargs.update(recompute_granularity="selective", recompute_modules=["layernorm", "mlp"])
    elif recompute != "off":
        raise MegatronConfigError(f"activation_checkpointing must be off, layer or selective, got {recompute!r}")
    return kwargs
