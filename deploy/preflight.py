"""What every launcher checks before it starts any process: the model folder, an external Redis (it answers, and
lets the URL's user in) and the whole task data. Ports (free, no two services on one) and GPUs (present where
placement.device asks for them) are checked by the placement (deploy/placement/)."""

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
    if cfg.redis.url:
        _check_redis(cfg.redis.url)
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


def _check_redis(url: str) -> None:
    """An external Redis (redis.url set) answers PING within 5 s with the URL's credentials."""
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=5)
    shown = url.split("@")[-1]  # no password in the message
    try:
        client.ping()
    except redis.AuthenticationError as e:
        raise ConfigError(f"redis.url = ...@{shown} refuses the URL's credentials: {e}") from None
    except redis.ResponseError as e:  # NOAUTH: the server wants a password the URL lacks
        raise ConfigError(f"redis.url = ...{shown}: {e} (put the user and password in the URL)") from None
    except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
        raise ConfigError(f"redis.url = ...{shown} does not answer: {e}") from None
    finally:
        client.close()
