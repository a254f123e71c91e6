"""Create a small random Qwen2 model plus tokenizer locally (no hub). Imports torch only when called."""

from __future__ import annotations

from pathlib import Path

from .config import ModelSection
from .tokenizer import EOS, PAD, build_char_tokenizer


def create_tiny_model(cfg: ModelSection, seed: int) -> Path:
    """Write config, safetensors and tokenizer to cfg.path; return the path. Idempotent."""
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    out = Path(cfg.path)
    if (out / "config.json").exists():
        return out
    tok = PreTrainedTokenizerFast(tokenizer_object=build_char_tokenizer(), eos_token=EOS, bos_token=EOS, pad_token=PAD)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    # Write beside, then rename: a crash never leaves a half-written model that looks complete.
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(out)
    return out
