"""bench/rollout.py end to end on a tiny model: the service (Redis, weightsync, a worker) and the raw engine take
turns on the same requests and generate the same tokens, so the service-over-raw benchmark cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_service_and_raw_engine_take_turns_on_the_same_work(tmp_path):
    out = tmp_path / "rollout.json"
    cmd = [sys.executable, "bench/rollout.py", "--smoke", "--engine", "hf", "--repeats", "3", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert len(result["service_passes_s"]) == len(result["raw_passes_s"]) == 3
    assert result["tokens"] == result["prompts"] * result["samples_per_prompt"] * result["max_tokens"]
    assert result["service_over_raw_tokps"] == result["raw_s"] / result["service_s"]
    # The warm-up and the three timed passes, each one engine batch of every prompt's samples.
    assert len(result["worker_batches"]) == 4
    assert all(f"({result['prompts'] * result['samples_per_prompt']} sequences)" in b for b in result["worker_batches"])


def test_vllm_host_bench_times_the_rollouts_sampling_options_over_the_same_tokens(tmp_path):
    """bench/vllm_host.py, behind the engine's detokenize=False and flat_logprobs=True: every setting samples the same
    tokens with the same logprobs, read from vLLM's dict container and from its flat one."""
    out = tmp_path / "vllm_host.json"
    cmd = [sys.executable, "bench/vllm_host.py", "--smoke", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["same_tokens"] and result["same_logprobs"]
    assert result["tokens"] == result["prompts"] * result["samples_per_prompt"] * result["max_tokens"]
    assert [len(p) for p in result["passes_s"].values()] == [result["repeats"]] * 3
    assert result["rollout_over_default_tokps"] == result["median_s"]["default"] / result["median_s"]["rollout"]
