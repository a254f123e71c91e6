"""bench/seed_bar.py: the bar of the head-to-head over seeds, on curves whose answers are worked out by hand."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from seed_bar import task_bar  # noqa: E402


def curve(acc: list[float], seconds_per_eval: float) -> list[dict]:
    return [{"step": 10 * i, "train_s": seconds_per_eval * i, "accuracy": a} for i, a in enumerate(acc)]


def test_a_collapse_of_ours_alone_fails_the_bar_and_names_its_seed():
    per_seed = {
        0: {"trl": curve([0.30, 0.35, 0.40], 100), "ours": curve([0.30, 0.40, 0.45], 50)},
        1: {"trl": curve([0.30, 0.33, 0.41], 100), "ours": curve([0.30, 0.06, 0.35], 50)},  # 24 points down
        2: {"trl": curve([0.30, 0.20, 0.39], 100), "ours": curve([0.30, 0.22, 0.42], 50)},  # both fall 10 and 8
    }
    result = task_bar(per_seed)
    assert result["worst_drop_below_step0"]["ours"] == {"0": 0.0, "1": 0.24, "2": 0.08}
    assert result["worst_drop_below_step0"]["trl"] == {"0": 0.0, "1": 0.0, "2": 0.1}
    assert result["ours_collapsed_alone"] == ["1"]  # seed 2 fell too, but so did TRL's seed 2
    assert result["bar"]["no_collapse_trl_did_not_share"] is False
    # TRL's final mean: (0.40 + 0.41 + 0.39) / 3 = 0.40 at 200 s; ours reaches (0.45 + 0.35 + 0.42) / 3 = 0.4067
    # at its last evaluation, 100 s.
    assert result["target_accuracy"] == 0.4
    assert result["seconds_to_target"] == {"trl": 200.0, "ours": 100.0}
    assert result["bar"]["sooner_to_trl_final"] is True


def test_a_mean_below_trl_beyond_the_spread_fails_and_one_within_it_passes():
    per_seed = {
        s: {"trl": curve([0.2, t], 10), "ours": curve([0.2, o], 5)}
        for s, t, o in zip(range(3), [0.40, 0.42, 0.44], [0.30, 0.31, 0.32])
    }
    # 11 points below TRL, the standard error of the difference 0.013
    assert task_bar(per_seed)["bar"]["mean_at_least_trl_every_evaluation"] is False
    noisy = {
        s: {"trl": curve([0.2, t], 10), "ours": curve([0.2, o], 5)}
        for s, t, o in zip(range(3), [0.30, 0.45, 0.60], [0.20, 0.50, 0.50])
    }
    evaluation = task_bar(noisy)["evaluations"][1]
    assert evaluation["ours_minus_trl"] == -0.05
    assert evaluation["ours_at_least_trl"] is True  # within twice the standard error of the difference (~0.11)


def test_ours_never_reaching_trls_final_accuracy_is_not_sooner():
    per_seed = {s: {"trl": curve([0.2, 0.5], 100), "ours": curve([0.2, 0.45], 10)} for s in range(2)}
    result = task_bar(per_seed)
    assert result["seconds_to_target"] == {"trl": 100.0, "ours": None}
    assert result["bar"]["sooner_to_trl_final"] is False


def test_ours_trained_past_trls_steps_counts_for_the_time_only_at_steps_every_seed_of_ours_reached():
    # TRL: 2 evaluations past step 0 (100 s each); ours the same training seconds at 40 s an evaluation, so it gets
    # to step 40 on every seed and to step 50 on one.
    per_seed = {
        0: {"trl": curve([0.30, 0.35, 0.40], 100), "ours": curve([0.30, 0.33, 0.37, 0.36, 0.41, 0.20], 40)},
        1: {"trl": curve([0.30, 0.36, 0.42], 100), "ours": curve([0.30, 0.34, 0.38, 0.40, 0.44], 40)},
        2: {"trl": curve([0.30, 0.34, 0.41], 100), "ours": curve([0.30, 0.35, 0.36, 0.41, 0.42], 40)},
    }
    result = task_bar(per_seed)
    assert [e["step"] for e in result["evaluations"]] == [0, 10, 20]  # the steps both sides evaluated
    assert [p["step"] for p in result["mean_curves"]["ours"]] == [0, 10, 20, 30, 40]  # not 50: seed 0 alone
    # TRL's final mean 0.41 at 200 s; ours: 0.3667 at 80 s, 0.39 at 120 s, 0.4233 at 160 s.
    assert result["target_accuracy"] == 0.41
    assert result["seconds_to_target"] == {"trl": 200.0, "ours": 160.0}
    assert result["bar"]["sooner_to_trl_final"] is True
    # Seed 0's step 50 (0.20, ten points below its start) is still a drop of that seed.
    assert result["worst_drop_below_step0"]["ours"]["0"] == 0.1
    assert result["ours_collapsed_alone"] == ["0"]
