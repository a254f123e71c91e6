"""The collapse monitor: a synthetic run that collapses warns at the step it starts, steady noisy runs never do, and
the warnings reach the metrics row, the log and /status."""

from __future__ import annotations

import json
import logging
import random
from types import SimpleNamespace

from fastapi.testclient import TestClient

from services.coordinator.alerts import ALERT_KEYS, AlertThresholds, CollapseMonitor
from services.coordinator.metrics import MetricsLog
from services.coordinator.state import RunState
from services.coordinator.status import make_app

NUM_EVAL = 100
COLLAPSE_STEP = 37


def _step_row(rng: random.Random, step: int, collapsed: bool = False, length_drift: float = 0.0, n: int = 8) -> dict:
    """A step of n completions (8: the head-to-head's 2 prompts x 4 samples) of up to 32 tokens, a fifth ending at EOS
    (the base model explains at length and runs out of tokens); collapsed, the policy answers most prompts with a
    short generic reply, sure of every token."""
    if collapsed:
        lengths = [rng.randint(7, 10) for _ in range(n)]
        eos = [True] * n
        neg_logprob = rng.gauss(0.3, 0.03)
    else:
        lengths = [min(32, max(1, round(rng.gauss(28 - length_drift, 6)))) for _ in range(n)]
        eos = [length < 32 and rng.random() < 0.3 for length in lengths]
        neg_logprob = rng.gauss(1.0, 0.08 * (8 / n) ** 0.5)
    return {
        "step": step,
        "avg_generated_tokens": sum(lengths) / n,
        "response/eos_frac": sum(eos) / n,
        "response/neg_logprob": neg_logprob,
    }


def _eval(rng: random.Random, accuracy: float) -> float:
    return sum(rng.random() < accuracy for _ in range(NUM_EVAL)) / NUM_EVAL


def test_a_collapse_warns_at_the_step_it_starts_on_every_signal(caplog):
    """16 completions a step (4 prompts x 4 samples). At 8, all 8 ending at EOS warns only from a share under ~0.32
    (0.3**8 = 7e-5 is under eos_tail_p, 0.35**8 = 2e-4 is not): in ~1 seed of 5 the length and entropy alone warn."""
    rng, monitor = random.Random(0), CollapseMonitor(num_eval_prompts=NUM_EVAL, num_completions=16)
    assert monitor.observe({"step": 0, "eval/accuracy": 0.35}) == {"alert/eval_accuracy_drop": 0.0}
    fired: dict[str, list[int]] = {k: [] for k in ALERT_KEYS}
    with caplog.at_level(logging.WARNING, logger="services.coordinator.alerts"):
        for step in range(1, 61):
            row = _step_row(rng, step, collapsed=step >= COLLAPSE_STEP, n=16)
            if step % 10 == 0:  # evaluations every 10 steps: rising, then the collapse shows at step 40
                row["eval/accuracy"] = 0.08 if step >= 40 else _eval(rng, 0.35 + step / 200)
            for key, value in monitor.observe(row).items():
                if value:
                    fired[key].append(step)
    assert {k: steps[0] for k, steps in fired.items()} == {
        "alert/eval_accuracy_drop": 40,
        "alert/entropy_shift": COLLAPSE_STEP,
        "alert/length_shift": COLLAPSE_STEP,
        "alert/eos_shift": COLLAPSE_STEP,
    }
    # The held-out drop is measured from the start, so it keeps warning while the accuracy stays down.
    assert fired["alert/eval_accuracy_drop"] == [40, 50, 60]
    first = [r.getMessage() for r in caplog.records if f"step {COLLAPSE_STEP}:" in r.getMessage()]
    assert any("length_shift: avg_generated_tokens" in m and "running baseline of 2" in m for m in first), first
    assert any("eval/accuracy 0.080 is 0.270 below its 0.350 at step 0" in r.getMessage() for r in caplog.records)


def test_steady_noisy_runs_never_warn():
    """Two hundred steps of the same noise as above, the completions shortening slowly as the model learns the
    format (28 -> 24 tokens), held-out accuracy rising with ~5 points of noise, over 20 seeds: not one warning."""
    for seed in range(20):
        rng, monitor = random.Random(seed), CollapseMonitor(num_eval_prompts=NUM_EVAL, num_completions=8)
        monitor.observe({"step": 0, "eval/accuracy": _eval(rng, 0.35)})
        for step in range(1, 201):
            row = _step_row(rng, step, length_drift=4 * step / 200)
            if step % 10 == 0:
                row["eval/accuracy"] = _eval(rng, min(0.5, 0.35 + step / 200))
            alerts = monitor.observe(row)
            assert not any(alerts.values()), (seed, step, alerts, row)
        assert monitor.status() == []


def test_a_dip_within_the_noise_of_the_held_out_set_does_not_warn_and_a_small_set_needs_more():
    monitor = CollapseMonitor(num_eval_prompts=100)
    monitor.observe({"step": 0, "eval/accuracy": 0.35})
    assert monitor.observe({"step": 10, "eval/accuracy": 0.28})["alert/eval_accuracy_drop"] == 0.0
    assert monitor.observe({"step": 20, "eval/accuracy": 0.24})["alert/eval_accuracy_drop"] == 1.0
    # 20 prompts: two standard errors at 0.35 are 0.21, so 0.24 is still noise.
    small = CollapseMonitor(num_eval_prompts=20)
    small.observe({"step": 0, "eval/accuracy": 0.35})
    assert small.observe({"step": 20, "eval/accuracy": 0.24})["alert/eval_accuracy_drop"] == 0.0


def test_a_lasting_shift_is_absorbed_and_status_keeps_its_first_warning_until_it_fires_again():
    rng, monitor = random.Random(1), CollapseMonitor(AlertThresholds(baseline_steps=10))
    for step in range(1, 31):
        monitor.observe(_step_row(rng, step))
    fired = [
        s for s in range(31, 101) if monitor.observe({"step": s, "avg_generated_tokens": 12.0})["alert/length_shift"]
    ]
    assert fired[0] == 31 and len(fired) < 15 and fired == list(range(31, 31 + len(fired)))
    [status] = monitor.status()
    assert (status["signal"], status["step"], status["value"], status["active"]) == (
        "length_shift",
        fired[-1],
        12.0,
        False,
    )


def test_a_resumed_monitor_rebuilds_its_baselines_quietly(caplog):
    rng = random.Random(2)
    rows = [{"step": 0, "eval/accuracy": 0.35}] + [_step_row(rng, s) for s in range(1, 21)]
    monitor = CollapseMonitor(num_eval_prompts=NUM_EVAL, num_completions=8)
    with caplog.at_level(logging.WARNING, logger="services.coordinator.alerts"):
        monitor.prime(rows)
        assert not caplog.records
        assert monitor.observe(_step_row(rng, 21, collapsed=True))["alert/length_shift"] == 1.0
        assert monitor.observe({"step": 30, "eval/accuracy": 0.1})["alert/eval_accuracy_drop"] == 1.0


def test_the_warnings_join_the_written_row_and_show_on_status_and_metrics(tmp_path):
    state, monitor = RunState("r", num_steps=50), CollapseMonitor(num_eval_prompts=NUM_EVAL, num_completions=8)
    log = MetricsLog(tmp_path)
    log.observers.append(monitor.observe)
    log.append_eval({"step": 0, "policy_version": 0, "eval/accuracy": 0.35})
    log.append_eval({"step": 10, "policy_version": 10, "eval/accuracy": 0.05})
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["alert/eval_accuracy_drop"] for r in rows] == [0.0, 1.0]
    state.alerts, state.last_metrics = monitor.status(), rows[-1]
    queue = SimpleNamespace(workers=dict, depths=dict)
    client = TestClient(make_app(state, queue))
    [alert] = client.get("/status").json()["alerts"]
    assert (alert["signal"], alert["step"], alert["value"], alert["baseline"], alert["active"]) == (
        "eval_accuracy_drop",
        10,
        0.05,
        0.35,
        True,
    )
    assert "grpo_alert_eval_accuracy_drop 1.0" in client.get("/metrics").text
