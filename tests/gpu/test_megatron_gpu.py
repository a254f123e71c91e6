"""The Megatron backend on the GPU: logprobs match the FSDP2 backend and a plain fp32 HF forward on the same
checkpoint, both backends take the same update, the HF export gives back the loaded weights, and a resume from
the training state repeats the next step bit for bit."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        importlib.util.find_spec("megatron") is None, reason="megatron-core is not installed (the megatron extra)"
    ),
]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory) -> Path:
    """A small random Qwen2 (GQA, qkv biases, tied embeddings) saved as HF safetensors."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=2048, hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=1024, rope_theta=1e6,
    )  # fmt: skip
    path = tmp_path_factory.mktemp("qwen2")
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    return path


def check(model_dir: Path, tmp_path: Path, ranks: int, tp: int) -> dict:
    out = tmp_path / "check.json"
    script = ROOT / "tests/gpu/megatron_check.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", str(script),
           str(model_dir), str(out), "--tp", str(tp)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize(
    "ranks,tp",
    [
        (1, 1),
        pytest.param(2, 2, marks=pytest.mark.skipif(torch.cuda.device_count() < 2, reason="TP=2 needs 2 GPUs")),
    ],
)
def test_megatron_agrees_with_fsdp2_and_hf(qwen2_dir, tmp_path, ranks, tp):
    r = check(qwen2_dir, tmp_path, ranks, tp)
    assert r["mpe_megatron_vs_hf_fp32"] <= 1.02, r
    assert r["mpe_megatron_vs_fsdp2"] <= 1.02, r
    assert r["export_keys_equal"] and r["export_max_abs_err_vs_bf16"] == 0.0, r
    # The same batch gives the same update: equal grad norms (bf16 noise) and still-matching logprobs after.
    for meg, fsdp in zip(r["megatron"], r["fsdp2"]):
        assert abs(meg["grad_norm"] - fsdp["grad_norm"]) <= 0.05 * fsdp["grad_norm"], r
        assert abs(meg["loss"] - fsdp["loss"]) <= 0.05 * abs(fsdp["loss"]) + 1e-3, r
    assert r["mpe_after_2_steps_megatron_vs_fsdp2"] <= 1.02, r
    # ... and not because nothing moved: two steps change the logprobs more than the backends differ.
    assert r["mpe_megatron_moved_by_training"] > r["mpe_after_2_steps_megatron_vs_fsdp2"], r
    # Resuming from the checkpoint saved after step 1 repeats step 2 exactly.
    assert r["resume_version"] == 1 and r["resume_same_step"] and r["resume_same_logprobs"], r


# Tied embeddings over pipeline stages are synchronised by a CUDA collective when the model is built.
@pytest.mark.parametrize("tied,split", [("tied", "tp"), ("untied", "tp"), ("untied", "pp")])
def test_weights_out_over_two_ranks_give_the_hf_checkpoint_back(tmp_path, tied, split):
    """TP=2 or PP=2 on two gloo ranks: needs megatron-core (the GPU machine's Python), not a GPU."""
    pytest.importorskip("megatron.core")
    script = ROOT / "tests/gpu/megatron_share_check.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script),
           str(tmp_path), tied, split]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    r = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("{")))
    expected = r["disk_keys"] + (["lm_head.weight"] if tied == "tied" else [])
    assert r["full_keys"] == sorted(expected)
    assert r["full_equals_disk"] and r["layout_shapes_match"] and r["layout_dtypes"] == ["bfloat16"]
    if split == "tp":  # each rank sends its share of a refit
        assert r["shares_weights"] and all(r["share_sizes"]) and r["union_equals_full_bf16"], r
    else:  # stages hold different layers: rank 0 sends it all
        assert not r["shares_weights"]
