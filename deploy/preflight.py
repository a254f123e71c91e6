"""What every launcher checks before it starts any process: the model folder and the whole task data."""

from __future__ import annotations

from pathlib import Path

from services.common.config import ConfigError, RunConfig


def preflight(cfg: RunConfig) -> None:
    """Create the tiny model if asked; then the model folder exists, every reward loads, and every prompt loads,
    renders and fits (services.common.tasks.check_task). Raises ConfigError with one line naming the cause (the
    file, row and field for data)."""
    from services.common.tasks import TaskError, check_task

    if cfg.model.create:
        from services.common.tinymodel import create_tiny_model

        create_tiny_model(cfg.model, cfg.run.seed)
    elif not (Path(cfg.model.path) / "config.json").is_file():
        raise ConfigError(
            f"model.path = {cfg.model.path!r} holds no HF model (no config.json): point it at a local checkpoint, "
            "build SmolLM2 with `make model NAME=smollm2-135m-instruct`, or set model.create = true for a tiny one"
        )
    if cfg.run.resume:
        from services.coordinator.run_record import RunRecord

        if RunRecord(Path(cfg.run.resume)).latest() is None:
            raise ConfigError(
                f"run.resume = {cfg.run.resume!r} holds no complete checkpoint (resume/step_N with run_state.json); "
                "a run saves one every run.checkpoint_every steps, at its end and when stopped"
            )
    from services.common.rewards import load_reward

    for name in cfg.task.reward_weights():
        try:
            load_reward(name)
        except ValueError as e:
            raise ConfigError(f"task.rewards: {e}") from None
    try:
        check_task(cfg)
    except TaskError as e:
        raise ConfigError(str(e)) from None
