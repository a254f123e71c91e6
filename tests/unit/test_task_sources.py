"""Prompt sources: data files in three formats, reasoning-gym, the seeded order, rendering and the up-front check."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

import pytest

from services.common.config import RunConfig, TaskSection
from services.common.tasks import Prompt, PromptOrder, PromptRenderer, TaskError, check_task, load_task
from services.common.tokenizer import Vocab

ROWS = [{"question": f"What is {i} + {i}?", "answer": 2 * i, "level": i % 3} for i in range(40)]


def _hf_datasets() -> ModuleType:
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    import datasets

    return datasets


def _write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _task(path: str, **kwargs) -> TaskSection:
    return TaskSection(name="dataset", prompts_path=path, prompt_field="question", **kwargs)


def _pairs(prompts: list[Prompt]) -> list[tuple[str, str, dict]]:
    return [(p.text, p.answer, p.metadata) for p in prompts]


@pytest.fixture(scope="module")
def three_formats(tmp_path_factory) -> list[str]:
    """The same rows as JSONL (with a blank line), Parquet and a save_to_disk folder."""
    folder = tmp_path_factory.mktemp("formats")
    lines = [json.dumps(row) for row in ROWS]
    (folder / "rows.jsonl").write_text("\n".join([*lines[:5], "", *lines[5:]]) + "\n")
    ds = _hf_datasets().Dataset.from_list(ROWS)
    ds.to_parquet(str(folder / "rows.parquet"))
    ds.save_to_disk(str(folder / "rows_disk"))
    return [str(folder / name) for name in ("rows.jsonl", "rows.parquet", "rows_disk")]


def test_jsonl_parquet_and_disk_folder_give_the_same_split_and_order(three_formats):
    loaded = [load_task(_task(path, eval_size=8, eval_seed=5)) for path in three_formats]
    first = loaded[0]
    assert len(first.train) == 32 and len(first.eval) == 8
    by_text = {p.text: p for p in first.train + first.eval}
    assert by_text["What is 6 + 6?"] == Prompt("What is 6 + 6?", "12", {"level": 0})  # ints stay "12", not "12.0"
    for other in loaded[1:]:
        assert _pairs(other.train) == _pairs(first.train) and _pairs(other.eval) == _pairs(first.eval)
    orders = [[data.train[i].text for i in PromptOrder(len(data.train), seed=3).take(70)] for data in loaded]
    assert orders[0] == orders[1] == orders[2]
    # The JSONL row number is the line number: rows after the blank line sit one line lower.
    assert by_text["What is 7 + 7?"].source == f"{three_formats[0]}: row 9"


def test_eval_seed_changes_the_split_and_train_never_holds_an_eval_prompt(three_formats):
    jsonl = three_formats[0]
    a, b = (load_task(_task(jsonl, eval_size=8, eval_seed=seed)) for seed in (1, 2))
    assert {p.text for p in a.eval} != {p.text for p in b.eval}
    for data in (a, b):
        assert not {p.text for p in data.train} & {p.text for p in data.eval}
        assert len(data.train) + len(data.eval) == len(ROWS)


def test_duplicated_prompts_of_the_held_out_set_leave_train(tmp_path):
    rows = [{"question": f"q{i % 10}", "answer": i} for i in range(30)]  # every text three times
    data = load_task(_task(_write_jsonl(tmp_path / "dup.jsonl", rows), eval_size=4, eval_seed=0))
    held = {p.text for p in data.eval}
    assert not held & {p.text for p in data.train}
    assert len(data.train) == 30 - 3 * len(held)


def test_answers_become_strings_and_metadata_keeps_the_other_scalar_fields(tmp_path):
    rows = [{"q": "a", "answer": 12, "level": 1, "tags": ["x"]}, {"q": "b", "answer": 12.5, "level": None}]
    data = load_task(
        TaskSection(name="jsonl", prompts_path=_write_jsonl(tmp_path / "r.jsonl", rows), prompt_field="q", eval_size=0)
    )
    # JSON reads the column as floats (12.0); the reference answer is still "12". Lists and nulls stay out.
    assert _pairs(data.train) == [("a", "12", {"level": 1}), ("b", "12.5", {})]


def test_eval_path_and_a_test_split_are_the_held_out_set(tmp_path):
    train = _write_jsonl(tmp_path / "train.jsonl", ROWS)
    extra = [{"question": "held out only", "answer": 99, "level": 0}]
    eval_file = _write_jsonl(tmp_path / "eval.jsonl", ROWS[:3] + extra)
    data = load_task(_task(train, eval_path=eval_file))
    assert [p.text for p in data.eval] == [r["question"] for r in ROWS[:3]] + ["held out only"]
    assert [p.text for p in data.train] == [r["question"] for r in ROWS[3:]]
    datasets = _hf_datasets()
    splits = {"train": datasets.Dataset.from_list(ROWS), "test": datasets.Dataset.from_list(ROWS[:2] + extra)}
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "dd"))
    data = load_task(_task(str(tmp_path / "dd"), eval_size=30))
    assert [p.text for p in data.eval] == [r["question"] for r in ROWS[:2]] + ["held out only"]
    assert len(data.train) == len(ROWS) - 2 and data.eval[0].source == f"{tmp_path / 'dd'}[test]: row 1"


GOOD = '{"question": "What is 1 + 1?", "answer": 2}'


@pytest.mark.parametrize(
    "lines, message",
    [
        (None, "no such file"),
        ([GOOD, GOOD, '{"question": "x", "answer": 1'], "line 3: not valid JSON"),
        ([GOOD, '{"prompt": "x", "answer": 1}'], "row 2: field 'question' is missing"),
        ([GOOD, GOOD, GOOD, '{"question": 7, "answer": 1}'], "row 4: field 'question' is a int, not a string"),
        ([GOOD, '{"question": "x", "solution": 1}'], "row 2: field 'answer' is missing"),
        (['{"question": "x", "answer": [1, 2]}'], "row 1: field 'answer' is a list"),
        (['{"question": " ", "answer": 1}'], "row 1: field 'question' is empty"),
    ],
)
def test_bad_rows_raise_task_error_naming_file_row_and_field(tmp_path, lines, message):
    path = tmp_path / "bad.jsonl"
    if lines is not None:
        path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TaskError, match=f"^{path}: {message}"):
        load_task(_task(str(path), eval_size=0))


def test_no_rows_left_for_training_raises(tmp_path):
    path = _write_jsonl(tmp_path / "few.jsonl", ROWS[:3])
    with pytest.raises(TaskError, match="no training prompts left"):
        load_task(_task(path, eval_size=3))


GYM = {"min_digits": 1, "max_digits": 1, "min_terms": 2, "max_terms": 2}


def _gym(**kwargs) -> TaskSection:
    base = {"generator": "basic_arithmetic", "generator_config": GYM, "train_size": 300, "eval_size": 40}
    return TaskSection(name="reasoning_gym", **(base | kwargs))


def test_reasoning_gym_is_seeded_and_drops_train_prompts_seen_in_eval():
    import reasoning_gym

    raw = {e["question"] for e in reasoning_gym.create_dataset("basic_arithmetic", size=300, seed=1, **GYM)}
    held = {e["question"] for e in reasoning_gym.create_dataset("basic_arithmetic", size=40, seed=2, **GYM)}
    assert raw & held  # one-digit pairs repeat: without the de-overlap train would hold eval prompts
    data = load_task(_gym())
    assert not {p.text for p in data.train} & {p.text for p in data.eval}
    assert len(data.eval) == 40 and 0 < len(data.train) < 300
    assert data == load_task(_gym()) and data.train != load_task(_gym(train_seed=7)).train
    first = data.eval[0]
    assert first.source == "reasoning_gym basic_arithmetic: eval prompt 0"
    assert json.loads(json.dumps(first.metadata)) == first.metadata and first.metadata["source_index"] == 0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"generator": "basic_arithmetc"}, "unknown generator 'basic_arithmetc'; e.g. basic_arithmetic"),
        ({"generator_config": {"max_digitz": 2}}, "generator_config has no key 'max_digitz'; it takes min_terms"),
        ({"generator_config": {"seed": 2}}, "generator_config.seed: set task.train_seed"),
        ({"generator_config": {"min_digits": 0}}, "min_digits must be positive"),
    ],
)
def test_reasoning_gym_bad_generator_or_config_names_it(kwargs, message):
    with pytest.raises(TaskError, match=message):
        load_task(_gym(**kwargs))


def test_prompt_order_epochs_are_seeded_permutations_and_resume_at_a_cursor():
    order = PromptOrder(50, seed=4)
    epochs = [order.take(50) for _ in range(3)]
    assert all(sorted(e) == list(range(50)) for e in epochs)
    assert epochs[0] != epochs[1] != epochs[2] and order.cursor == 150 and order.epoch == 3
    assert PromptOrder(50, seed=5).take(50) != epochs[0]
    first = PromptOrder(50, seed=4)
    head = first.take(37) + first.take(1)
    resumed = PromptOrder(50, seed=4, cursor=first.cursor)
    assert head == epochs[0][:38]
    assert resumed.take(80) == first.take(80) == (epochs[0] + epochs[1] + epochs[2])[38:118]


def _check_cfg(model: Path, **task) -> RunConfig:
    task.setdefault("eval_size", 0)
    return RunConfig.model_validate(
        {
            "model": {"path": str(model)},
            "task": task,
            "rollout": {"max_model_len": 16},
            "coordinator": {"max_tokens": 8},
        }
    )


def test_check_task_names_the_row_of_a_too_long_prompt(tmp_path, tiny_model):
    rows = [{"prompt": "ab", "answer": 1}, {"prompt": "abcdefgh", "answer": 1}, {"prompt": "a" * 20, "answer": 1}]
    path = _write_jsonl(tmp_path / "long.jsonl", rows)
    ok = check_task(_check_cfg(tiny_model, name="dataset", prompts_path=_write_jsonl(tmp_path / "ok.jsonl", rows[:2])))
    assert ok is not None and len(ok.train) == 2  # 8 tokens fit exactly
    message = "row 3: prompt is 20 tokens; rollout.max_model_len - coordinator.max_tokens leaves 8"
    with pytest.raises(TaskError, match=f"^{path}: {message}"):
        check_task(_check_cfg(tiny_model, name="dataset", prompts_path=path))
    with pytest.raises(TaskError, match="^reasoning_gym basic_arithmetic: train prompt 0: prompt is"):
        check_task(_check_cfg(tiny_model, name="reasoning_gym", generator="basic_arithmetic", train_size=5))
    with pytest.raises(TaskError, match="^model.path '.*nowhere'"):
        check_task(_check_cfg(tmp_path / "nowhere", name="dataset", prompts_path=path))
    assert check_task(_check_cfg(tmp_path / "nowhere")) is None  # the toy task needs no data


def test_renderer_without_a_template_encodes_the_raw_text(tiny_model):
    renderer = PromptRenderer(str(tiny_model), system_prompt="Be brief.")
    assert not renderer.uses_template
    prompt = Prompt("What is 2+2?", "4")
    assert renderer.ids(prompt) == renderer.tokenizer.encode(prompt.text, add_special_tokens=False)
    # One character, one token (spaces too): no system turn, no specials, and the ids the rollout's Vocab gives.
    assert renderer.ids(prompt) == Vocab.from_model_dir(tiny_model).encode(prompt.text) and len(prompt.text) == 12


def test_renderer_applies_the_chat_template(smollm2_path):
    prompts = [Prompt("What is 7 + 5?", "12"), Prompt("Name a prime.", "2")]
    system = "You are a careful mathematician."
    for system_turn in ([], [{"role": "system", "content": system}]):
        renderer = PromptRenderer(str(smollm2_path), system_prompt=system if system_turn else "")
        assert renderer.uses_template
        for prompt in prompts:
            messages = [*system_turn, {"role": "user", "content": prompt.text}]
            expected = renderer.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            expected = expected["input_ids"] if isinstance(expected, Mapping) else expected
            assert renderer.ids(prompt) == list(expected)
            text = renderer.tokenizer.decode(renderer.ids(prompt))
            assert text == renderer.text(prompt)
            assert f"<|im_start|>user\n{prompt.text}<|im_end|>\n<|im_start|>assistant\n" in text
            assert text.startswith(f"<|im_start|>system\n{system}<|im_end|>") == bool(system_turn)
        assert renderer.ids_batch(prompts) == [renderer.ids(p) for p in prompts]
    raw = PromptRenderer(str(smollm2_path), chat_template=False)
    assert not raw.uses_template
    assert raw.ids(prompts[0]) == raw.tokenizer.encode(prompts[0].text, add_special_tokens=False)
    assert raw.ids(prompts[0]) != renderer.ids(prompts[0])


def test_every_task_name_the_config_takes_has_a_source_and_the_toy_one_has_no_finite_data():
    from typing import get_args

    from services.common.config import TaskSection
    from services.common.tasks import SOURCES

    assert set(get_args(TaskSection.model_fields["name"].annotation)) == set(SOURCES)
    assert load_task(TaskSection()) is None  # the default toy task: the coordinator draws builtin_prompts
