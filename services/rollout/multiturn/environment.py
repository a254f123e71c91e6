"""What answers the model in an episode: its tool calls, run by a ToolRunner, and a user function of the conversation
(feedback, a simulated user, a game), run in a killable child with a timeout.

An environment function is an import path `pkg.module:respond` to

    def respond(messages: list[dict], task: dict) -> str | dict | list[dict] | None

`messages` is the conversation so far (the task's prompt as the first user message, then every turn), `task` is
{"prompt", "answer", "metadata"} of the row, and "episode", an id of the episode that stays the same over its turns
(for an environment that keeps state per episode). It returns the next message(s): a string is one user message, a
dict or a list of dicts are messages with a "role" (user, tool or system) and a string "content"; None or [] ends the
episode, which the task's rewards then score. Or it returns a step, as gym-style environments do: {"messages": [...],
"reward": float, "done": bool}; the rewards of an episode's steps add up to its env reward, which the `env` reward
(task.rewards = {env = 1.0}) gives. One that raises, hangs past its timeout or returns anything else ends its
episode with reward 0 ("env_error", counted), and the run goes on.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from services.common.child import Functions

from .loop import EpisodeResult, Turn
from .tools import ToolCall, ToolResult, ToolRunner

ROLES = ("user", "tool", "system")
"""Roles an environment may write as: never the model's own."""


def as_step(value: Any) -> tuple[list[dict[str, str]], float, str]:
    """An environment function's return value as (messages, reward, why it is not one); no messages end the
    episode."""
    if not (isinstance(value, dict) and "role" not in value):
        messages, why = as_messages(value)
        return messages, 0.0, why
    unknown = set(value) - {"messages", "reward", "done"}
    reward = value.get("reward", 0.0)
    if unknown or isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        return [], 0.0, f"an environment step is {{'messages', 'reward': a finite number, 'done'}}, got {value!r:.200}"
    messages, why = as_messages(value.get("messages"))
    return ([] if value.get("done") else messages), float(reward), why


def as_messages(value: Any) -> tuple[list[dict[str, str]], str]:
    """An environment function's return value as messages, or why it is not one."""
    if value is None:
        return [], ""
    if isinstance(value, str):
        return [{"role": "user", "content": value}], ""
    items = [value] if isinstance(value, dict) else value
    if not isinstance(items, list):
        return [], f"an environment returns a string, a message, a list of messages or None, not {type(value).__name__}"
    out = []
    for m in items:
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            return [], f"an environment message is {{'role': one of {ROLES}, 'content': a string}}, got {m!r:.200}"
        out.append({"role": m["role"], "content": m["content"]})
    return out, ""


class Environment:
    """Answers a model turn: its tool calls first (where tools are configured and the turn makes any), else the
    environment function (where one is configured); no answer ends the episode."""

    def __init__(
        self,
        tools: ToolRunner | None = None,
        parse: Callable[[str], list[ToolCall]] | None = None,
        respond: Functions | None = None,
    ):
        if tools is not None and parse is None:
            raise ValueError("tools need a parser for the model's calls")
        self.tools, self.parse, self.respond_fn = tools, parse, respond

    def may_answer(self, turn: Turn) -> bool:
        """Whether this turn could get an answer: at the turn limit that makes the end "max_turns", not "answered"."""
        return self.respond_fn is not None or bool(self.tools is not None and self.parse(turn.text))

    def respond(self, result: EpisodeResult, turn: Turn) -> list[dict[str, str]]:
        """The messages that answer the turn ([]: none); a failed environment sets result.end = "env_error"."""
        calls = self.parse(turn.text) if self.tools is not None else []
        if calls:
            return [{"role": "tool", "content": self._run(call, result).content} for call in calls]
        if self.respond_fn is None:
            return []
        conversation = [{"role": "user", "content": str(result.task.get("prompt", ""))}, *result.episode.messages]
        start = time.perf_counter()
        value, error = self.respond_fn.call("respond", {"messages": conversation, "task": dict(result.task)})
        result.env_s += time.perf_counter() - start
        messages, reward, why = ([], 0.0, error) if error else as_step(value)
        result.env_reward += reward
        if why:
            result.end = "env_error"
            result.errors.append(f"environment: {why}")
        return messages

    def _run(self, call: ToolCall, result: EpisodeResult) -> ToolResult:
        assert self.tools is not None
        limits = result.limits
        result.tool_calls += 1
        if result.tool_calls > limits.max_tool_calls:
            out = ToolResult(f"error: no more tool calls in this episode (limit {limits.max_tool_calls})", "limit")
        else:
            start = time.perf_counter()
            out = self.tools.run(call)
            result.env_s += time.perf_counter() - start
        if out.error:
            result.tool_errors += 1
            result.errors.append(out.error)
        return out

    def close(self) -> None:
        for part in (self.tools, self.respond_fn):
            if part is not None:
                part.close()
