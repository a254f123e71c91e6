"""The `make run` path on 2 GPUs: FSDP2 on NCCL, the transformers engine, NCCL refit (run on the device)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_grpo_steps_on_two_gpus(tmp_path, tiny_model):
    args = [
        f'run.output_dir="{tmp_path}"',
        'run.run_id="gpu"',
        "run.num_steps=3",
        f'model.path="{tiny_model}"',
        "rollout.engine=hf",
        "trainer.num_ranks=1",
        "coordinator.num_prompts=8",
    ]
    out = subprocess.run([sys.executable, "-m", "deploy.local", *args], capture_output=True, text=True, timeout=600)
    run_dir = tmp_path / "gpu"
    logs = "".join(p.read_text()[-3000:] for p in sorted((run_dir / "logs").glob("*.log")))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:] + logs
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["policy_version"] for r in rows] == [1, 2, 3]
    for r in rows:
        # The engine samples in bf16, the trainer holds fp32 master weights.
        assert r["mismatch/mult_prob_error"] <= 1.02
        assert r["refit/bytes"] > 0
    for refit in (json.loads(line) for line in (run_dir / "refits.jsonl").read_text().splitlines()):
        assert list(refit["received_checksums"].values()) == [refit["checksum"]]
