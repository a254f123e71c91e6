"""One tool-use episode: the engine generates a turn, the model's tool calls run, their results are appended as
token ids, until the model answers without a call or a limit ends the episode."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .episode import Episode, MessageRenderer
from .tools import ToolCall, ToolResult, ToolRunner


@dataclass(frozen=True)
class Limits:
    max_turns: int = 4
    """Model turns in one episode."""
    max_tokens: int = 1024
    """Tokens after the prompt, the model's and the environment's together."""
    max_tool_calls: int = 8
    """Tool calls in one episode; calls past it get an error result instead of running."""

    def __post_init__(self) -> None:
        if min(self.max_turns, self.max_tokens, self.max_tool_calls) < 1:
            raise ValueError(f"every episode limit must be >= 1, got {self}")


@dataclass(frozen=True)
class Turn:
    """A model turn as the engine sampled it."""

    ids: Sequence[int]
    logprobs: Sequence[float]
    text: str
    finish_reason: str
    """"stop" (a stop token ended it) or "length" (its token budget did)."""


Generate = Callable[[list[int], int], Turn]
"""(context ids, max new tokens) -> the model's next turn."""


@dataclass
class EpisodeResult:
    episode: Episode
    end: str
    """"answered" (a turn without a tool call), "length" (a turn cut by its budget), "max_turns" or "max_tokens"."""
    tool_calls: int = 0
    tool_errors: int = 0
    """Calls that gave no result: unreadable, unknown, bad arguments, raised, timed out, or past the limit."""
    env_s: float = 0.0
    """Seconds spent running tools (timing/env_s)."""
    errors: list[str] = field(default_factory=list)

    @property
    def answer(self) -> str:
        """The last model turn's text: what the task's rewards score."""
        return next((m["content"] for m in reversed(self.episode.messages) if m["role"] == "assistant"), "")


def run_episode(
    prompt_ids: Sequence[int],
    generate: Generate,
    parse: Callable[[str], list[ToolCall]],
    tools: ToolRunner,
    renderer: MessageRenderer,
    limits: Limits,
) -> EpisodeResult:
    result = EpisodeResult(Episode(prompt_ids=list(prompt_ids)), end="")
    episode = result.episode
    while True:
        turn = generate(episode.context_ids, limits.max_tokens - len(episode.response_ids))
        episode.add_model_turn(turn.ids, turn.logprobs, turn.text)
        if turn.finish_reason != "stop" or not turn.ids:
            result.end = "length"
            return result
        calls = parse(turn.text)
        if not calls:
            result.end = "answered"
            return result
        if episode.model_turns >= limits.max_turns:
            result.end = "max_turns"
            return result
        messages = [{"role": "tool", "content": _run(call, tools, limits, result).content} for call in calls]
        ids = renderer.ids(messages, turn_end=turn.ids[-1])
        if len(episode.response_ids) + len(ids) >= limits.max_tokens:
            result.end = "max_tokens"  # no room left for the model to answer the results
            return result
        episode.add_messages(messages, ids)


def _run(call: ToolCall, tools: ToolRunner, limits: Limits, result: EpisodeResult) -> ToolResult:
    result.tool_calls += 1
    if result.tool_calls > limits.max_tool_calls:
        out = ToolResult(f"error: no more tool calls in this episode (limit {limits.max_tool_calls})", "limit")
    else:
        start = time.perf_counter()
        out = tools.run(call)
        result.env_s += time.perf_counter() - start
    if out.error:
        result.tool_errors += 1
        result.errors.append(out.error)
    return out
