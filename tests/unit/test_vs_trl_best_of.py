"""bench/vs_trl.py --best-of: the bar read over tries, each side's best time to target and best final accuracy."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from vs_trl import best_of_tries  # noqa: E402


def _try(task: str, trl_s, ours_s, trl_final: float, ours_final: float) -> dict:
    return {
        "task": task,
        "trl_curve": [],
        "trl_seconds_to_target": trl_s,
        "ours_seconds_to_target": ours_s,
        "trl_final_accuracy": trl_final,
        "ours_final_accuracy": ours_final,
    }


def test_each_side_takes_its_best_of_each_measure_and_the_tries_that_hold_both_are_named(tmp_path):
    fast = tmp_path / "fast.json"  # ours first to target, TRL higher at the end; a second task under "tasks"
    second_task = {"b": _try("b", 180.0, 60.0, 0.3, 0.3)}
    fast.write_text(json.dumps({**_try("a", 500.0, 200.0, 0.57, 0.53), "tasks": second_task}))
    slow = tmp_path / "slow.json"  # ours never reaches the target, yet ends highest
    slow.write_text(json.dumps(_try("a", 520.0, None, 0.55, 0.58)))
    bar = best_of_tries([fast, slow])
    a = bar["a"]
    assert (a["trl_best_seconds_to_target"], a["ours_best_seconds_to_target"]) == (500.0, 200.0)
    assert (a["trl_best_final_accuracy"], a["ours_best_final_accuracy"]) == (0.57, 0.58)
    assert a["time_holds"] and a["final_holds"] and a["tries_holding_both_in_their_run"] == []
    assert [t["file"] for t in a["tries"]] == ["fast.json", "slow.json"]
    assert bar["b"]["tries_holding_both_in_their_run"] == ["fast.json"]  # a tie in final accuracy counts


def test_a_side_that_never_reaches_the_target_loses_the_time_half(tmp_path):
    only_trl = tmp_path / "t.json"
    only_trl.write_text(json.dumps(_try("a", 500.0, None, 0.5, 0.6)))
    bar = best_of_tries([only_trl])["a"]
    assert bar["ours_best_seconds_to_target"] is None and not bar["time_holds"] and bar["final_holds"]
