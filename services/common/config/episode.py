"""task.episode: multi-turn episodes, where tools and an environment answer the model between its turns."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from .base import _Section

BUILTIN_ENVIRONMENTS = {"retry": "services.rollout.multiturn.envs:retry"}
"""Environments by name; `skyrl:<id>` is skyrl-gym's; anything else in task.episode.environment is an import path."""
SKYRL = "skyrl:"


class EpisodeSection(_Section):
    tools: list[str] = []
    """Import paths of tool functions (`my_pkg.tools:multiply`): typed, with a Google-style docstring that describes
    each argument. Their JSON schemas go into the chat template's `tools`; the model's calls run in the rollout
    worker's tool process. Built in: services.rollout.multiturn.envs:calculator."""
    tool_parser: str = "hermes"
    """How the model writes a call: `hermes` (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, the
    format of Qwen2.5 / SmolLM2 / Hermes templates)."""
    environment: str = ""
    """What answers a model turn that calls no tool: a built-in name (`retry`: "wrong, try again" until the answer
    is right), `skyrl:<id>` (a skyrl-gym environment, e.g. skyrl:gsm8k_multi_turn; its rewards are the `env`
    reward), or an import path `my_pkg.env:respond` (services/rollout/multiturn/environment.py has the contract).
    Empty with no tools = one completion per prompt, as always."""
    env_config: dict[str, Any] = {}
    """Passed to a skyrl-gym environment as its env_config."""
    max_turns: int = Field(default=4, ge=1)
    """Model turns per episode."""
    max_tool_calls: int = Field(default=8, ge=1)
    """Tool calls per episode; calls past it get an error result instead of running."""
    timeout_s: float = Field(default=10.0, gt=0)
    """A tool or environment call that runs longer gives an error: a tool's goes back to the model, an environment's
    ends the episode with reward 0."""

    @property
    def multi_turn(self) -> bool:
        return bool(self.tools or self.environment)

    def environment_path(self) -> str:
        if self.environment.startswith(SKYRL):
            return "services.rollout.multiturn.skyrl:respond"
        return BUILTIN_ENVIRONMENTS.get(self.environment, self.environment)
