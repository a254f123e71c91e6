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

from trl_pairing import KNOWN_DIFFERENCES, differences, ours_settings, trl_settings  # noqa: E402

CONFIGS = [REPO / "deploy/configs/smollm2_arithmetic.toml", *sorted((REPO / "deploy/configs").glob("vs_trl_*.toml"))]


def _trl_resolved(config: Path, work: Path) -> dict:
    """GRPOConfig.to_dict() of trl_side.py on this config, with gradient checkpointing as vs_trl.py runs it."""
    from vs_trl import install_trl

    path = work / "run.toml"
    path.write_text(dump_toml(load_config(config)))
    cmd = [sys.executable, "bench/trl_side.py", "--config", str(path), "--work", str(work), "--print-config"]
    env = {**os.environ, "PYTHONPATH": f"{install_trl()}{os.pathsep}{REPO}"}
    proc = subprocess.run([*cmd, "--gradient-checkpointing"], capture_output=True, text=True, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_trl_runs_our_step_settings_but_the_listed_differences(config, tmp_path):
    diff = differences(ours_settings(load_config(config)), trl_settings(_trl_resolved(config, tmp_path)))
    unlisted = {name: f"ours {o!r}, TRL {t!r}" for name, (o, t) in diff.items() if name not in KNOWN_DIFFERENCES}
    assert not unlisted, f"not in bench/trl_pairing.KNOWN_DIFFERENCES: {unlisted}"
    # The list says what the benchmark runs now: a difference that went away leaves it too.
    assert set(KNOWN_DIFFERENCES) <= set(diff), sorted(set(KNOWN_DIFFERENCES) - set(diff))
