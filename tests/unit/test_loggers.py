"""The optional trackers receive every metrics row: TensorBoard event files read back, a wandb offline run on disk."""

from __future__ import annotations

import pytest

from services.coordinator.loggers import make_loggers
from services.coordinator.metrics import MetricsLog


def test_tensorboard_gets_every_row_of_metrics_jsonl(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = MetricsLog(tmp_path, make_loggers(["tensorboard"], tmp_path, "r", {}))
    log.append_eval({"step": 0, "policy_version": 0, "eval/accuracy": 0.25})
    log.append_eval({"step": 3, "policy_version": 3, "eval/accuracy": 0.5, "note": "not a number"})
    log.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("eval/accuracy")] == [(0, 0.25), (3, 0.5)]
    assert "note" not in events.Tags()["scalars"]
    assert [r["eval/accuracy"] for r in log.read()] == [0.25, 0.5]


def test_wandb_runs_offline_into_the_run_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    log = MetricsLog(tmp_path, make_loggers(["wandb"], tmp_path, "r", {"trainer": {"lr": 1e-5}}))
    log.append_eval({"step": 0, "policy_version": 0, "eval/accuracy": 0.25})
    log.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


def test_an_unknown_logger_is_refused():
    with pytest.raises(ValueError, match="unknown logger 'mlflow'"):
        make_loggers(["mlflow"], None, "r", {})
