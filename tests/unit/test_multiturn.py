"""Multi-turn episodes kept as token ids, and the tool calls read out of a model turn."""

import copy
import os
import textwrap

import pytest
from transformers import AutoTokenizer

from services.common.child import Functions
from services.common.tasks import Prompt, PromptRenderer, TaskError
from services.rollout.multiturn.environment import Environment, as_messages, as_step
from services.rollout.multiturn.envs import RETRY_MESSAGE, calculator, retry
from services.rollout.multiturn.episode import Episode, MessageRenderer
from services.rollout.multiturn.loop import Limits, Turn, run_episode, run_episodes
from services.rollout.multiturn.tools import PARSERS, Tool, ToolCall, ToolRunner, parse_hermes, parser, resolve

# Tools the runner's child imports by path: one that works, and one each way a tool can fail.
TOOLS_MODULE = '''
import os, time

def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b

def act(how: str) -> str:
    """Fail as asked.

    Args:
        how: raise, hang, exit, or anything else to return the process id.
    """
    if how == "raise":
        raise RuntimeError("boom from the tool")
    if how == "hang":
        time.sleep(60)
    if how == "exit":
        os._exit(3)
    return str(os.getpid())

def untyped(a):
    return a

def retry(messages, task):
    """Feedback until the model gives the answer; it fails as the answer asks it to."""
    if task["answer"] == "raise":
        raise ValueError("boom from the environment")
    if task["answer"] == "hang":
        time.sleep(60)
    if task["answer"] == "model":
        return {"role": "assistant", "content": "written as the model"}
    return None if messages[-1]["content"] == task["answer"] else "wrong, try again"
'''


@pytest.fixture(scope="module")
def tools_module(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tools_pkg")
    (directory / "tools_under_test.py").write_text(textwrap.dedent(TOOLS_MODULE))
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(directory))
        yield "tools_under_test"


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    return AutoTokenizer.from_pretrained(smollm2_path)


def _render(tokenizer, messages, generation_prompt):
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_a_two_turn_episode_is_the_sampled_ids_plus_each_message_as_the_template_renders_it(tokenizer):
    eos = tokenizer.eos_token_id
    user = {"role": "user", "content": "What is 123 * 456?"}
    call = '<tool_call>{"name": "multiply", "arguments": {"a": 123, "b": 456}}</tool_call>'
    result = {"role": "tool", "content": "56088"}
    # The model's turns as an engine samples them: the text's ids, then the stop token.
    turn1 = tokenizer.encode(call, add_special_tokens=False) + [eos]
    turn2 = tokenizer.encode("56088", add_special_tokens=False) + [eos]

    episode = Episode(prompt_ids=_render(tokenizer, [user], generation_prompt=True))
    episode.add_model_turn(turn1, [-0.5] * len(turn1), call)
    episode.add_messages([result], MessageRenderer(tokenizer).ids([result], turn_end=eos))
    episode.add_model_turn(turn2, [-0.25] * len(turn2), "56088")

    # The whole conversation rendered at once gives the same ids, up to the last turn's stop token.
    whole = [user, {"role": "assistant", "content": call}, result, {"role": "assistant", "content": "56088"}]
    rendered = _render(tokenizer, whole, generation_prompt=False)
    assert episode.context_ids == rendered[: len(rendered) - rendered[::-1].index(eos)]
    # The loss mask covers exactly the model's tokens; the environment's carry no sampled logprob.
    n1, n_tool = len(turn1), len(episode.response_ids) - len(turn1) - len(turn2)
    assert episode.loss_mask == [1] * n1 + [0] * n_tool + [1] * len(turn2)
    assert episode.logprobs == [-0.5] * n1 + [0.0] * n_tool + [-0.25] * len(turn2)
    assert [episode.response_ids[i] for i, m in enumerate(episode.loss_mask) if m] == turn1 + turn2
    assert episode.model_turns == 2 and [m["role"] for m in episode.messages] == ["assistant", "tool", "assistant"]


def test_a_template_that_rerenders_earlier_turns_is_refused(tokenizer):
    counting = copy.deepcopy(tokenizer)  # a template whose first line depends on how many messages follow
    counting.chat_template = (
        "{{ messages|length }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(ValueError, match="re-tokenizing"):
        MessageRenderer(counting).ids([{"role": "user", "content": "again"}], turn_end=tokenizer.eos_token_id)
    with pytest.raises(ValueError, match="never ends a model turn"):
        MessageRenderer(tokenizer).ids([{"role": "user", "content": "again"}], turn_end=12345)
    with pytest.raises(ValueError, match="logprobs"):
        Episode(prompt_ids=[1]).add_model_turn([1, 2], [0.0], "x")


def test_hermes_calls_are_read_and_unreadable_ones_say_why():
    ok = parse_hermes('sure <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>')
    assert ok == [ToolCall("add", {"a": 1, "b": 2})]
    two = parse_hermes(
        '<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call><tool_call>{"name": "b"}</tool_call>'
    )
    assert two == [ToolCall("a", {"x": 1}), ToolCall("b", {})]
    assert parse_hermes("no call here") == []
    assert "not JSON" in parse_hermes("<tool_call>{name: add}</tool_call>")[0].error
    assert '"name"' in parse_hermes('<tool_call>{"arguments": {}}</tool_call>')[0].error
    assert "JSON object" in parse_hermes('<tool_call>{"name": "a", "arguments": [1]}</tool_call>')[0].error
    assert "never closed" in parse_hermes('<tool_call>{"name": "a"}')[-1].error
    assert parser("hermes") is PARSERS["hermes"]
    with pytest.raises(ValueError, match="hermes"):
        parser("nope")


def test_a_typed_function_is_a_tool_and_calls_to_it_are_checked(tools_module):
    tool = Tool.from_path(f"{tools_module}:multiply")
    assert tool.name == "multiply"
    assert tool.schema["function"]["parameters"]["required"] == ["a", "b"]
    tools = {tool.name: tool}
    assert resolve(ToolCall("multiply", {"a": 2, "b": 3}), tools) == (tool, "")
    assert "needs b" in resolve(ToolCall("multiply", {"a": 2}), tools)[1]
    assert "takes no c" in resolve(ToolCall("multiply", {"a": 2, "b": 3, "c": 4}), tools)[1]
    assert "no tool 'divide'" in resolve(ToolCall("divide", {}), tools)[1]
    assert resolve(ToolCall(error="not JSON"), tools) == (None, "not JSON")
    with pytest.raises(ValueError, match="untyped"):
        Tool.from_path(f"{tools_module}:untyped")  # no type hints: no schema a template could show
    with pytest.raises(ValueError, match="not an import path"):
        Tool.from_path("multiply")


def test_a_tool_that_raises_hangs_or_dies_gives_an_error_result_and_the_next_call_runs(tools_module):
    tools = [Tool.from_path(f"{tools_module}:{name}") for name in ("multiply", "act")]
    with ToolRunner(tools, timeout_s=3.0) as runner:
        assert runner.run(ToolCall("multiply", {"a": 123, "b": 456})).content == "56088"
        pid = runner.run(ToolCall("act", {"how": "pid"})).content
        assert pid.isdigit() and int(pid) != os.getpid()  # it ran in the child
        raised = runner.run(ToolCall("act", {"how": "raise"}))
        assert raised.error == "RuntimeError: boom from the tool" and raised.content.startswith("error: ")
        assert runner.run(ToolCall("act", {"how": "pid"})).content == pid  # a raise costs no process
        hung = runner.run(ToolCall("act", {"how": "hang"}))
        assert "ran past 3.0s" in hung.error
        died = runner.run(ToolCall("act", {"how": "exit"}))
        assert "died (exit code 3)" in died.error
        assert runner.run(ToolCall("multiply", {"a": 2, "b": 3})).content == "6"  # a fresh child serves on
        assert "needs b" in runner.run(ToolCall("multiply", {"a": 2})).error  # refused before it is sent
        assert "not JSON" in runner.run(parse_hermes("<tool_call>{x}</tool_call>")[0]).error


def scripted(tokenizer, texts, finish="stop"):
    """An engine stand-in for the episode loop alone: each turn is the next text's ids and the stop token. (The
    engines themselves are tested against an HF forward; here the loop's bookkeeping is under test.)"""
    turns, seen = iter(texts), []

    def generate(context_ids, max_new):
        seen.append((list(context_ids), max_new))
        ids = tokenizer.encode(next(turns), add_special_tokens=False) + [tokenizer.eos_token_id]
        return Turn(ids, [-0.1] * len(ids), tokenizer.decode(ids, skip_special_tokens=True), finish)

    return generate, seen


CALL = '<tool_call>{{"name": "{}", "arguments": {}}}</tool_call>'


def test_an_episode_calls_a_tool_then_answers_and_failing_calls_are_answered_with_errors(tokenizer, tools_module):
    tools = [Tool.from_path(f"{tools_module}:{name}") for name in ("multiply", "act")]
    renderer, prompt = MessageRenderer(tokenizer), _render(tokenizer, [{"role": "user", "content": "q"}], True)
    with ToolRunner(tools, timeout_s=2.0) as runner:
        generate, seen = scripted(tokenizer, [CALL.format("multiply", '{"a": 123, "b": 456}'), "56088"])
        done = run_episode(prompt, generate, Environment(runner, parse_hermes), renderer, Limits())
        assert (done.end, done.answer, done.tool_calls, done.tool_errors) == ("answered", "56088", 1, 0)
        assert done.episode.messages[1] == {"role": "tool", "content": "56088"}
        assert seen[1][0] == done.episode.context_ids[: len(seen[1][0])]  # turn 2 continued from the episode's ids
        assert seen[1][1] == Limits().max_tokens - (len(seen[1][0]) - len(prompt))  # its budget is what was left

        # A tool that raises, a malformed call, and a tool that hangs: each answered with an error, and on it goes.
        turns = [
            CALL.format("act", '{"how": "raise"}') + "<tool_call>{oops}</tool_call>",
            CALL.format("act", '{"how": "hang"}'),
            "gave up",
        ]
        done = run_episode(prompt, scripted(tokenizer, turns)[0], Environment(runner, parse_hermes), renderer, Limits())
        assert (done.end, done.answer, done.tool_calls, done.tool_errors) == ("answered", "gave up", 3, 3)
        tool_messages = [m["content"] for m in done.episode.messages if m["role"] == "tool"]
        assert "boom from the tool" in tool_messages[0] and "not JSON" in tool_messages[1]
        assert "ran past 2.0s" in tool_messages[2] and done.env_s >= 2.0
        assert sum(done.episode.loss_mask) == sum(len(tokenizer.encode(t, add_special_tokens=False)) + 1 for t in turns)


def test_each_episode_limit_ends_the_episode_or_refuses_the_call(tokenizer, tools_module):
    tools = [Tool.from_path(f"{tools_module}:multiply")]
    renderer, prompt = MessageRenderer(tokenizer), _render(tokenizer, [{"role": "user", "content": "q"}], True)
    call = CALL.format("multiply", '{"a": 2, "b": 3}')
    with ToolRunner(tools, timeout_s=5.0) as runner:
        done = run_episode(
            prompt, scripted(tokenizer, [call] * 5)[0], Environment(runner, parse_hermes), renderer, Limits(max_turns=2)
        )
        assert (done.end, done.episode.model_turns, done.tool_calls) == ("max_turns", 2, 1)
        two_calls = [call + call, "6"]
        limits = Limits(max_tool_calls=1)
        done = run_episode(
            prompt, scripted(tokenizer, two_calls)[0], Environment(runner, parse_hermes), renderer, limits
        )
        assert (done.end, done.tool_calls, done.tool_errors) == ("answered", 2, 1)
        assert "no more tool calls" in done.episode.messages[2]["content"]
        done = run_episode(
            prompt, scripted(tokenizer, [call], "length")[0], Environment(runner, parse_hermes), renderer, Limits()
        )
        assert (done.end, done.tool_calls) == ("length", 0)  # a turn cut short is not read for calls
        tight = Limits(max_tokens=len(tokenizer.encode(call, add_special_tokens=False)) + 3)
        done = run_episode(
            prompt, scripted(tokenizer, [call, "6"])[0], Environment(runner, parse_hermes), renderer, tight
        )
        assert done.end == "max_tokens" and done.episode.model_turns == 1
    with pytest.raises(ValueError, match="limit"):
        Limits(max_turns=0)


def test_episodes_run_in_lockstep_with_an_environment_function_and_a_failing_one_ends_its_episode_only(
    tokenizer, tools_module
):
    renderer = MessageRenderer(tokenizer)
    answers = {"first": ["first"], "third": ["a", "b", "third"], "raise": ["x"], "hang": ["x"], "model": ["x"]}
    tasks = [{"prompt": "q", "answer": a, "metadata": {}} for a in answers]
    scripts = [iter(texts) for texts in answers.values()]
    prompts = [_render(tokenizer, [{"role": "user", "content": f"q{i}"}], True) for i in range(len(tasks))]
    calls = []

    def generate_many(asks):
        calls.append([k for k, _, _ in asks])
        out = []
        for k, context, _ in asks:
            assert context[: len(prompts[k])] == prompts[k]
            ids = tokenizer.encode(next(scripts[k]), add_special_tokens=False) + [tokenizer.eos_token_id]
            out.append(Turn(ids, [-0.1] * len(ids), tokenizer.decode(ids, skip_special_tokens=True), "stop"))
        return out

    env = Environment(respond=Functions({"respond": f"{tools_module}:retry"}, timeout_s=2.0, kind="environment"))
    try:
        done = run_episodes(prompts, generate_many, env, renderer, Limits(max_turns=5), tasks)
    finally:
        env.close()
    by_answer = dict(zip(answers, done))
    assert calls == [[0, 1, 2, 3, 4], [1], [1]]  # one engine call per round, every episode still going in it
    assert (by_answer["first"].end, by_answer["first"].episode.model_turns) == ("answered", 1)
    third = by_answer["third"]
    assert (third.end, third.answer, third.episode.model_turns) == ("answered", "third", 3)
    assert [m["content"] for m in third.episode.messages if m["role"] == "user"] == ["wrong, try again"] * 2
    assert third.episode.context_ids[: len(prompts[1])] == prompts[1] and 0 in third.episode.loss_mask
    for name, why in (("raise", "boom from the environment"), ("hang", "ran past 2.0s"), ("model", "'role'")):
        failed = by_answer[name]
        assert failed.end == "env_error" and why in failed.errors[0], (name, failed.errors)
        assert failed.episode.model_turns == 1
    assert as_messages("hi") == ([{"role": "user", "content": "hi"}], "")
    assert "not int" in as_messages(3)[1]


def test_the_calculator_computes_and_refuses_what_could_hold_its_process():
    assert calculator("(1234 + 5678) * 9") == "62208" and calculator("7 / 2") == "3.5"
    for bad in ("9 ** 9 ** 9", "__import__('os').getpid()", "1" * 201, "10 ** 40"):
        with pytest.raises(ValueError):
            calculator(bad)


def test_retry_answers_until_the_last_answer_is_right():
    task = {"prompt": "What is 2 + 3?", "answer": "5", "metadata": {}}
    assert (
        retry([{"role": "user", "content": "q"}, {"role": "assistant", "content": "It is 6."}], task) == RETRY_MESSAGE
    )
    assert retry([{"role": "user", "content": "q"}, {"role": "assistant", "content": "It is 5."}], task) is None


def test_a_chat_template_that_ignores_tools_gets_them_in_the_system_turn(smollm2_path, tools_module):
    renderer = PromptRenderer(str(smollm2_path), "Be brief.", True, [f"{tools_module}:multiply"])
    text = renderer.text(Prompt("What is 2 * 3?", "6"))
    assert '"name": "multiply"' in text and "<tool_call>" in text
    assert text.index("Be brief.") < text.index("<tools>") < text.index("What is 2 * 3?")
    with pytest.raises(TaskError, match="task.episode.tools"):
        PromptRenderer(str(smollm2_path), "", True, [f"{tools_module}:untyped"])


def test_a_skyrl_gym_environment_runs_episodes_and_its_rewards_add_up(tokenizer):
    """skyrl-gym's gsm8k_multi_turn through the adapter, in the environment process: a wrong answer gets its
    follow-up observation and a format score, the right one ends the episode with 1.0."""
    renderer = MessageRenderer(tokenizer)
    prompts = [_render(tokenizer, [{"role": "user", "content": f"q{i}"}], True) for i in range(2)]
    scripts = [iter(["#### 3", "#### 5"]), iter(["#### 7"])]

    def generate_many(asks):
        out = []
        for k, _, _ in asks:
            ids = tokenizer.encode(next(scripts[k]), add_special_tokens=False) + [tokenizer.eos_token_id]
            out.append(Turn(ids, [-0.1] * len(ids), tokenizer.decode(ids, skip_special_tokens=True), "stop"))
        return out

    tasks = [
        {"prompt": f"q{i}", "answer": answer, "metadata": {}, "episode": f"e{i}", "env_name": "gsm8k_multi_turn",
         "max_turns": 3}
        for i, answer in enumerate(["5", "7"])
    ]  # fmt: skip
    respond = Functions({"respond": "services.rollout.multiturn.skyrl:respond"}, timeout_s=30.0, kind="environment")
    env = Environment(respond=respond)
    try:
        two, one = run_episodes(prompts, generate_many, env, renderer, Limits(max_turns=3), tasks)
    finally:
        env.close()
    assert (two.end, two.episode.model_turns, one.end, one.episode.model_turns) == ("answered", 2, "answered", 1)
    assert "#### ANSWER" in two.episode.messages[1]["content"] and two.episode.messages[1]["role"] == "user"
    assert two.env_reward == pytest.approx(1.0 + 0.2 / 3) and one.env_reward == 1.0


def test_the_skyrl_adapter_rebuilds_an_episode_it_lost_by_replaying_its_turns():
    from services.rollout.multiturn import skyrl

    task = {"prompt": "q", "answer": "5", "metadata": {}, "episode": "lost", "env_name": "gsm8k_multi_turn",
            "max_turns": 3}  # fmt: skip
    first = skyrl.respond([{"role": "user", "content": "q"}, {"role": "assistant", "content": "#### 3"}], task)
    skyrl._live.clear()  # as a replaced environment process would have it
    conversation = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "#### 3"},
        *first["messages"],
        {"role": "assistant", "content": "#### 4"},
    ]
    second = skyrl.respond(conversation, task)
    assert not second["done"] and "final numeric answer" in second["messages"][0]["content"]  # its third turn is next
    with pytest.raises(ValueError, match="no environment 'nope'"):
        skyrl.respond(conversation[:2], {**task, "episode": "other", "env_name": "nope"})


def test_an_environment_step_gives_messages_a_reward_and_ends_with_done():
    assert as_step({"messages": [{"role": "user", "content": "go on"}], "reward": 0.5}) == (
        [{"role": "user", "content": "go on"}], 0.5, "")  # fmt: skip
    assert as_step({"messages": [{"role": "user", "content": "bye"}], "reward": 1, "done": True}) == ([], 1.0, "")
    assert as_step("go on") == ([{"role": "user", "content": "go on"}], 0.0, "")
    for bad in ({"reward": float("nan")}, {"reward": "1"}, {"rewards": 1.0}):
        assert as_step(bad)[2], bad
