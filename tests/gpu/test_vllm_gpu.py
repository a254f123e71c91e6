"""CUDA vLLM through the rollout adapter on the GPU machine: generation with logprobs against an HF forward, a refit
straight into the live (fused) parameters read back bit for bit, sleep/wake keeping the weights, and colocated GRPO
steps through all services (FSDP2 trainer and vLLM on one GPU, CUDA IPC refit)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from protos.grpo.v1 import queue_pb2
from services.common.config import ModelSection, RolloutGpuSection, RolloutSection

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# head_dim 64 (FlashAttention's sizes), GQA 4:2, two layers, the char vocabulary (78).
SHAPE = {"hidden_size": 256, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 512}
PROMPTS = [[2, 3, 4, 5], [30, 31, 54], [10, 11, 12, 13, 14, 15]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from services.common.tinymodel import create_tiny_model

    return create_tiny_model(ModelSection(path=str(tmp_path_factory.mktemp("m") / "qwen2"), **SHAPE), seed=0)


@pytest.fixture(scope="module")
def engine(model_dir):
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    from services.rollout.engines import make_engine

    cfg = RolloutSection(
        engine="vllm",
        max_model_len=128,
        max_num_seqs=16,
        gpu=RolloutGpuSection(gpu_memory_utilization=0.15, sleep_level=1),
    )
    return make_engine(cfg, str(model_dir), seed=0)


def _hf(model_dir, weights: dict[str, torch.Tensor] | None = None):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
    if weights is not None:
        model.load_state_dict({k: v.float() for k, v in weights.items()})
    return model


@torch.no_grad()
def _diffs(engine, model, temperature: float = 1.0) -> torch.Tensor:
    """|engine logprob - fp32 HF forward logprob| of every sampled token, under logits / temperature."""
    from services.rollout.engine import Request

    sampling = queue_pb2.SamplingParams(temperature=temperature, top_p=1.0, max_tokens=8, ignore_eos=True, seed=7)
    out = []
    for prompt, samples in zip(PROMPTS, engine.generate([Request(p, 4, sampling) for p in PROMPTS])):
        assert len(samples) == 4
        for s in samples:
            assert len(s.token_ids) == len(s.logprobs) == 8
            ids = torch.tensor([prompt + s.token_ids], device="cuda")
            logp = torch.log_softmax(model(ids).logits[0].float() / temperature, -1)
            pos = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(s.token_ids), device="cuda")
            ref = logp[pos, torch.tensor(s.token_ids, device="cuda")]
            out.append((torch.tensor(s.logprobs, device="cuda") - ref).abs())
    return torch.cat(out)


def _new_weights(model_dir) -> dict[str, torch.Tensor]:
    """Random bf16 weights (std 0.05: sharp enough distributions that a misplaced q/k/v or gate/up slice shows)."""
    from safetensors.torch import load_file

    g = torch.Generator().manual_seed(1)
    held = load_file(model_dir / "model.safetensors")
    return {n: (torch.randn(t.shape, generator=g) * 0.05).to(torch.bfloat16).cuda() for n, t in held.items()}


def test_generation_with_logprobs_through_the_adapter(engine, model_dir):
    assert engine.dtype == torch.bfloat16
    assert engine.lm_head_fp32  # model.lm_head_fp32 (the default): vLLM's logits computed in fp32, as the trainer's
    model = _hf(model_dir)
    for temperature in (1.0, 0.7):
        d = _diffs(engine, model, temperature)
        assert d.mean() < 0.04 and d.max() < 0.25, (temperature, d.mean().item(), d.max().item())


def test_a_refit_lands_in_the_live_fused_parameters_and_reads_back_bit_for_bit(engine, model_dir):
    new = _new_weights(model_dir)
    model_new = _hf(model_dir, new)
    before = _diffs(engine, model_new)  # the old weights, scored under the new ones
    bad = dict(new)
    bad["model.layers.0.self_attn.k_proj.weight"] = bad["model.layers.0.self_attn.k_proj.weight"][:-1]
    with pytest.raises(Exception, match="k_proj"):
        engine.load_weights(sorted(bad.items()))  # refused whole: nothing written
    held = engine.read_weights()
    assert not torch.equal(held["model.norm.weight"], new["model.norm.weight"])

    engine.load_weights(sorted(new.items()))
    held = engine.read_weights()
    assert set(new) <= set(held), set(new) - set(held)
    for name, t in new.items():
        assert held[name].dtype == t.dtype and torch.equal(held[name], t), name
    # q/k/v are rows of one qkv_proj and gate/up of one gate_up_proj: the views share their storage.
    q, k = held["model.layers.0.self_attn.q_proj.weight"], held["model.layers.0.self_attn.k_proj.weight"]
    assert q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr()
    after = _diffs(engine, model_new)  # generation (CUDA graphs) runs on the new weights
    assert after.mean() < 0.04 and after.max() < 0.25, (after.mean().item(), after.max().item())
    assert before.mean() > 5 * after.mean(), (before.mean().item(), after.mean().item())


def test_sleep_and_wake_keep_the_weights(engine, model_dir):
    from services.rollout.engine import Request

    greedy = queue_pb2.SamplingParams(temperature=0.0, top_p=1.0, max_tokens=16, ignore_eos=True)
    want = engine.generate([Request(p, 1, greedy) for p in PROMPTS])
    held = {n: t.clone() for n, t in engine.read_weights().items()}
    torch.cuda.synchronize()
    free_awake = torch.cuda.mem_get_info()[0]
    engine.sleep()
    free_asleep = torch.cuda.mem_get_info()[0]
    assert free_asleep - free_awake > 2**30, (free_awake, free_asleep)  # the KV cache (and weights) handed back
    got = engine.generate([Request(p, 1, greedy) for p in PROMPTS])  # wakes first
    assert [[s.token_ids for s in g] for g in got] == [[s.token_ids for s in g] for g in want]
    for name, t in engine.read_weights().items():
        assert torch.equal(t, held[name]), name


def test_colocated_grpo_steps_with_cuda_vllm_through_all_services(tmp_path):
    shape = [f"model.{k}={v}" for k, v in SHAPE.items()]
    args = [
        f'run.output_dir="{tmp_path}"',
        'run.run_id="vllm"',
        "run.num_steps=3",
        f'model.path="{tmp_path / "model"}"',
        "model.create=true",
        *shape,
        "rollout.engine=vllm",
        "rollout.max_model_len=128",
        "rollout.gpu.gpu_memory_utilization=0.2",
        "rollout.gpu.sleep_level=1",  # the worker sleeps while the trainer trains and wakes for the refit
        "trainer.num_ranks=1",
        "coordinator.num_prompts=8",
        "coordinator.max_tokens=16",
        "coordinator.ignore_eos=true",
        'weightsync.transport="cuda_ipc"',
    ]
    env = {**os.environ, "VLLM_USE_FLASHINFER_SAMPLER": "0"}
    out = subprocess.run(
        [sys.executable, "-m", "deploy.local", *args], capture_output=True, text=True, timeout=600, env=env
    )
    run_dir = tmp_path / "vllm"
    logs = "".join(p.read_text()[-3000:] for p in sorted((run_dir / "logs").glob("*.log")))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:] + logs
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["policy_version"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["mismatch/mult_prob_error"] <= 1.02, r  # trainer fp32 masters vs vLLM bf16
        assert r["refit/bytes"] > 0
        assert r["avg_generated_tokens"] == 16
    for refit in (json.loads(line) for line in (run_dir / "refits.jsonl").read_text().splitlines()):
        assert list(refit["received_checksums"].values()) == [refit["checksum"]]
        assert refit["num_readback_verified"] >= 20  # every tensor of this model, q/k/v and gate/up included
    rollout_log = (run_dir / "logs" / "rollout-0.log").read_text()
    assert "engine vllm" in rollout_log and "version 3 applied" in rollout_log
