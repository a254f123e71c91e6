"""HF <-> Megatron layouts (fused qkv by kv group, [gate; up], TP shards) and the HF config checks, without CUDA."""

import pytest
import torch

from services.common.config import TrainerSection
from services.trainer.megatron import mapping
from services.trainer.megatron.hf_config import MegatronConfigError, check_layout, shape_of, transformer_config_kwargs

QWEN2 = dict(
    model_type="qwen2", num_hidden_layers=4, hidden_size=32, num_attention_heads=8, num_key_value_heads=4,
    intermediate_size=48, vocab_size=64, tie_word_embeddings=True, rms_norm_eps=1e-6, rope_theta=1e6,
)  # fmt: skip


def hf_state(shape, gen) -> dict[str, torch.Tensor]:
    d, hd = shape.hidden, shape.head_dim
    sd = {"model.embed_tokens.weight": torch.randn(shape.vocab_size, d, generator=gen)}
    for i in range(shape.num_layers):
        p = f"model.layers.{i}"
        sd[f"{p}.self_attn.q_proj.weight"] = torch.randn(shape.num_heads * hd, d, generator=gen)
        for kv in "kv":
            sd[f"{p}.self_attn.{kv}_proj.weight"] = torch.randn(shape.num_kv_heads * hd, d, generator=gen)
        if shape.qkv_bias:
            sd[f"{p}.self_attn.q_proj.bias"] = torch.randn(shape.num_heads * hd, generator=gen)
            for kv in "kv":
                sd[f"{p}.self_attn.{kv}_proj.bias"] = torch.randn(shape.num_kv_heads * hd, generator=gen)
        sd[f"{p}.self_attn.o_proj.weight"] = torch.randn(d, shape.num_heads * hd, generator=gen)
        for m in ("gate", "up"):
            sd[f"{p}.mlp.{m}_proj.weight"] = torch.randn(shape.ffn_hidden, d, generator=gen)
        sd[f"{p}.mlp.down_proj.weight"] = torch.randn(d, shape.ffn_hidden, generator=gen)
        for n in ("input_layernorm", "post_attention_layernorm"):
            sd[f"{p}.{n}.weight"] = torch.randn(d, generator=gen)
    sd["model.norm.weight"] = torch.randn(d, generator=gen)
    if not shape.tied:
        sd["lm_head.weight"] = torch.randn(shape.vocab_size, d, generator=gen)
    return sd


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (4, 1), (2, 2)])
@pytest.mark.parametrize("model_type,tied", [("qwen2", True), ("llama", False)])
def test_shards_gather_back_to_every_hf_tensor_bit_for_bit(tp, pp, model_type, tied):
    shape = shape_of({**QWEN2, "model_type": model_type, "tie_word_embeddings": tied})
    hf = hf_state(shape, torch.Generator().manual_seed(0))
    per_stage = shape.num_layers // pp
    back = {}
    for stage in range(pp):
        layouts = [mapping.Layout(shape, tp, r, layer_offset=stage * per_stage) for r in range(tp)]
        names = mapping.megatron_names(layouts[0], per_stage, first=stage == 0, last=stage == pp - 1)
        for name in names:
            shards = [mapping.to_megatron(name, hf, lay) for lay in layouts]
            back.update(mapping.to_hf(name, shards, layouts[0]))
    assert back.keys() == hf.keys()
    for name, t in hf.items():
        assert torch.equal(back[name], t), name


def test_fused_qkv_rows_go_kv_group_by_group_and_tp_takes_whole_groups():
    shape = shape_of(QWEN2)  # 8 heads, 4 kv groups: 2 q heads per group, head_dim 4
    hd, per = shape.head_dim, shape.num_heads // shape.num_kv_heads
    hf = hf_state(shape, torch.Generator().manual_seed(1))
    q, k, v = (hf[f"model.layers.2.self_attn.{p}_proj.weight"] for p in "qkv")
    name = "decoder.layers.2.self_attention.linear_qkv.weight"
    for rank in range(2):
        fused = mapping.to_megatron(name, hf, mapping.Layout(shape, 2, rank))
        rows = []
        for g in range(rank * 2, rank * 2 + 2):  # TP=2 over 4 groups: two whole groups per rank
            rows += [q[(g * per + h) * hd : (g * per + h + 1) * hd] for h in range(per)]
            rows += [k[g * hd : (g + 1) * hd], v[g * hd : (g + 1) * hd]]
        assert torch.equal(fused, torch.cat(rows))


def test_fc1_shard_is_this_ranks_gate_rows_then_its_up_rows():
    shape = shape_of(QWEN2)
    hf = hf_state(shape, torch.Generator().manual_seed(2))
    gate, up = hf["model.layers.0.mlp.gate_proj.weight"], hf["model.layers.0.mlp.up_proj.weight"]
    fc1 = mapping.to_megatron("decoder.layers.0.mlp.linear_fc1.weight", hf, mapping.Layout(shape, 2, 1))
    assert torch.equal(fc1, torch.cat([gate[24:], up[24:]]))


def test_layer_offset_maps_a_later_stage_to_its_global_layers():
    shape = shape_of(QWEN2)
    assert mapping.hf_sources("decoder.layers.1.mlp.linear_fc2.weight", mapping.Layout(shape, layer_offset=2)) == [
        "model.layers.3.mlp.down_proj.weight"
    ]


@pytest.mark.parametrize(
    "change,match",
    [
        ({"model_type": "mistral"}, "model_type"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "plain RoPE"),
        ({"hidden_act": "gelu"}, "SwiGLU"),
    ],
)
def test_models_this_backend_would_get_wrong_are_refused(change, match):
    with pytest.raises(MegatronConfigError, match=match):
        shape_of({**QWEN2, **change})


@pytest.mark.parametrize(
    "tp,pp,world,match",
    [(3, 1, 3, "num_attention_heads"), (8, 1, 8, "num_key_value_heads"), (1, 3, 3, "num_hidden_layers"),
     (2, 1, 3, "multiple")],
)  # fmt: skip
def test_impossible_parallel_layouts_are_refused(tp, pp, world, match):
    with pytest.raises(MegatronConfigError, match=match):
        check_layout(shape_of(QWEN2), tp, pp, world)


def test_transformer_config_carries_the_hf_shape():
    kwargs = transformer_config_kwargs(shape_of(QWEN2), tp=2, pp=1, bf16=True, recompute="layer")
    assert (kwargs["num_attention_heads"], kwargs["num_query_groups"], kwargs["kv_channels"]) == (8, 4, 4)
    assert kwargs["ffn_hidden_size"] == 48 and kwargs["add_qkv_bias"] and kwargs["normalization"] == "RMSNorm"
    assert kwargs["recompute_granularity"] == "full" and kwargs["calculate_per_token_loss"]
    assert not transformer_config_kwargs(shape_of({**QWEN2, "model_type": "llama"}), tp=1, pp=1, bf16=True,
                                         recompute="off")["add_qkv_bias"]  # fmt: skip


MEGATRON_BF16 = {"backend": "megatron", "dtype": "bfloat16"}


@pytest.mark.parametrize(
    "fields,match",
    [
        ({"megatron": {"tensor_parallel": 2}}, "backend = 'megatron'"),
        ({"backend": "megatron", "num_ranks": 3, "megatron": {"tensor_parallel": 2}}, "multiple"),
        ({**MEGATRON_BF16, "fsdp2": {"cpu_offload": True}}, "FSDP2 option"),
        ({"backend": "megatron", "dtype": "float32"}, "bfloat16"),
        ({**MEGATRON_BF16, "megatron": {"tensor_parallel": 2}, "loss": {"entropy_coef": 0.01}}, "entropy_coef"),
    ],
)
def test_trainer_config_refuses_what_the_backend_cannot_do(fields, match):
    with pytest.raises(ValueError, match=match):
        TrainerSection(**fields)
