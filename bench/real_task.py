"""The example that learns: SmolLM2-135M-Instruct on reasoning-gym basic_arithmetic through every service, then its
held-out curve, first and last sample completions, command and machine in bench/results/real_task/real_task_cpu.json.

    .venv/bin/python bench/real_task.py                           # make model, then the run (~40 min on 2 cores)
    .venv/bin/python bench/real_task.py --from-run runs/<run_id>   # summarise a run made with the same config
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from provenance import stamp

REPO = Path(__file__).resolve().parents[1]
CONFIG = "deploy/configs/smollm2_arithmetic.toml"


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _elapsed(rows: list[dict]) -> list[float]:
    """Seconds since the run began at each row: the coordinator's clock where the row has it, else the sum of the
    step and evaluation times before it (which leaves out only the milliseconds between steps)."""
    out, total = [], 0.0
    for r in rows:
        total += r.get("timing/total_s", 0.0) + r.get("timing/eval_s", 0.0)
        out.append(r.get("time/wall_s", total))
    return out


def summarise(run_dir: Path, command: str, wall_s: float | None) -> dict:
    cfg = tomllib.loads((run_dir / "config.toml").read_text())
    loss = cfg["trainer"]["loss"]  # a [trainer.loss] table; its name alone in runs written before that
    rows = _jsonl(run_dir / "metrics.jsonl")
    elapsed = _elapsed(rows)
    curve = [
        {
            "step": int(r["step"]),
            "minutes": round(t / 60, 2),
            "accuracy": r["eval/accuracy"],
            "mean_length": r["eval/mean_length"],
        }
        for r, t in zip(rows, elapsed)
        if "eval/accuracy" in r
    ]
    steps = [r for r in rows if "timing/total_s" in r]
    samples = [s for s in _jsonl(run_dir / "samples.jsonl") if s["eval"]]
    first, last = min(s["step"] for s in samples), max(s["step"] for s in samples)
    in_40 = [c for c in curve if c["minutes"] <= 40]
    task = cfg["task"]
    return {
        "model": Path(cfg["model"]["path"]).name,
        "task": {
            "source": task["name"],
            "generator": task["generator"],
            "generator_config": task["generator_config"],
            "train_size": task["train_size"],
            "eval_size": task["eval_size"],
            "system_prompt": task["system_prompt"],
            "rewards": task["rewards"],
        },
        "eval_accuracy_step0": curve[0]["accuracy"],
        "eval_accuracy_final": curve[-1]["accuracy"],
        "eval_accuracy_best_within_40_min": max(c["accuracy"] for c in in_40),
        "wall_minutes": round((wall_s if wall_s is not None else elapsed[-1]) / 60, 2),
        "eval_curve": curve,
        "step_s_median": sorted(r["timing/total_s"] for r in steps)[len(steps) // 2],
        "step_breakdown_median_s": {
            k: sorted(r[k] for r in steps)[len(steps) // 2]
            for k in ("timing/generation_s", "timing/policy_training_s", "timing/refit_s", "timing/logprobs_s")
        },
        "batch": {k: cfg["coordinator"][k] for k in ("num_prompts", "num_samples", "max_tokens", "temperature")},
        "lr": cfg["trainer"]["lr"],
        "loss": loss["name"] if isinstance(loss, dict) else loss,
        "samples": {
            "start": [s for s in samples if s["step"] == first],
            "end": [s for s in samples if s["step"] == last],
        },
        **stamp(),
        "command": command,  # the `make run` that trained, not this summary's
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from-run", default="", help="summarise this run folder instead of running")
    parser.add_argument("--command", default="", help="with --from-run: the command that made the run")
    parser.add_argument("--wall-s", type=float, default=None, help="with --from-run: the run's wall seconds")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "real_task" / "real_task_cpu.json"))
    args = parser.parse_args()
    if args.from_run:
        run_dir, command, wall_s = Path(args.from_run), args.command, args.wall_s
    else:
        run_id = time.strftime("real-task-%Y%m%d-%H%M%S")
        subprocess.run(["make", "model", "NAME=smollm2-135m-instruct"], cwd=REPO, check=True)
        start = time.monotonic()
        cmd = ["make", "run", f"CONFIG={CONFIG}", f"ARGS=run.run_id={run_id}"]
        subprocess.run(cmd, cwd=REPO, check=True)
        run_dir, command, wall_s = REPO / "runs" / run_id, " ".join(cmd), time.monotonic() - start
    result = summarise(run_dir, command or f"python bench/real_task.py --from-run {run_dir}", wall_s)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("samples", "eval_curve")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
