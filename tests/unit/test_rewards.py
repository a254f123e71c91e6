"""Reward functions, reward loading, and the RewardRunner's isolation: timeouts, crashes and bad values score 0."""

import logging
import math
import os
import textwrap
import threading
import time

import pytest

from services.common.rewards import (
    BUILTIN,
    RewardInput,
    RewardRunner,
    class_continuation_reward,
    extract_answer,
    load_reward,
    reasoning_gym_partial_reward,
    reasoning_gym_reward,
)

TIMEOUT_S = 2.0

# Behaves as its completion says, so one shared runner can exercise every failure. "ok" scores 1.0 only when it runs
# in a process other than the test's, which proves the import path was resolved in the runner's child.
ACT_MODULE = """
import os, time

def act(prompt, completion, answer, metadata):
    if completion == "raise":
        raise RuntimeError("boom from the reward")
    if completion == "sleep":
        time.sleep(30)
    if completion == "exit":
        os._exit(3)
    if completion in ("abc", "none", "nan", "inf"):
        return {"abc": "abc", "none": None, "nan": float("nan"), "inf": float("inf")}[completion]
    return float(os.getpid() != metadata["parent_pid"])
"""


def item(completion: str, answer: str = "", **metadata) -> RewardInput:
    return RewardInput("prompt", completion, answer, {"finish_reason": "stop", "parent_pid": os.getpid(), **metadata})


def score(name: str, completion: str, answer: str, **metadata) -> float:
    return BUILTIN[name]("prompt", completion, answer, {"finish_reason": "stop", **metadata})


@pytest.fixture(scope="module")
def act_name(tmp_path_factory):
    directory = tmp_path_factory.mktemp("rewards_pkg")
    (directory / "rewards_under_test.py").write_text(textwrap.dedent(ACT_MODULE))
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(directory))
        yield "rewards_under_test:act"


@pytest.fixture(scope="module")
def runner(act_name):
    r = RewardRunner({act_name: 1.0, "eos": 0.5}, timeout_s=TIMEOUT_S)
    yield r
    r.close()


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so \boxed{\frac{1}{2}}.", r"\frac{1}{2}"),
        (r"first \boxed{3}, then \boxed{ 4 } at last", "4"),
        (r"\boxed{\sqrt{\frac{a}{b}}} and 7", r"\sqrt{\frac{a}{b}}"),
        (r"\boxed{5} but an unclosed \boxed{6", "5"),
        ("it is -12", "-12"),
        ("5 - 3 - 6 = -4", "-4"),
        ("10-2", "2"),
        ("we get 1,234,567 apples", "1234567"),
        ("about 3.5.", "3.5"),
        ("1 then 2 then 0.25", "0.25"),
        ("  no number here \n", "no number here"),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "completion, answer, expected",
    [
        ("2 * 4 = 8", "8", 1.0),
        (r"The answer is $\boxed{8}$", "8", 1.0),
        (r"\boxed{\frac{1}{2}}", "0.5", 1.0),
        ("1,000", "1000", 1.0),
        ("1000", "1,000", 1.0),
        ("so it is -12", "-12", 1.0),
        ("2 * 4 = 9", "8", 0.0),
        (r"\boxed{8} wait, 9", "8", 1.0),
        ("12", "-12", 0.0),
        ("no number at all", "8", 0.0),
    ],
)
def test_math(completion, answer, expected):
    assert score("math", completion, answer) == expected


def test_math_outside_the_main_thread_does_not_crash():
    results = []
    thread = threading.Thread(target=lambda: results.append(score("math", r"\boxed{\frac{3}{4}}", "0.75")))
    thread.start()
    thread.join()
    assert results == [1.0]


def test_exact_ignores_case_and_whitespace_but_not_prefixes():
    assert score("exact", "  Paris \n  France ", "paris france") == 1.0
    assert score("exact", "400", "40") == 0.0
    assert score("exact", "40", "400") == 0.0
    assert score("exact", "Paris.", "Paris") == 0.0


def test_eos_boxed_and_class_continuation():
    assert score("eos", "x", "", finish_reason="stop") == 1.0
    assert score("eos", "x", "", finish_reason="length") == 0.0
    assert score("boxed", r"so \boxed{\frac{1}{2}}", "") == 1.0
    assert score("boxed", r"so \boxed{\frac{1}{2}", "") == 0.0
    assert score("class_continuation", "abcz", "abcdefgh", num_tokens=4) == 0.75
    # A token that decodes to nothing (EOS) still counts in the denominator.
    assert score("class_continuation", "ab", "abcdefgh", num_tokens=4) == 0.5
    assert score("class_continuation", "", "abcdefgh", num_tokens=0) == 0.0
    assert BUILTIN["class_continuation"] is class_continuation_reward


def test_tool_use_pays_an_episode_whose_every_tool_call_ran_and_half_for_a_failed_try():
    assert score("tool_use", "42", "42", tool_calls=1, tool_errors=0) == 1.0
    assert score("tool_use", "42", "42", tool_calls=0, tool_errors=0) == 0.0  # answered without the tool
    assert score("tool_use", "42", "42", tool_calls=2, tool_errors=1) == 0.5  # one call malformed or failed
    with pytest.raises(ValueError, match="task.episode.tools"):
        score("tool_use", "42", "42")  # a single-turn run has no tool counts


def test_reasoning_gym_scores_right_and_wrong_answers_in_the_runner():
    import reasoning_gym

    entries = list(reasoning_gym.create_dataset("basic_arithmetic", size=5, seed=1))
    items = []
    for e in entries:
        wrong = str(int(e["answer"]) + 1)
        for completion in (f"so the result is {e['answer']}", rf"\boxed{{{e['answer']}}}", f"it is {wrong}"):
            items.append(
                RewardInput(e["question"], completion, e["answer"], {**e["metadata"], "finish_reason": "stop"})
            )
    with RewardRunner({"reasoning_gym": 1.0}, timeout_s=30.0) as r:
        scored = r.score(items)
    assert [s.total for s in scored] == [1.0, 1.0, 0.0] * len(entries)
    assert all(s.errors == 0 for s in scored)


def test_import_path_reward_runs_in_the_child(runner, act_name):
    [s] = runner.score([item("ok")])
    assert s.components == {act_name: 1.0, "eos": 1.0}
    assert (s.total, s.errors) == (1.5, 0)
    assert load_reward(act_name)("p", "ok", "", {"parent_pid": os.getpid()}) == 0.0


def test_load_reward_errors_name_the_reward():
    with pytest.raises(ValueError, match=r"unknown reward 'nope'; built in: .*boxed.*import path"):
        load_reward("nope")
    with pytest.raises(ValueError, match=r"cannot import reward 'no_such_module_xyz:f'.*ModuleNotFoundError"):
        load_reward("no_such_module_xyz:f")
    with pytest.raises(ValueError, match=r"cannot import reward 'os:no_such_function'.*AttributeError"):
        load_reward("os:no_such_function")
    with pytest.raises(ValueError, match=r"reward 'os:sep' is not callable"):
        load_reward("os:sep")
    with pytest.raises(ValueError, match="unknown reward 'nope'"):
        RewardRunner({"eos": 1.0, "nope": 1.0}, timeout_s=1.0)


def test_a_raising_reward_scores_zero_and_the_others_still_count(runner, act_name, caplog):
    with caplog.at_level(logging.WARNING, logger="services.common.rewards"):
        [bad, good] = runner.score([item("raise"), item("ok")])
    assert bad.components == {act_name: 0.0, "eos": 1.0}
    assert (bad.total, bad.errors) == (0.5, 1)
    assert (good.total, good.errors) == (1.5, 0)
    assert act_name in caplog.text and "boom from the reward" in caplog.text


@pytest.mark.parametrize("completion", ["abc", "none", "nan", "inf"])
def test_a_non_number_scores_zero_with_an_error(runner, act_name, completion):
    [s] = runner.score([item(completion)])
    assert s.components[act_name] == 0.0
    assert (s.total, s.errors) == (0.5, 1)
    assert math.isfinite(s.total)


@pytest.mark.parametrize("completion", ["sleep", "exit"])
def test_runner_recovers_from_a_hung_or_dead_child(runner, act_name, completion, caplog):
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="services.common.rewards"):
        scored = runner.score([item(completion), item("ok", finish_reason="length")])
    elapsed = time.monotonic() - start
    # The hung call costs the timeout, the replacement child a few seconds to start; the reward sleeps 30 s.
    assert elapsed < TIMEOUT_S + 15
    assert [(s.components[act_name], s.errors) for s in scored] == [(0.0, 1), (1.0, 0)]
    # The calls after the lost one, this sample's eos included, went to the replacement child.
    assert (scored[0].components["eos"], scored[0].total) == (1.0, 0.5)
    assert scored[1].total == 1.0
    assert ("ran past" if completion == "sleep" else "died") in caplog.text


def test_close_stops_the_child_and_a_later_score_starts_another(runner):
    runner.score([item("ok")])
    runner.close()
    runner.close()
    assert runner.score([item("ok")])[0].total == 1.5


def test_reasoning_gym_gives_no_partial_credit_to_a_wrong_answer_holding_the_right_one():
    # letter_counting's verifier scores "10" for an answer of 1 as 0.5 (len(answer) / len(given)); std-normalised
    # advantages then push a lone 0.5 as hard as a lone correct answer. The built-in scores it 0, the partial 0.5.
    import reasoning_gym

    [e] = list(reasoning_gym.create_dataset("letter_counting", size=1, seed=3))
    answer = e["answer"]
    given = f"It appears {answer}0 times"
    args = (e["question"], given, answer, e["metadata"])
    assert 0 < reasoning_gym_partial_reward(*args) < 1
    assert reasoning_gym_reward(*args) == 0.0
    assert reasoning_gym_reward(e["question"], f"It appears {answer} times", answer, e["metadata"]) == 1.0


def test_a_completion_cut_at_max_tokens_has_no_final_answer():
    # products seed 0, step 1: the group's one "correct" sample was a generic reply cut at 32 tokens whose last
    # number happened to be the answer; std-normalised, it taught "I'm ready to assist" to every prompt.
    import reasoning_gym

    [e] = list(reasoning_gym.create_dataset("products", size=1, seed=0, min_digits=1, max_digits=1))
    answer = e["answer"]
    rambling = f"I'm ready to assist. What's your section of the editing? Please use the numbers {answer},"
    for finish, expected in (("length", 0.0), ("stop", 1.0), ("", 1.0)):
        metadata = {**e["metadata"], "finish_reason": finish}
        assert reasoning_gym_reward(e["question"], rambling, answer, metadata) == expected
        assert BUILTIN["math"](e["question"], rambling, answer, metadata) == expected
    # The raw verifier stays raw: its own name, its own rules.
    assert (
        reasoning_gym_partial_reward(e["question"], rambling, answer, {**e["metadata"], "finish_reason": "length"}) == 1
    )
