"""compile_layers' rotary embedding: the compiled function takes the place of HF's in the modeling module
(the attention looks it up there at call time) and gives the same logits, forward and backward."""

from __future__ import annotations

import torch
import transformers.models.qwen2.modeling_qwen2 as modeling
from transformers import Qwen2Config, Qwen2ForCausalLM

from services.trainer.fsdp2 import build


def test_compiled_rotary_replaces_hf_and_keeps_the_logits_and_gradients(monkeypatch):
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)  # restored after
    monkeypatch.setattr(build, "_COMPILED_ROTARY", {})
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2,
    )  # fmt: skip
    model = Qwen2ForCausalLM(cfg)
    ids = torch.randint(0, 64, (1, 11))

    def logits_and_grad():
        model.zero_grad()
        logits = model(input_ids=ids).logits
        logits.square().mean().backward()
        return logits.detach(), model.model.layers[0].self_attn.q_proj.weight.grad.clone()

    eager = logits_and_grad()
    original = modeling.apply_rotary_pos_emb
    build.compile_rotary(model)
    assert modeling.apply_rotary_pos_emb is not original
    build.compile_rotary(model)  # idempotent: compiled once per modeling module
    assert list(build._COMPILED_ROTARY) == [modeling.__name__]
    compiled = logits_and_grad()
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
