"""Reward functions and a runner that scores completions with them in an isolated, killable child process.

A reward is a plain function ``(prompt, completion, answer, metadata) -> float``. ``metadata`` is the task row's
metadata plus ``finish_reason`` ("stop" or "length") and ``num_tokens``, added by the rollout worker. Rewards are named
either by a key of BUILTIN or by an import path ``pkg.module:function``.

RewardRunner calls rewards in one long-lived spawned child, so a reward that hangs, crashes the interpreter or leaks
memory costs one sample's component (scored 0.0 and counted as an error), never the caller.
"""

from __future__ import annotations

import importlib
import logging
import math
import multiprocessing
import multiprocessing.connection
import numbers
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

log = logging.getLogger(__name__)

RewardFn = Callable[[str, str, str, dict], float]

_BOXED = re.compile(r"\\boxed\s*\{")
# A minus sign belongs to the number unless it follows something it could be subtracting from ("5-3" ends in 3).
# Thousands groups are exactly three digits, so "1,2345" is two numbers, not one.
_NUMBER = re.compile(r"(?:(?<![\w)\]}])-)?(?:\d+(?:,\d{3}(?!\d))*(?:\.\d+)?|\.\d+)")
_WHITESPACE = re.compile(r"\s+")


# ---------------------------------------------------------------------------------------------------------------------
# Answer extraction


def _boxed_contents(text: str) -> list[str]:
    """Contents of every complete \\boxed{...} in text, in order, with nested braces kept whole."""
    found = []
    for match in _BOXED.finditer(text):
        depth, start = 1, match.end()
        for pos in range(start, len(text)):
            if text[pos] == "{":
                depth += 1
            elif text[pos] == "}":
                depth -= 1
                if depth == 0:
                    found.append(text[start:pos])
                    break
    return found


def extract_answer(text: str) -> str:
    """The last \\boxed{...}'s content, else the last number (thousands commas removed), else the stripped text."""
    boxed = _boxed_contents(text)
    if boxed:
        return boxed[-1].strip()
    numbers_found = _NUMBER.findall(text)
    if numbers_found:
        return numbers_found[-1].replace(",", "")
    return text.strip()


# ---------------------------------------------------------------------------------------------------------------------
# Built-in rewards


@cache
def _math_verify() -> tuple[Callable[..., Any], Callable[..., Any]]:
    from math_verify import parse, verify

    # math-verify logs every expression it fails to parse; a policy early in training produces many of those.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    return parse, verify


def _math_parse(text: str, timeout: int | None) -> list:
    parse, _ = _math_verify()
    # Inside $...$ math-verify's latex extractor reads plain numbers, fractions and latex alike.
    return parse(f"${text}$", parsing_timeout=timeout)


def cut_short(metadata: dict) -> bool:
    """The completion stopped at max_tokens, not at EOS: it has no final answer (the rollout's finish_reason)."""
    return metadata.get("finish_reason") == "length"


def math_reward(prompt: str, completion: str, answer: str, metadata: dict) -> float:
    """1.0 if the completion's extracted answer is mathematically equal to the reference (math-verify); 0.0 for a
    completion cut at max_tokens (cut_short: see reasoning_gym_reward)."""
    if cut_short(metadata):
        return 0.0
    _, verify = _math_verify()
    # math-verify times itself out with signal.alarm, which only works in the main thread.
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    gold_text = answer.strip()
    if _NUMBER.fullmatch(gold_text):
        gold_text = gold_text.replace(",", "")
    gold = _math_parse(gold_text, timeout)
    pred = _math_parse(extract_answer(completion), timeout)
    if not gold or not pred:
        return 0.0
    return float(verify(gold, pred, timeout_seconds=timeout))


def _normalize(text: str) -> str:
    return _WHITESPACE.sub(" ", text.strip()).lower()


def exact_reward(prompt: str, completion: str, answer: str, metadata: dict) -> float:
    """1.0 iff the whole completion equals the answer, ignoring case and runs of whitespace."""
    return float(_normalize(completion) == _normalize(answer))


@cache
def _reasoning_gym_scorer(dataset: str) -> Callable[[str, dict], float]:
    import reasoning_gym

    return reasoning_gym.get_score_answer_fn(dataset)


def reasoning_gym_partial_reward(prompt: str, completion: str, answer: str, metadata: dict) -> float:
    """reasoning-gym's own verifier for the dataset named by metadata["source_dataset"], partial credit included."""
    dataset = metadata.get("source_dataset")
    if not dataset:
        raise ValueError("metadata has no 'source_dataset'; the reasoning_gym reward needs reasoning-gym rows")
    entry = {"question": prompt, "answer": answer, "metadata": metadata}
    return float(_reasoning_gym_scorer(dataset)(extract_answer(completion), entry))


def reasoning_gym_reward(prompt: str, completion: str, answer: str, metadata: dict) -> float:
    """1.0 where reasoning-gym's verifier gives full marks, else 0.0.

    Its default verifier gives a wrong answer that contains the right one partial credit (len(answer) / len(given):
    "10" for 1 scores 0.5), and GRPO's std normalisation turns a group's lone 0.5 into the same push as a lone
    correct answer: on letter_counting that taught "appears 10 times" and held-out accuracy fell from 0.15 to 0.04
    (bench/README.md: "The collapse on an unseen task"). The partial credit stays as `reasoning_gym_partial`.

    A completion cut at max_tokens scores 0.0: it has no final answer, and its last number is whatever it was
    saying when cut. On products seed 0 the one "correct" sample of step 1 was "I'm ready to assist. ... Please use
    the numbers 00," (answer 0, cut at 32 tokens); alone in its group it got the full push, and by step 20 the
    held-out greedy replies were "I'm ready to assist. What's your next question?" (0.35 -> 0.08)."""
    if cut_short(metadata):
        return 0.0
    return float(full_marks(reasoning_gym_partial_reward(prompt, completion, answer, metadata)))


def eos_reward(prompt: str, completion: str, answer: str, metadata: dict) -> float:
    """1.0 if generation stopped at EOS rather than at max_tokens."""
    return float(metadata.get("finish_reason") == "stop")


def boxed_reward(prompt: str, completion: str, answer: str, metadata: dict) -> float:
    """1.0 if the completion contains a complete \\boxed{...}."""
    return float(bool(_boxed_contents(completion)))


def class_continuation_reward(prompt: str, completion: str, answer: str, metadata: dict) -> float:
    """Fraction of generated tokens that are symbols of the answer's class (the toy tokenizer: one char a token)."""
    num_tokens = metadata["num_tokens"]
    if num_tokens == 0:
        return 0.0
    return sum(1 for ch in completion if ch in answer) / num_tokens


BUILTIN: dict[str, RewardFn] = {
    "math": math_reward,
    "exact": exact_reward,
    "reasoning_gym": reasoning_gym_reward,
    "reasoning_gym_partial": reasoning_gym_partial_reward,
    "eos": eos_reward,
    "boxed": boxed_reward,
    "class_continuation": class_continuation_reward,
}

# Heavy imports a built-in needs, done by the child at start so the first call does not spend its timeout on them.
_PRELOAD: dict[str, Callable[[], object]] = {
    "math": _math_verify,
    "reasoning_gym": lambda: importlib.import_module("reasoning_gym"),
    "reasoning_gym_partial": lambda: importlib.import_module("reasoning_gym"),
}


def load_reward(name: str) -> RewardFn:
    """A BUILTIN reward by name, or the function at import path ``pkg.module:function``."""
    if name in BUILTIN:
        return BUILTIN[name]
    module_name, sep, attr = name.partition(":")
    if not sep or not module_name or not attr:
        builtin = ", ".join(sorted(BUILTIN))
        raise ValueError(f"unknown reward {name!r}; built in: {builtin}; or give an import path pkg.module:function")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except Exception as e:
        raise ValueError(f"cannot import reward {name!r}: {type(e).__name__}: {e}") from e
    if not callable(fn):
        raise ValueError(f"reward {name!r} is not callable (it is a {type(fn).__name__})")
    return fn


def full_marks(score: float) -> bool:
    """A completion counts as correct (eval/accuracy, pass@k) when its correctness reward gave full marks."""
    return score >= 1.0 - 1e-6


# ---------------------------------------------------------------------------------------------------------------------
# The runner


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


def _watch_parent(parent_pid: int) -> None:
    # A parent killed with SIGKILL never stops its daemon children; a child stuck in a reward would spin forever.
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(0)


def _child_main(conn: multiprocessing.connection.Connection, sys_path: list[str], names: list[str]) -> None:
    """Child loop: receive (calls, items), call each reward in the main thread, send (value, error) per call."""
    # Ctrl-C reaches the whole process group; the parent decides when this process stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    sys.path[:] = sys_path
    fns: dict[str, RewardFn | str] = {}
    for name in names:
        try:
            fns[name] = load_reward(name)
            if name in _PRELOAD:
                _PRELOAD[name]()
        except BaseException as e:
            fns[name] = f"{type(e).__name__}: {e}"
    conn.send("ready")
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        calls, items = message
        for index, name in calls:
            fn, item = fns[name], items[index]
            try:
                if isinstance(fn, str):
                    raise RuntimeError(f"cannot load in the reward process: {fn}")
                conn.send((_as_score(fn(item.prompt, item.completion, item.answer, item.metadata)), None))
            except BaseException as e:
                conn.send((0.0, f"{type(e).__name__}: {e}"))


class _ChildLost(Exception):
    """The child timed out or died; the message says which."""


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
        self._startup_timeout_s = startup_timeout_s
        self._ctx = multiprocessing.get_context("spawn")
        self._proc: multiprocessing.process.BaseProcess | None = None
        self._conn: multiprocessing.connection.Connection | None = None
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
            conn = self._child()
            conn.send((calls, {i: items[i] for i in {i for i, _ in calls}}))
        except (_ChildLost, OSError, EOFError) as e:
            # Not any one reward's fault, but the batch must not hang or raise: every call scores 0.
            log.warning("reward process unavailable, %d reward calls score 0: %s", len(calls), e)
            self._stop()
            for i, name in calls:
                components[i][name] = 0.0
                errors[i] += 1
            return len(calls)
        for done, (i, name) in enumerate(calls):
            try:
                value, error = self._receive(self._timeout_s, f"reward {name!r} ran past {self._timeout_s}s")
            except _ChildLost as e:
                value, error = 0.0, str(e)
                self._stop()
            components[i][name] = value
            if error is not None:
                errors[i] += 1
                log.warning("reward %r failed on item %d: %s", name, i, error)
            if self._proc is None:
                return done + 1
        return len(calls)

    def _child(self) -> multiprocessing.connection.Connection:
        if self._conn is not None:
            return self._conn
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        sys_path = [os.getcwd() if p == "" else p for p in sys.path]
        self._proc = self._ctx.Process(
            target=_child_main, args=(child_conn, sys_path, list(self._weights)), name="rewards", daemon=True
        )
        self._proc.start()
        # The child must hold the only copy of its end, so its death reads as EOF here.
        child_conn.close()
        self._conn = parent_conn
        ready = self._receive(self._startup_timeout_s, f"reward process not ready after {self._startup_timeout_s}s")
        if ready != "ready":
            raise _ChildLost(f"reward process sent {ready!r} instead of ready")
        return parent_conn

    def _receive(self, timeout_s: float, timeout_message: str) -> Any:
        assert self._conn is not None and self._proc is not None
        ready = multiprocessing.connection.wait([self._conn, self._proc.sentinel], timeout_s)
        if self._conn in ready:
            try:
                return self._conn.recv()
            except (EOFError, OSError):
                pass
        elif not ready:
            raise _ChildLost(timeout_message)
        self._proc.join(1.0)
        raise _ChildLost(f"reward process died (exit code {self._proc.exitcode})")

    def _stop(self) -> None:
        proc, conn, self._proc, self._conn = self._proc, self._conn, None, None
        if conn is not None:
            conn.close()
        if proc is not None and proc.is_alive():
            proc.terminate()
            proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join()

    def close(self) -> None:
        """Stop the child; a later score() starts a fresh one."""
        with self._lock:
            if self._conn is not None and self._proc is not None and self._proc.is_alive():
                try:
                    self._conn.send(None)
                    self._proc.join(1.0)
                except OSError:
                    pass
            self._stop()

    def __enter__(self) -> RewardRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
