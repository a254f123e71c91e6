"""bench/trainer.py and bench/trainer_cpu.py keep running: their smoke modes (tiny model, engine and naive side)
write every key."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _smoke(script: str, out: Path) -> dict:
    """Run bench/<script> --smoke --out out; its result file."""
    cmd = [sys.executable, str(REPO / "bench" / script), "--smoke", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(out.read_text())


def test_bench_smoke_writes_the_headline_keys(tmp_path):
    results = _smoke("trainer.py", tmp_path / "trainer.json")
    assert results["errors"] == {}
    for key in ("mfu_tiny", "speedup_vs_naive_tiny", "peak_mem_GiB_tiny", "tokens_per_s_tiny"):
        assert results[key] > 0, key
    assert results["command"].startswith("python bench/trainer.py") and results["machine"]
    engine = results["configs"]["tiny"]["engine"]
    assert engine["attn_implementation"] == "sdpa_varlen" and engine["check_max_abs_logprob_diff_vs_naive"] < 0.05


def test_cpu_bench_smoke_runs_every_variant(tmp_path):
    out = tmp_path / "trainer_cpu.json"
    results = _smoke("trainer_cpu.py", out)
    names = {"engine_sdpa_mask", "engine_sdpa_mask_shared", "engine_sdpa_varlen", "engine_sdpa_varlen_shared"}
    assert set(results["variants"]) == {f"{n}_t1" for n in names} | {"naive_padded_t1"}
    assert all(v["median_s"] > 0 for v in results["variants"].values())
    assert results["command"] == f"python bench/trainer_cpu.py --smoke --out {out}"
