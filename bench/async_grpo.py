"""Asynchronous GRPO against synchronous: one run config through every service (the path `make run` takes) with
coordinator.max_staleness = 0, 1 and 2, one after the other, the rounds alternating so a slow spell falls on all.

    .venv/bin/python bench/async_grpo.py --config deploy/configs/vs_trl_arithmetic.toml --steps 12 --rounds 2 \\
        --pin --out bench/results/async_grpo/async_cpu.json

--pin puts the trainer's processes on the first core and the rest (rollout worker, weightsync, coordinator, Redis)
on the second (taskset, every thread), so that on 2 cores generation and training really can overlap.

Per setting: the median step after the first (step 1 holds one-off warm-ups), the reward curve against training
seconds, and the rollout worker's idle share of the steps. bound_s is the most an overlap can save to, from the
synchronous run's medians: the larger of generation and training + refit. time_to_reward_ratio_async_1 is the time
the eta = 1 run needed to reach the synchronous run's final reward (its mean over the last 3 steps), over the
synchronous run's time to it.

--eval-target A [B ...] (the real task: the config's held-out evaluation kept, e.g. every 10 steps) adds each run's
held-out accuracy against training seconds and, per target, time_to_accuracy_ratio_<A>_async_1: the training
seconds the eta = 1 run needed for a held-out accuracy of A over the synchronous run's. --settings picks the etas
(default 0 1 2).

    .venv/bin/python bench/async_grpo.py --config deploy/configs/vs_trl_arithmetic.toml --steps 60 --settings 0 1 \
        --eval-target 0.5 0.44 --pin --out bench/results/async_grpo/async_cpu_accuracy.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from provenance import write_result  # noqa: E402 - bench/ is this script's own folder

from services.common.config import dump_toml, load_config  # noqa: E402

SETTINGS = (0, 1, 2)


def _pids_of(text: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(int(pid))
    return found


def pin(run_dir: Path, pinned: set[int]) -> None:
    """Trainer ranks on core 0, everything else of the run on core 1; each process (all its threads) once."""
    for pid in _pids_of(str(run_dir)):
        if pid in pinned or pid == os.getpid():
            continue
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        core = "0" if "services.trainer" in cmdline else "1"
        subprocess.run(["taskset", "-a", "-p", "-c", core, str(pid)], capture_output=True)
        pinned.add(pid)


def run(config: Path, overrides: list[str], work: Path, name: str, pinning: bool) -> list[dict]:
    cfg = load_config(config, [*overrides, f'run.output_dir="{work}"', f'run.run_id="{name}"'])
    path = work / f"{name}.toml"
    path.write_text(dump_toml(cfg))
    log = (work / f"{name}.out").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "deploy.local", "--config", str(path)], stdout=log, stderr=subprocess.STDOUT, cwd=REPO
    )
    pinned: set[int] = set()
    while proc.poll() is None:
        if pinning:
            pin(work / name, pinned)  # a restarted or late service is pinned as it appears
        time.sleep(0.5)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed ({proc.returncode}):\n{(work / f'{name}.out').read_text()[-3000:]}")
    for saved in ("resume", "checkpoints"):
        shutil.rmtree(work / name / saved, ignore_errors=True)
    return read_rows(work / name)


def read_rows(run_dir: Path) -> list[dict]:
    """The run's rows: its steps, and its held-out evaluations (a row with eval/accuracy; the step-0 one has no
    step timings)."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def steps_of(rows: list[dict]) -> list[dict]:
    return [r for r in rows if "timing/total_s" in r]


def accuracy_curve(rows: list[dict]) -> list[tuple[float, float]]:
    """(training seconds, held-out accuracy) per evaluation; the step-0 one is at 0 s."""
    return [(round(r.get("time/train_s", 0.0), 2), round(r["eval/accuracy"], 4)) for r in rows if "eval/accuracy" in r]


def first_at(curve: list[tuple[float, float]], target: float) -> float | None:
    return next((t for t, a in curve if a >= target), None)


def median(rows: list[dict], key: str) -> float:
    return round(statistics.median(r[key] for r in rows if int(r["step"]) > 1), 4)


def reward_curve(rows: list[dict]) -> list[tuple[float, float]]:
    """(training seconds, reward/mean) per step."""
    return [(round(r["time/train_s"], 2), round(r["reward/mean"], 4)) for r in rows]


def time_to(curve: list[tuple[float, float]], target: float, window: int = 3) -> float | None:
    """Training seconds until the mean reward over `window` steps first reaches target."""
    for i in range(window - 1, len(curve)):
        if statistics.fmean(r for _, r in curve[i - window + 1 : i + 1]) >= target:
            return curve[i][0]
    return None


def summary(runs: dict[int, list[list[dict]]], eval_targets: list[float] | None = None) -> dict:
    out: dict = accuracy_summary(runs, eval_targets) if eval_targets else {}
    rounds = {eta: [steps_of(rows) for rows in rs] for eta, rs in runs.items()}
    sync = [r for rows in rounds[0] for r in rows]
    gen, train = median(sync, "timing/generation_s"), median(sync, "timing/policy_training_s")
    refit, logprobs = median(sync, "timing/refit_s"), median(sync, "timing/logprobs_s")
    out["bound_s"] = round(max(gen, train + logprobs + refit), 4)
    finals = {eta: [statistics.fmean(r["reward/mean"] for r in rows[-3:]) for rows in rs] for eta, rs in rounds.items()}
    target = statistics.fmean(finals[0])
    ratios = []
    for eta, rs in rounds.items():
        rows = [r for run_rows in rs for r in run_rows]
        key = "sync" if eta == 0 else f"async_{eta}"
        out[f"step_s_{key}"] = median(rows, "timing/total_s")
        out[f"final_reward_{key}"] = round(statistics.fmean(finals[eta]), 4)
        out[f"final_reward_spread_{key}"] = [round(min(finals[eta]), 4), round(max(finals[eta]), 4)]
        if eta:
            # The median step's share: a checkpoint between two steps (run.checkpoint_every) is rollout idle time
            # outside any step's clock.
            later = [r for r in rows if int(r["step"]) > 1]
            idle = statistics.median(r["async/rollout_idle_s"] / r["timing/total_s"] for r in later)
            out[f"rollout_idle_frac_{key}"] = round(idle, 4)
            out[f"staleness_mean_{key}"] = round(statistics.fmean(r["async/staleness_mean"] for r in rows), 4)
            out[f"dropped_stale_{key}"] = sum(r["async/dropped_stale"] for r in rows)
            # Refits that landed during a generation (in-flight); the others paused nothing.
            pauses = [r["async/rollout_pause_s"] for r in rows if r.get("async/rollout_pause_s")]
            out[f"rollout_pauses_{key}"] = len(pauses)
            out[f"rollout_pause_s_median_{key}"] = round(statistics.median(pauses), 4) if pauses else None
        if eta == 1:
            for sync_rows, async_rows in zip(rounds[0], rs):
                t_sync, t_async = time_to(reward_curve(sync_rows), target), time_to(reward_curve(async_rows), target)
                ratios.append(None if t_sync is None or t_async is None else round(t_async / t_sync, 3))
    out["time_to_reward_ratio_async_1_per_round"] = ratios
    known = [r for r in ratios if r is not None]
    out["time_to_reward_ratio_async_1"] = round(statistics.median(known), 3) if known else None
    out["medians_sync"] = {"generation_s": gen, "policy_training_s": train, "logprobs_s": logprobs, "refit_s": refit}
    return out


def accuracy_summary(runs: dict[int, list[list[dict]]], targets: list[float]) -> dict:
    """Held-out accuracy against training seconds: each setting's final accuracy and, per target, its seconds to
    it (a list over rounds; None where never reached) and the eta = 1 run's time over the synchronous run's (the
    median over rounds). The first target's ratio is also time_to_accuracy_ratio_async_1."""
    out: dict = {"eval_targets": targets}
    curves = {eta: [accuracy_curve(rows) for rows in rs] for eta, rs in runs.items()}
    for eta, cs in curves.items():
        out[f"final_accuracy_{'sync' if eta == 0 else f'async_{eta}'}"] = [c[-1][1] if c else None for c in cs]
    for target in targets:
        for eta, cs in curves.items():
            key = "sync" if eta == 0 else f"async_{eta}"
            out[f"seconds_to_accuracy_{target}_{key}"] = [first_at(c, target) for c in cs]
        if 1 in runs:
            ratios = [
                None if s is None or a is None else round(a / s, 3)
                for s, a in zip(out[f"seconds_to_accuracy_{target}_sync"], out[f"seconds_to_accuracy_{target}_async_1"])
            ]
            known = [r for r in ratios if r is not None]
            out[f"time_to_accuracy_ratio_{target}_async_1"] = round(statistics.median(known), 3) if known else None
    if 1 in runs:
        out["time_to_accuracy_ratio_async_1"] = out[f"time_to_accuracy_ratio_{targets[0]}_async_1"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--pin", action="store_true", help="trainer on core 0, the rest on core 1 (taskset)")
    parser.add_argument("--args", nargs="*", default=[], help="extra overrides for every run")
    parser.add_argument("--out", required=True)
    parser.add_argument("--from-dir", help="summarise the runs already in this folder (eta<E>_<round>/) instead")
    parser.add_argument("--settings", type=int, nargs="+", default=list(SETTINGS), help="the etas; 0 must be one")
    parser.add_argument(
        "--eval-target", type=float, nargs="+", help="keep the config's held-out evaluation; the seconds to these"
    )
    args = parser.parse_args()
    if 0 not in args.settings:
        parser.error("--settings must include 0, the synchronous baseline")
    evals = [] if args.eval_target else ["run.eval_every=0"]
    base = [f"run.num_steps={args.steps}", "run.train_minutes=0", *evals, "run.save_every=0", *args.args]
    work = Path(args.from_dir or tempfile.mkdtemp(prefix="async-"))
    print(f"runs in {work}", flush=True)
    rounds: dict[int, list[list[dict]]] = {eta: [] for eta in args.settings}
    curves: dict[str, list] = {}
    for i in range(args.rounds):
        for eta in args.settings:
            if args.from_dir:
                rows = read_rows(Path(args.from_dir) / f"eta{eta}_{i}")
            else:
                overrides = [*base, f"coordinator.max_staleness={eta}"]
                rows = run(Path(args.config), overrides, work, f"eta{eta}_{i}", args.pin)
            rounds[eta].append(rows)
            curves[f"eta{eta}_round{i}"] = reward_curve(steps_of(rows))
            if args.eval_target:
                curves[f"eta{eta}_round{i}_accuracy"] = accuracy_curve(rows)
            print(f"eta={eta} round {i}: step {median(steps_of(rows), 'timing/total_s')} s", flush=True)
    result = {
        "config": args.config,
        **summary(rounds, args.eval_target),
        "steps_per_run": args.steps,
        "rounds": args.rounds,
        "pinned": args.pin,
        "reward_vs_train_s": curves,
    }
    write_result(args.out, result)
    print(json.dumps({k: v for k, v in result.items() if k != "reward_vs_train_s"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
