"""Collect the collapse study's runs (bench/README.md, "The collapse on an unseen task") into one result file: each
run's held-out curve and, per training step, the signals of what one step did (pre-clip gradient norm, mean reward,
lengths, EOS share, the sampled tokens' negative logprob) and the collapse alerts it raised.

    .venv/bin/python bench/collapse_curves.py --out bench/results/collapse_curves/collapse_letter_counting.json \\
        NAME=RUN_DIR[:what differs] ...
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from provenance import write_result

STEP_KEYS = {
    "grad_norm": "grad_norm",  # before clipping (clip_grad_norm_'s return); after clipping it is min(this, 1.0)
    "reward_mean": "reward/mean",
    "mean_tokens": "avg_generated_tokens",
    "eos_frac": "response/eos_frac",
    "neg_logprob": "response/neg_logprob",
}


def read_run(run_dir: Path) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    curve = [
        {"step": int(r["step"]), "accuracy": r["eval/accuracy"], "mean_length": round(r["eval/mean_length"], 2)}
        for r in rows
        if "eval/accuracy" in r
    ]
    steps = [
        {"step": int(r["step"]), **{k: round(r[m], 4) for k, m in STEP_KEYS.items()}} for r in rows if "grad_norm" in r
    ]
    empty = [s["step"] for s in steps if s["grad_norm"] == 0.0]
    # The collapse alerts (services/coordinator/alerts.py) as the run raised them: which, at which step.
    alerts = [{"step": int(r["step"]), "alert": k} for r in rows for k, v in r.items() if k.startswith("alert/") and v]
    return {"curve": curve, "empty_steps": empty, "steps": steps, "alerts": alerts}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="NAME=RUN_DIR[:what differs from the config]")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = {
        "runs": {},
    }
    for spec in args.runs:
        name, rest = spec.split("=", 1)
        run_dir, _, differs = rest.partition(":")
        out["runs"][name] = {"differs": differs, **read_run(Path(run_dir))}
    write_result(args.out, out)
    for name, r in out["runs"].items():
        print(name, [(c["step"], c["accuracy"]) for c in r["curve"]], f"{len(r['empty_steps'])} empty steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
