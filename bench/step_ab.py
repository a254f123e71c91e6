"""Variants of one run config through every service (the path `make run` takes), one after the other on the same
machine: the median of each step timing after the first step, per variant, and each over the first variant.

    .venv/bin/python bench/step_ab.py --config deploy/configs/vs_trl_arithmetic.toml --steps 10 \\
        --variant base: --variant plain:rollout.cpu_onednn=false --out bench/results/step_ab/step_ab_cpu.json

A variant is NAME:OVERRIDES (space-separated dotted overrides, none for the config as it is). Each runs --rounds
times, the variants alternating, so a slow spell of the machine falls on all. The SmolLM2 configs need
`make model NAME=smollm2-135m-instruct` first.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from provenance import write_result  # noqa: E402 - bench/ is this script's own folder

from services.common.config import dump_toml, load_config  # noqa: E402

KEYS = (
    "timing/total_s",
    "timing/generation_s",
    "timing/policy_training_s",
    "timing/refit_s",
    "timing/logprobs_s",
    "mismatch/mult_prob_error",
)


def run(config: Path, overrides: list[str], work: Path, name: str) -> list[dict]:
    cfg = load_config(config, [*overrides, f'run.output_dir="{work}"', f'run.run_id="{name}"'])
    path = work / f"{name}.toml"
    path.write_text(dump_toml(cfg))
    cmd = [sys.executable, "-m", "deploy.local", "--config", str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    rows = [json.loads(line) for line in (work / name / "metrics.jsonl").read_text().splitlines() if line.strip()]
    for saved in ("resume", "checkpoints"):  # a SmolLM2 resume checkpoint is ~1.6 GB: runs add up
        shutil.rmtree(work / name / saved, ignore_errors=True)
    return [r for r in rows if "timing/total_s" in r]


def medians(steps: list[dict]) -> dict[str, float]:
    later = [r for r in steps if int(r["step"]) > 1]  # step 1 holds one-off warm-ups
    return {k: round(statistics.median(r[k] for r in later), 4) for k in KEYS if all(k in r for r in later)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--variant", action="append", required=True, help="NAME:OVERRIDES; the first is the base")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    variants = {name: overrides.split() for name, _, overrides in (v.partition(":") for v in args.variant)}
    base = [f"run.num_steps={args.steps}", "run.train_minutes=0", "run.eval_every=0", "run.save_every=0"]
    work = Path(tempfile.mkdtemp(prefix="step-ab-"))
    steps: dict[str, list[dict]] = {name: [] for name in variants}
    for i in range(args.rounds):
        for name, overrides in variants.items():
            steps[name] += run(Path(args.config), [*base, *overrides], work, f"{name}{i}")
            print(name, i, medians(steps[name]), flush=True)
    median = {name: medians(rows) for name, rows in steps.items()}
    first = median[next(iter(variants))]
    result = {
        "config": args.config,
        "variants": {name: {"overrides": variants[name], "median": m} for name, m in median.items()},
        "over_first": {
            name: {k: round(m[k] / first[k], 3) for k in first if k in m and first[k]} for name, m in median.items()
        },
        "steps_per_variant": args.steps * args.rounds,
    }
    write_result(args.out, result)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
