"""The bar of the head-to-head over seeds (bench/README.md, "Unseen tasks"), from per-seed held-out curves alone.

A task's curves: {seed: {"trl": [...], "ours": [...]}}, each point {"step", "train_s", "accuracy"}, evaluated at the
same steps on both sides (vs_trl.py --seeds). Three checks, each per task:
  - at every evaluation after step 0, our mean over seeds is at least TRL's within the spread over seeds (the
    difference of the means no lower than minus twice its standard error, seed to seed);
  - no seed of ours drops more than MAX_DROP below its step-0 accuracy unless TRL's same seed does too;
  - our time to TRL's final accuracy (both mean curves over seeds; a side's time at an evaluation is the mean of
    its seeds' training seconds there) is below TRL's.
A side's curves may go on past the other's (`vs_trl.py --equal-time`: ours trains for the seconds TRL's same seed
took): the per-step checks use the steps both sides evaluated, the time to TRL's final accuracy each side's own.
"""

from __future__ import annotations

import statistics

MAX_DROP = 0.05
"""A drop below step 0 that counts as a collapse: 5 points of held-out accuracy (the issue's bar)."""

SIDES = ("trl", "ours")


def _at(curve: list[dict], step: int) -> dict:
    return next(p for p in curve if p["step"] == step)


def common_steps(per_seed: dict, sides: tuple[str, ...] = SIDES) -> list[int]:
    """The evaluated steps every seed of these sides has."""
    sets = [{p["step"] for p in c[side]} for c in per_seed.values() for side in sides]
    return sorted(set.intersection(*sets)) if sets else []


def mean_curves(per_seed: dict) -> dict[str, list[dict]]:
    """Per side: at each step all its seeds evaluated, the mean accuracy, its spread over seeds (sample stdev, min,
    max) and the mean training seconds."""
    out: dict[str, list[dict]] = {}
    for side in SIDES:
        rows = []
        for step in common_steps(per_seed, (side,)):
            points = [_at(c[side], step) for c in per_seed.values()]
            acc = [p["accuracy"] for p in points]
            rows.append(
                {
                    "step": step,
                    "accuracy": round(statistics.fmean(acc), 4),
                    "stdev": round(statistics.stdev(acc), 4) if len(acc) > 1 else 0.0,
                    "min": min(acc),
                    "max": max(acc),
                    "train_s": round(statistics.fmean(p["train_s"] for p in points), 2),
                }
            )
        out[side] = rows
    return out


def worst_drops(per_seed: dict) -> dict[str, dict[str, float]]:
    """Per side, per seed: how far below its step-0 accuracy the seed fell at its lowest later evaluation (0 when it
    never fell below)."""
    drops: dict[str, dict[str, float]] = {side: {} for side in SIDES}
    for seed, curves in per_seed.items():
        for side in SIDES:
            curve = sorted(curves[side], key=lambda p: p["step"])
            start = curve[0]["accuracy"]
            lowest = min((p["accuracy"] for p in curve[1:]), default=start)
            drops[side][str(seed)] = round(max(0.0, start - lowest), 4)
    return drops


def seconds_to(curve: list[dict], target: float) -> float | None:
    """Training seconds at the first evaluation at or above target (None: never)."""
    return next((p["train_s"] for p in curve if p["accuracy"] >= target - 1e-9), None)


def task_bar(per_seed: dict) -> dict:
    """The three checks on one task, with the numbers behind each."""
    means = mean_curves(per_seed)
    evaluations = []
    both = common_steps(per_seed)
    for trl, ours in zip(*([p for p in means[side] if p["step"] in both] for side in SIDES)):
        seeds = [
            (_at(c["trl"], trl["step"])["accuracy"], _at(c["ours"], trl["step"])["accuracy"]) for c in per_seed.values()
        ]
        n = len(seeds)
        var = sum(statistics.variance([s[i] for s in seeds]) / n if n > 1 else 0.0 for i in (0, 1))
        diff = ours["accuracy"] - trl["accuracy"]
        evaluations.append(
            {
                "step": trl["step"],
                "ours_minus_trl": round(diff, 4),
                "stderr_of_difference": round(var**0.5, 4),
                "ours_at_least_trl": diff >= -2 * var**0.5 - 1e-9,
            }
        )
    drops = worst_drops(per_seed)
    collapsed = [s for s, d in drops["ours"].items() if d > MAX_DROP + 1e-9 and drops["trl"][s] <= MAX_DROP + 1e-9]
    target = means["trl"][-1]["accuracy"] if means["trl"] else None
    time = {side: seconds_to(means[side], target) if target is not None else None for side in SIDES}
    faster = time["ours"] is not None and (time["trl"] is None or time["ours"] < time["trl"])
    after_start = evaluations[1:]
    return {
        "mean_curves": means,
        "evaluations": evaluations,
        "worst_drop_below_step0": drops,
        "ours_collapsed_alone": collapsed,
        "target_accuracy": target,
        "seconds_to_target": time,
        "bar": {
            "mean_at_least_trl_every_evaluation": all(e["ours_at_least_trl"] for e in after_start),
            "no_collapse_trl_did_not_share": not collapsed,
            "sooner_to_trl_final": faster,
        },
    }
