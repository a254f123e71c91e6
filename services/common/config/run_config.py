"""RunConfig: every section, and the checks that span sections."""

from __future__ import annotations

from pydantic import model_validator

from .base import _Section
from .coordinator import CoordinatorSection
from .infra import PlacementSection, RedisSection
from .model import ModelSection
from .rollout import RolloutSection
from .run import RunSection
from .task import TaskSection
from .trainer import TrainerSection
from .weightsync import WeightsyncSection


class RunConfig(_Section):
    run: RunSection = RunSection()
    model: ModelSection = ModelSection()
    task: TaskSection = TaskSection()
    coordinator: CoordinatorSection = CoordinatorSection()
    rollout: RolloutSection = RolloutSection()
    trainer: TrainerSection = TrainerSection()
    weightsync: WeightsyncSection = WeightsyncSection()
    redis: RedisSection = RedisSection()
    placement: PlacementSection = PlacementSection()

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        if self.model.hidden_size % self.model.num_heads:
            raise ValueError("model.hidden_size must be a multiple of model.num_heads")
        if self.model.num_heads % self.model.num_kv_heads:
            raise ValueError("model.num_heads must be a multiple of model.num_kv_heads")
        if self.trainer.loss.name == "dr_grpo" and "advantage" not in self.coordinator.model_fields_set:
            self.coordinator.advantage = "dr_grpo"
        if self.coordinator.top_p != 1.0:
            raise ValueError(
                "coordinator.top_p < 1 is refused: the trainer scores tokens under the full softmax(logits / "
                "temperature), not the truncated nucleus, so the ratio would be off-policy; lower the temperature"
            )
        if self.coordinator.max_staleness:
            loss = self.trainer.loss
            if "importance_sampling" not in loss.model_fields_set:
                loss.importance_sampling = "token"
            elif loss.importance_sampling == "off":
                raise ValueError(
                    "coordinator.max_staleness >= 1 trains on groups sampled by older policies: "
                    "trainer.loss.importance_sampling = 'off' would leave that unweighted; use 'token' or 'sequence'"
                )
        if self.task.episode.multi_turn and not self.task.chat_template:
            raise ValueError(
                "task.episode (tools, an environment) needs task.chat_template = true: each environment message is "
                "appended as the chat template renders it"
            )
        episode = self.task.episode
        if "tool_use" in self.task.rewards and not episode.tools:
            raise ValueError("task.rewards: tool_use scores tool calls: it needs task.episode.tools")
        if "env" in self.task.rewards and not episode.environment:
            raise ValueError("task.rewards: env is the environment's reward: it needs task.episode.environment")
        if self.coordinator.overlong_buffer_tokens > self.coordinator.max_tokens:
            raise ValueError("coordinator.overlong_buffer_tokens must be <= coordinator.max_tokens")
        if not self.trainer.lr_schedule_steps:
            self.trainer.lr_schedule_steps = self.run.num_steps * self.trainer.minibatches
        if self.trainer.lr_warmup_steps > self.trainer.lr_schedule_steps:
            raise ValueError(
                "trainer.lr_warmup_steps must be <= trainer.lr_schedule_steps (run.num_steps x minibatches)"
            )
        if self.trainer.minibatches > self.coordinator.num_prompts * self.coordinator.num_samples:
            raise ValueError("trainer.minibatches must be <= coordinator.num_prompts * coordinator.num_samples")
        if self.task.name in ("dataset", "jsonl") and not self.task.prompts_path:
            raise ValueError(f"task.prompts_path is required when task.name = {self.task.name!r}")
        if self.task.name == "reasoning_gym" and not self.task.generator:
            raise ValueError("task.generator is required when task.name = 'reasoning_gym' (e.g. basic_arithmetic)")
        return self
