"""A tied-embedding model saved through the trainer engine's Save path loads in vLLM and in transformers with
the source model's greedy tokens. Run as a script, this file is the one-rank trainer that saves."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

PROMPTS = [[2, 3, 4, 5], [30, 31, 54], [10, 11, 12, 13, 14, 15], [60, 40, 20], [7]]
NEW_TOKENS = 8


def _tied_model(out: Path) -> Path:
    """A random tied Llama (head_dim 32, which vLLM's CPU attention takes) with the repo's char tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from services.common.tokenizer import EOS, PAD, build_char_tokenizer

    tok = PreTrainedTokenizerFast(tokenizer_object=build_char_tokenizer(), eos_token=EOS, bos_token=EOS, pad_token=PAD)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)  # far from flat logits, so float noise never flips a greedy choice
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@torch.no_grad()
def _hf_greedy(model_dir: Path) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    for prompt in PROMPTS:
        ids = list(prompt)
        for _ in range(NEW_TOKENS):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        out.append(ids[len(prompt) :])
    return out


def _vllm_greedy(model_dir: Path) -> list[list[int]]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=str(model_dir), dtype="float32", max_model_len=512, enforce_eager=True, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in PROMPTS], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def _save_worker(model_dir: str, out: str) -> None:
    """One trainer rank: load the model as the trainer does and write it through Engine.save."""
    import torch.distributed as dist

    from services.common.config import TrainerSection
    from services.trainer.fsdp2.build import assemble_engine, load_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    cfg = TrainerSection()
    model = load_model(model_dir, torch.float32, cfg.fsdp2.attn_implementation)
    engine = assemble_engine(model, None, cfg, Path(model_dir), torch.device("cpu"))
    engine.save(Path(out), train_state=False)
    dist.destroy_process_group()


def _trainer_save(model_dir: Path, out: Path) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", __file__]
    proc = subprocess.run([*cmd, str(model_dir), str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_a_tied_export_generates_the_source_tokens_in_vllm_and_transformers(tmp_path, monkeypatch):
    from safetensors import safe_open

    source = _tied_model(tmp_path / "source")
    expected = _hf_greedy(source)
    assert any(t != 0 for ids in expected for t in ids)

    export = tmp_path / "ckpt"
    _trainer_save(source, export)
    assert _hf_greedy(export) == expected

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    assert _vllm_greedy(export) == expected
    # Both names, for vLLM's in-place reload from a path too (it keeps a stale head without lm_head.weight).
    with safe_open(export / "model.safetensors", "pt") as st:
        assert {"model.embed_tokens.weight", "lm_head.weight"} <= set(st.keys())


if __name__ == "__main__":
    _save_worker(*sys.argv[1:3])
