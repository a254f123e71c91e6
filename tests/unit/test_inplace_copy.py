"""The in-place refit's mapping from HF names onto a vLLM-shaped model (fused qkv rows, padded vocabulary, tied
lm_head) and its copy: every HF tensor lands in its rows, a tied tensor is written once, a bad name or shape
changes nothing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from services.rollout.vllm_ext import copy_into, hf_views

Q, KV, HIDDEN, VOCAB, PADDED = 8, 4, 6, 10, 16


class Fused(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.output_partition_sizes = [Q, KV, KV]
        self.weight = torch.nn.Parameter(torch.zeros(Q + 2 * KV, HIDDEN))
        self.weight.output_dim = 0


class Embedding(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.org_vocab_size = VOCAB
        self.weight = torch.nn.Parameter(torch.zeros(PADDED, HIDDEN))


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv_proj = Fused()


class Inner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = Embedding()
        self.layers = torch.nn.ModuleList([torch.nn.Module()])
        self.layers[0].self_attn = Attention()


class VllmShaped(torch.nn.Module):
    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}

    def __init__(self):
        super().__init__()
        self.model = Inner()
        self.config = SimpleNamespace(tie_word_embeddings=True)


def hf_weights() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    attn = "model.layers.0.self_attn"
    return [
        ("model.embed_tokens.weight", torch.randn(VOCAB, HIDDEN, generator=g)),
        (f"{attn}.q_proj.weight", torch.randn(Q, HIDDEN, generator=g)),
        (f"{attn}.k_proj.weight", torch.randn(KV, HIDDEN, generator=g)),
        (f"{attn}.v_proj.weight", torch.randn(KV, HIDDEN, generator=g)),
    ]


def test_each_hf_tensor_lands_in_its_rows_of_the_fused_and_padded_parameters():
    model = VllmShaped()
    named = hf_weights()
    embed = dict(named)["model.embed_tokens.weight"]
    written = copy_into(hf_views(model), [*named, ("lm_head.weight", embed)])
    qkv = model.model.layers[0].self_attn.qkv_proj.weight.detach()
    assert torch.equal(qkv, torch.cat([t for n, t in named[1:]]))
    assert torch.equal(model.model.embed_tokens.weight[:VOCAB].detach(), embed)
    assert not model.model.embed_tokens.weight[VOCAB:].any()  # vLLM's padding rows untouched
    assert written == sum(t.numel() * 4 for _, t in named)  # the tied lm_head is the embedding: written once
    assert torch.equal(hf_views(model)["lm_head.weight"], embed)


@pytest.mark.parametrize(
    "bad", [("model.layers.0.self_attn.o_proj.weight", torch.ones(2, 2)), ("lm_head.weight", torch.ones(VOCAB, 1))]
)
def test_an_unknown_name_or_a_wrong_shape_changes_nothing(bad):
    model = VllmShaped()
    with pytest.raises(ValueError, match="o_proj|is \\(10, 1\\)"):
        copy_into(hf_views(model), [*hf_weights(), bad])
    assert not any(p.any() for p in model.parameters())
