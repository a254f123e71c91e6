"""The head-to-head with TRL (bench/vs_trl.py) end to end on a tiny random model, so the benchmark cannot rot:
TRL's GRPOTrainer (pinned, installed into its own folder) and this system through every service, a few steps
each, one result file with both curves."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
KEYS = {
    "task",
    "target_accuracy",
    "trl_seconds_to_target",
    "ours_seconds_to_target",
    "time_ratio",
    "trl_curve",
    "ours_curve",
    "trl_final_accuracy",
    "ours_final_accuracy",
    "trl_version",
    "command",
    "machine",
    "tasks",
}


def test_a_tiny_head_to_head_trains_both_sides_and_writes_both_curves(tmp_path):
    out = tmp_path / "vs_trl.json"
    proc = subprocess.run(
        [sys.executable, "bench/vs_trl.py", "--smoke", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert KEYS <= set(result)
    eval_size = 4
    for side in ("trl", "ours"):
        curve = result[f"{side}_curve"]
        # Evaluated before the first step, every 2 steps and after the last (step 3).
        assert [p["step"] for p in curve] == [0, 2, 3], (side, curve)
        assert all(round(p["accuracy"] * eval_size, 6).is_integer() for p in curve)
        # Training seconds exclude evaluation: they start at 0 and grow, and evaluation time is kept apart.
        assert curve[0]["train_s"] == 0.0 < curve[1]["train_s"] < curve[2]["train_s"]
        assert all(p["eval_s"] > 0 for p in curve)
        assert result[f"{side}_final_accuracy"] == sum(p["accuracy"] for p in curve) / 3
    # TRL reads the training prompts in our coordinator's order: every step trains on the same prompts.
    assert result["same_prompts_per_step"] == 1.0
    assert out.with_suffix(".png").stat().st_size > 0  # the plot of both curves
    breakdown = result["ours_step_breakdown_median_s"]
    assert breakdown["timing/total_s"] >= breakdown["timing/policy_training_s"] > 0
    trl_breakdown = result["trl_step_breakdown_median_s"]  # TRL's step split where its rewards were scored
    assert trl_breakdown["total_s"] > trl_breakdown["sync_and_generation_s"] > 0
    assert trl_breakdown["after_generation_s"] > 0
    # Each side's start-up apart from its training, its steps and its completion tokens per training second.
    for side in ("trl", "ours"):
        assert result["startup_s"][side] > 0 and result["steps"][side] == 3
        assert result["completion_tokens_per_train_s"][side] > 0
    assert result["seconds_to"][str(result["target_accuracy"])] == {
        "trl": result["trl_seconds_to_target"],
        "ours": result["ours_seconds_to_target"],
    }
