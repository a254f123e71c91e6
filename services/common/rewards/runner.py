"""RewardRunner: scores completions with rewards in one long-lived spawned child, so a reward that hangs, crashes the
interpreter or leaks memory costs one sample's component (scored 0.0 and counted as an error), never the caller."""

from __future__ import annotations

import logging
import math
import multiprocessing
import multiprocessing.connection
import numbers
import threading
from dataclasses import dataclass

from services.common.child import Child, ChildLost, child_setup, serve

from .builtin import _PRELOAD, RewardFn, load_reward

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RewardInput:
    prompt: str
    completion: str
    answer: str
    metadata: dict


@dataclass(frozen=True, slots=True)
class Scored:
    total: float
    components: dict[str, float]
    errors: int
    """Reward calls that raised, timed out or returned a non-number for this sample."""


def _as_score(value: object) -> float:
    if not isinstance(value, numbers.Real):
        raise TypeError(f"returned {type(value).__name__} {str(value)[:60]!r}, not a real number")
    score = float(value)
    if not math.isfinite(score):
        raise ValueError(f"returned {score}, not a finite number")
    return score


def _child_main(conn: multiprocessing.connection.Connection, sys_path: list[str], names: list[str]) -> None:
    """Child loop: receive (calls, items), call each reward in the main thread, send (value, error) per call."""
    child_setup(sys_path)
    fns: dict[str, RewardFn | str] = {}
    for name in names:
        try:
            fns[name] = load_reward(name)
            if name in _PRELOAD:
                _PRELOAD[name]()
        except BaseException as e:
            fns[name] = f"{type(e).__name__}: {e}"
    conn.send("ready")

    def handle(message: tuple) -> None:
        calls, items = message
        for index, name in calls:
            fn, item = fns[name], items[index]
            try:
                if isinstance(fn, str):
                    raise RuntimeError(f"cannot load in the reward process: {fn}")
                conn.send((_as_score(fn(item.prompt, item.completion, item.answer, item.metadata)), None))
            except BaseException as e:
                conn.send((0.0, f"{type(e).__name__}: {e}"))

    serve(conn, handle)


class RewardRunner:
    """Scores completions as sum(weight * reward), each reward call in a killable child with a timeout.

    The child is spawned on the first score() and reused; a call that times out or kills the child scores 0.0, the
    child is replaced, and the remaining calls go on. score() never raises for a reward's fault.
    """

    def __init__(self, weights: dict[str, float], timeout_s: float, startup_timeout_s: float = 120.0):
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        for name in weights:
            load_reward(name)
        self._weights = dict(weights)
        self._timeout_s = timeout_s
        self._child = Child(_child_main, (list(self._weights),), "reward", startup_timeout_s)
        self._lock = threading.Lock()

    def score(self, items: list[RewardInput]) -> list[Scored]:
        with self._lock:
            components: list[dict[str, float]] = [{} for _ in items]
            errors = [0] * len(items)
            pending = [(i, name) for i in range(len(items)) for name in self._weights]
            while pending:
                done = self._run_calls(pending, items, components, errors)
                pending = pending[done:]
        return [Scored(sum(w * c[name] for name, w in self._weights.items()), c, e) for c, e in zip(components, errors)]

    def _run_calls(
        self,
        calls: list[tuple[int, str]],
        items: list[RewardInput],
        components: list[dict[str, float]],
        errors: list[int],
    ) -> int:
        """Run calls in the child until they are done or one is lost; return how many calls were settled."""
        try:
            conn = self._child.conn()
            conn.send((calls, {i: items[i] for i in {i for i, _ in calls}}))
        except (ChildLost, OSError, EOFError) as e:
            # Not any one reward's fault, but the batch must not hang or raise: every call scores 0.
            log.warning("reward process unavailable, %d reward calls score 0: %s", len(calls), e)
            self._child.stop()
            for i, name in calls:
                components[i][name] = 0.0
                errors[i] += 1
            return len(calls)
        for done, (i, name) in enumerate(calls):
            try:
                value, error = self._child.receive(self._timeout_s, f"reward {name!r} ran past {self._timeout_s}s")
            except ChildLost as e:
                value, error = 0.0, str(e)
                self._child.stop()
            components[i][name] = value
            if error is not None:
                errors[i] += 1
                log.warning("reward %r failed on item %d: %s", name, i, error)
            if not self._child.running:
                return done + 1
        return len(calls)

    def close(self) -> None:
        """Stop the child; a later score() starts a fresh one."""
        with self._lock:
            self._child.close()

    def __enter__(self) -> RewardRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
