"""The `make run` path on the GPU machine, both trainer backends: disaggregated on 2 GPUs (NCCL refit) and
colocated on 1 GPU (the rollout worker on the trainer's GPU, CUDA IPC refit), with the transformers engine."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.gpu


def _gpus(n: int):
    return pytest.mark.skipif(torch.cuda.device_count() < n, reason=f"needs {n} GPUs")


_MEGATRON = pytest.mark.skipif(
    importlib.util.find_spec("megatron") is None, reason="megatron-core is not installed (the megatron extra)"
)


@pytest.mark.parametrize(
    "backend,transport",
    [
        pytest.param("fsdp2", "nccl", marks=_gpus(2)),
        pytest.param("megatron", "nccl", marks=[_gpus(2), _MEGATRON]),
        pytest.param("fsdp2", "cuda_ipc", marks=_gpus(1)),
        pytest.param("megatron", "cuda_ipc", marks=[_gpus(1), _MEGATRON]),
    ],
)
def test_grpo_steps_on_the_gpu(tmp_path, tiny_model, backend, transport):
    args = [
        f'run.output_dir="{tmp_path}"',
        'run.run_id="gpu"',
        "run.num_steps=3",
        f'model.path="{tiny_model}"',
        "rollout.engine=hf",
        "trainer.num_ranks=1",
        "coordinator.num_prompts=8",
        "coordinator.max_tokens=8",
        "coordinator.ignore_eos=true",
        f'trainer.backend="{backend}"',
        f'weightsync.transport="{transport}"',
        *(['trainer.dtype="bfloat16"'] if backend == "megatron" else []),
        # No weightsync.cast_dtype: the engine registers bf16 and FSDP2's fp32 masters are sent as bf16
        # without being told, so what the engine reads back is comparable with what was sent.
    ]
    out = subprocess.run([sys.executable, "-m", "deploy.local", *args], capture_output=True, text=True, timeout=600)
    run_dir = tmp_path / "gpu"
    logs = "".join(p.read_text()[-3000:] for p in sorted((run_dir / "logs").glob("*.log")))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:] + logs
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["policy_version"] for r in rows] == [1, 2, 3]
    for r in rows:
        # The engine samples in bf16; FSDP2 holds fp32 master weights, Megatron computes in bf16.
        assert r["mismatch/mult_prob_error"] <= 1.02
        assert r["refit/bytes"] > 0
    for refit in (json.loads(line) for line in (run_dir / "refits.jsonl").read_text().splitlines()):
        assert list(refit["received_checksums"].values()) == [refit["checksum"]]
        assert refit["num_readback_verified"] >= 5  # sum64 read-back checksums, summed on each side's GPU
