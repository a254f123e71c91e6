"""The two multi-turn examples on SmolLM2-135M-Instruct, each trained for a fixed number of minutes on this machine:
held-out accuracy (greedy, the whole episode), the tool-call rate and turns per episode against wall time from step
0, and the training episodes' turns, tool calls and reward per step, in bench/results/multiturn/multiturn_cpu.json.

    .venv/bin/python bench/multiturn.py --minutes 15                  # both examples, one after the other
    .venv/bin/python bench/multiturn.py --minutes 15 --only retry     # one of them
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from provenance import stamp

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = {
    "retry": "deploy/configs/smollm2_retry.toml",
    "calculator": "deploy/configs/smollm2_calculator.toml",
}


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summarise(run_dir: Path, command: str) -> dict:
    rows = _jsonl(run_dir / "metrics.jsonl")
    evals = [
        {
            "step": int(r["step"]),
            "wall_minutes": round(r.get("time/wall_s", 0.0) / 60, 2),
            "train_minutes": round(r.get("time/train_s", 0.0) / 60, 2),
            "accuracy": r["eval/accuracy"],
            "tool_call_rate": r.get("eval/tool_call_rate", 0.0),
            "turns_mean": r.get("eval/turns_mean", 1.0),
            "mean_length": r["eval/mean_length"],
        }
        for r in rows
        if "eval/accuracy" in r
    ]
    steps = [
        {
            "step": int(r["step"]),
            "reward_mean": round(r["reward/mean"], 4),
            **{
                k.removeprefix("episode/"): round(r.get(k, 0.0), 4)
                for k in (
                    "episode/turns_mean",
                    "episode/tool_calls_mean",
                    "episode/tool_errors",
                    "episode/env_errors",
                    "episode/length_mean",
                )
            },  # fmt: skip
            "env_s": round(r.get("timing/env_s", 0.0), 3),
            "total_s": round(r["timing/total_s"], 2),
            "mult_prob_error": r["mismatch/mult_prob_error"],
        }
        for r in rows
        if "timing/total_s" in r
    ]
    samples = [s for s in _jsonl(run_dir / "samples.jsonl") if s["eval"]]
    last = max(s["step"] for s in samples)
    return {
        "eval_curve": evals,
        "steps": steps,
        "eval_samples_end": [s for s in samples if s["step"] == last][:4],
        "command": command,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=15.0, help="training minutes of each example")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--eval-size", type=int, default=50)
    parser.add_argument("--only", choices=sorted(EXAMPLES), action="append", help="run only these examples")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "multiturn" / "multiturn_cpu.json"))
    args = parser.parse_args()
    out = Path(args.out)
    result = json.loads(out.read_text()) if out.exists() else {}
    subprocess.run(["make", "model", "NAME=smollm2-135m-instruct"], cwd=REPO, check=True)
    for name in args.only or list(EXAMPLES):
        run_id = time.strftime(f"multiturn-{name}-%Y%m%d-%H%M%S")
        overrides = [
            f"run.run_id={run_id}", f"run.train_minutes={args.minutes}", "run.num_steps=10000",
            f"run.eval_every={args.eval_every}", "run.save_every=0", f"task.eval_size={args.eval_size}",
        ]  # fmt: skip
        cmd = ["make", "run", f"CONFIG={EXAMPLES[name]}", f"ARGS={' '.join(overrides)}"]
        subprocess.run(cmd, cwd=REPO, check=True)
        result[name] = {"config": EXAMPLES[name], **summarise(REPO / "runs" / run_id, " ".join(cmd))}
        result |= stamp()
        out.write_text(json.dumps(result, indent=2) + "\n")
        curve = result[name]["eval_curve"]
        print(name, json.dumps([(c["wall_minutes"], c["accuracy"], c["tool_call_rate"]) for c in curve]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
