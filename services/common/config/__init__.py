"""Typed run configuration: one section per service, TOML plus dotted overrides, validated up front.

One module per section (run, model, task and its episode, coordinator, rollout, trainer, weightsync, infra: redis
and placement), RunConfig with the checks that span sections (run_config.py), and the loader (loader.py). Import
from here:
`from services.common.config import RunConfig, load_config`.
"""

from .coordinator import AlertsSection, CoordinatorSection
from .episode import EpisodeSection
from .infra import PlacementSection, RedisSection
from .loader import ConfigError, apply_override, config_from_cli, dump_toml, load_config
from .model import ModelSection
from .rollout import RolloutGpuSection, RolloutSection
from .run import RunSection
from .run_config import RunConfig
from .task import TaskSection
from .trainer import Fsdp2Section, LossSection, MegatronSection, MemorySection, TrainerSection
from .weightsync import WeightsyncSection

__all__ = [
    "AlertsSection",
    "ConfigError",
    "CoordinatorSection",
    "EpisodeSection",
    "Fsdp2Section",
    "LossSection",
    "MegatronSection",
    "MemorySection",
    "ModelSection",
    "PlacementSection",
    "RedisSection",
    "RolloutGpuSection",
    "RolloutSection",
    "RunConfig",
    "RunSection",
    "TaskSection",
    "TrainerSection",
    "WeightsyncSection",
    "apply_override",
    "config_from_cli",
    "dump_toml",
    "load_config",
]
