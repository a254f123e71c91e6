"""Episodes: the engine generates a model turn, the environment answers it (tool results, a user turn, feedback) as
token ids appended to the episode, until the environment has nothing to add or a limit ends the episode. Every
active episode of a batch generates its next turn in one engine call (run_episodes: lockstep)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .episode import Episode, MessageRenderer

ENDS = ("answered", "length", "max_turns", "max_tokens", "env_error", "engine_error")


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
GenerateMany = Callable[[list[tuple[int, list[int], int]]], list[Turn | str]]
"""[(episode index, context ids, max new tokens)] -> each episode's next turn (or why the engine refused its
context), in one engine call."""


@dataclass
class EpisodeResult:
    episode: Episode
    limits: Limits = Limits()
    task: Mapping[str, Any] = field(default_factory=dict)
    """{"prompt", "answer", "metadata"} of the task row: what an environment function is given."""
    end: str = ""
    """One of ENDS: "answered" (the environment had nothing to add), "length" (a turn cut by its budget),
    "max_turns", "max_tokens", "env_error" (the environment raised, hung or answered nonsense: reward 0) or
    "engine_error" (the engine refused the context)."""
    tool_calls: int = 0
    tool_errors: int = 0
    """Calls that gave no result: unreadable, unknown, bad arguments, raised, timed out, or past the limit."""
    env_s: float = 0.0
    """Seconds the environment took to answer (tools included): timing/env_s."""
    env_reward: float = 0.0
    """The sum of the rewards the environment's steps gave (the `env` reward)."""
    errors: list[str] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return bool(self.end)

    @property
    def answer(self) -> str:
        """The last model turn's text: what the task's rewards score."""
        return next((m["content"] for m in reversed(self.episode.messages) if m["role"] == "assistant"), "")


class Environment(Protocol):
    """What answers a model turn (environment.Environment: tools, an environment function, or both)."""

    def may_answer(self, turn: Turn) -> bool:
        """Whether this turn could get an answer: at the turn limit that makes the end "max_turns", not "answered"."""

    def respond(self, result: EpisodeResult, turn: Turn) -> list[dict[str, str]]:
        """The messages that answer the turn ([]: none); a failed environment sets result.end = "env_error"."""


def advance(result: EpisodeResult, turn: Turn, env: Environment, renderer: MessageRenderer) -> None:
    """Append the model's turn and the environment's answer to it; set result.end where the episode is over."""
    episode, limits = result.episode, result.limits
    episode.add_model_turn(turn.ids, turn.logprobs, turn.text)
    if turn.finish_reason != "stop" or not turn.ids:
        result.end = "length"
        return
    if episode.model_turns >= limits.max_turns:
        result.end = "max_turns" if env.may_answer(turn) else "answered"
        return
    messages = env.respond(result, turn)
    if result.end:  # the environment failed
        return
    if not messages:
        result.end = "answered"
        return
    try:
        ids = renderer.ids(messages, turn_end=turn.ids[-1])
    except Exception as e:  # a message the template cannot render: the environment's fault, not the run's
        result.end = "env_error"
        result.errors.append(f"the chat template cannot render the environment's messages: {type(e).__name__}: {e}")
        return
    if len(episode.response_ids) + len(ids) >= limits.max_tokens:
        result.end = "max_tokens"  # no room left for the model to answer
        return
    episode.add_messages(messages, ids)


def run_episode(
    prompt_ids: Sequence[int],
    generate: Generate,
    env: Environment,
    renderer: MessageRenderer,
    limits: Limits,
    task: Mapping[str, Any] | None = None,
) -> EpisodeResult:
    """One episode, turn by turn."""
    [result] = run_episodes(
        [prompt_ids], lambda asks: [generate(c, n) for _, c, n in asks], env, renderer, limits, [task]
    )
    return result


def run_episodes(
    prompts: Sequence[Sequence[int]],
    generate: GenerateMany,
    env: Environment,
    renderer: MessageRenderer,
    limits: Limits | Sequence[Limits],
    tasks: Sequence[Mapping[str, Any] | None] | None = None,
) -> list[EpisodeResult]:
    """Episodes in lockstep: each round, every episode still going generates its next turn in one engine call, then
    the environment answers each. limits: one for all, or one per prompt. A turn the engine gives as a string (why
    it refused the context) ends that episode ("engine_error")."""
    tasks = tasks or [None] * len(prompts)
    each = [limits] * len(prompts) if isinstance(limits, Limits) else list(limits)
    results = [
        EpisodeResult(Episode(prompt_ids=list(p)), lim, dict(t or {}))
        for p, lim, t in zip(prompts, each, tasks, strict=True)
    ]
    active = list(enumerate(results))
    while active:
        asks = [(i, r.episode.context_ids, r.limits.max_tokens - len(r.episode.response_ids)) for i, r in active]
        turns = generate(asks)
        assert len(turns) == len(active), f"{len(turns)} turns for {len(active)} episodes"
        for (_, result), turn in zip(active, turns):
            if isinstance(turn, str):
                result.end = "engine_error"
                result.errors.append(turn)
            else:
                advance(result, turn, env, renderer)
        active = [(i, r) for i, r in active if not r.done]
    return results
