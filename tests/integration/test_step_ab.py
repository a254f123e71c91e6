"""bench/step_ab.py end to end on the toy config (tiny model, 2 steps a variant), so the A/B tool cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_two_variants_run_through_the_services_and_compare(tmp_path, tiny_model):
    out = tmp_path / "ab.json"
    common = f'model.path="{tiny_model}" model.create=false coordinator.num_prompts=2 trainer.num_ranks=1'
    cmd = [sys.executable, "bench/step_ab.py", "--config", "deploy/configs/local.toml", "--steps", "3"]
    cmd += ["--variant", f"vllm:{common}", "--variant", f"hf:{common} rollout.engine=hf", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert list(result["variants"]) == ["vllm", "hf"]
    assert result["variants"]["hf"]["overrides"][-1] == "rollout.engine=hf"
    for name, variant in result["variants"].items():
        median = variant["median"]
        assert median["timing/total_s"] >= median["timing/generation_s"] > 0, name
    assert result["over_first"]["vllm"]["timing/total_s"] == 1.0
    hf, vllm = result["variants"]["hf"]["median"], result["variants"]["vllm"]["median"]
    assert result["over_first"]["hf"]["timing/total_s"] == round(hf["timing/total_s"] / vllm["timing/total_s"], 3)
