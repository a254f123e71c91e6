"""Optional experiment trackers fed with every metrics row: TensorBoard event files and Weights & Biases (offline
unless the user configured wandb to sync: there is no network here). Off by default (run.loggers)."""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)


class Logger(Protocol):
    def log(self, m: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


def _numbers(m: dict[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in m.items() if isinstance(v, int | float) and math.isfinite(v) and k != "step"}


class TensorBoardLogger:
    """Event files under <run_dir>/tensorboard: `tensorboard --logdir runs/<run_id>/tensorboard`."""

    def __init__(self, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log(self, m: dict[str, float], step: int) -> None:
        for key, value in _numbers(m).items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    """A wandb run under <run_dir>/wandb; offline unless WANDB_MODE says otherwise (`wandb sync` uploads it later)."""

    def __init__(self, run_dir: Path, run_id: str, config: dict):
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "grpo-services"),
            name=run_id,
            dir=str(run_dir),
            config=config,
            mode=os.environ.get("WANDB_MODE", "offline"),
        )

    def log(self, m: dict[str, float], step: int) -> None:
        self.run.log(_numbers(m), step=step)

    def close(self) -> None:
        self.run.finish()


def make_loggers(names: list[str], run_dir: Path, run_id: str, config: dict) -> list[Logger]:
    loggers: list[Logger] = []
    for name in names:
        if name == "tensorboard":
            loggers.append(TensorBoardLogger(run_dir))
        elif name == "wandb":
            loggers.append(WandbLogger(run_dir, run_id, config))
        else:
            raise ValueError(f"unknown logger {name!r}; choose from tensorboard, wandb")
    return loggers
