"""The head-to-head's two sides run the same step settings: TRL's GRPOConfig as bench/trl_side.py builds it (through
bench/trl_pairing.TO_TRL, read back after TRL resolved it) against our resolved config, for every config the
benchmarks run. A difference fails the test unless trl_pairing.KNOWN_DIFFERENCES lists it with its reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from services.common.config import dump_toml, load_config

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from trl_pairing import KNOWN_DIFFERENCES, KNOWN_DIFFERENCES_GPU, differences, ours_settings, trl_settings  # noqa: E402
from vs_trl import GPU_ARGS, install_trl  # noqa: E402

CONFIGS = [REPO / "deploy/configs/smollm2_arithmetic.toml", *sorted((REPO / "deploy/configs").glob("vs_trl_*.toml"))]


def _trl_resolved(config: Path, work: Path, gpu: bool = False) -> dict:
    """GRPOConfig.to_dict() of trl_side.py on this config as vs_trl.py runs it: on two cores with gradient
    checkpointing, on a GPU (--gpu, resolved here without one) with vLLM colocated and no checkpointing."""
    path = work / "run.toml"
    path.write_text(dump_toml(load_config(config, GPU_ARGS if gpu else [])))
    cmd = [sys.executable, "bench/trl_side.py", "--config", str(path), "--work", str(work), "--print-config"]
    env = {**os.environ, "PYTHONPATH": f"{install_trl()}{os.pathsep}{REPO}"}
    flags = ["--gpu"] if gpu else ["--gradient-checkpointing"]
    proc = subprocess.run([*cmd, *flags], capture_output=True, text=True, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_trl_runs_our_step_settings_but_the_listed_differences(config, tmp_path):
    diff = differences(ours_settings(load_config(config)), trl_settings(_trl_resolved(config, tmp_path)))
    unlisted = {name: f"ours {o!r}, TRL {t!r}" for name, (o, t) in diff.items() if name not in KNOWN_DIFFERENCES}
    assert not unlisted, f"not in bench/trl_pairing.KNOWN_DIFFERENCES: {unlisted}"
    # The list says what the benchmark runs now: a difference that went away leaves it too.
    assert set(KNOWN_DIFFERENCES) <= set(diff), sorted(set(KNOWN_DIFFERENCES) - set(diff))


def test_on_a_gpu_both_sides_sample_with_vllm_and_weight_tokens_alike(tmp_path):
    """vs_trl.py --gpu: TRL's vLLM colocated, our truncated importance weight as its token_truncate at the same cap."""
    config = REPO / "deploy/configs/vs_trl_arithmetic.toml"
    ours = ours_settings(load_config(config, GPU_ARGS))
    trl = trl_settings(_trl_resolved(config, tmp_path, gpu=True))
    assert trl["generation engine"] == "vllm" and trl["rollout importance-sampling correction"] == "token"
    assert trl["importance weight bounds"] == (None, 2.0) and trl["compute dtype"] == "bfloat16"
    diff = differences(ours, trl)
    assert set(diff) == set(KNOWN_DIFFERENCES_GPU), {k: f"ours {o!r}, TRL {t!r}" for k, (o, t) in diff.items()}
