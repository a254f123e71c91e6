"""A task from data files or folders (JSONL, JSON, CSV, Parquet, a datasets folder): rows to prompts."""

from __future__ import annotations

import json
import math
import os
import random
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

from ..config import TaskSection
from .data import Prompt, TaskData, TaskError, _one_line, _without_overlap

_EVAL_SPLITS = ("test", "validation")


def _load_file_task(task: TaskSection) -> TaskData:
    splits = _read_rows(task.prompts_path)
    train = _prompts(_pick_split(splits, ("train",), task.prompts_path), task)
    if task.eval_path:
        eval_splits = _read_rows(task.eval_path)
        held_out = _prompts(_pick_split(eval_splits, (*_EVAL_SPLITS, "train"), task.eval_path), task)
    elif any(name in splits for name in _EVAL_SPLITS):
        held_out = _prompts(_pick_split(splits, _EVAL_SPLITS, task.prompts_path), task)
    else:
        train, held_out = _hold_out(train, task.eval_size, task.eval_seed)
    return _without_overlap(train, held_out, task.prompts_path)


def _hold_out(rows: list[Prompt], size: int, seed: int) -> tuple[list[Prompt], list[Prompt]]:
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    held = set(order[:size])
    return [p for i, p in enumerate(rows) if i not in held], [p for i, p in enumerate(rows) if i in held]


# ---------------------------------------------------------------------------------------------------------------------
# Rows of files and folders (each row paired with its "path: row N" label)

Rows = list[tuple[str, dict]]


def _datasets() -> ModuleType:
    # The data are local files: neither datasets nor huggingface_hub under it may reach for the network.
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    import datasets

    return datasets


def _numbered(label: str, rows: list[dict], numbers: Sequence[int] | None = None) -> Rows:
    numbers = numbers or range(1, len(rows) + 1)
    return [(f"{label}: row {n}", row) for n, row in zip(numbers, rows)]


def _read_rows(path: str) -> dict[str, Rows]:
    """Split name -> rows; a file is one split, "train"."""
    p = Path(path)
    if not p.exists():
        raise TaskError(f"{path}: no such file or folder")
    if p.is_dir():
        return _read_disk(p, path)
    suffix = p.suffix.lower()
    if suffix in (".jsonl", ".json"):
        return {"train": _read_json(p, path)}
    if suffix == ".parquet":
        try:
            return {"train": _numbered(path, _load_dataset("parquet", p))}
        except Exception as e:  # whatever datasets or pyarrow raise, the file is not Parquet we can read
            raise TaskError(f"{path}: not a readable Parquet file ({_one_line(e)})") from e
    raise TaskError(f"{path}: unsupported data file; use .jsonl, .json, .parquet or a folder written by save_to_disk")


def _load_dataset(builder: str, p: Path) -> list[dict]:
    # A private, temporary cache: converting our own files is cheap, and a shared one would grow with every run.
    with tempfile.TemporaryDirectory(prefix="grpo-task-") as cache:
        return _datasets().load_dataset(builder, data_files=str(p), split="train", cache_dir=cache).to_list()


def _read_disk(p: Path, path: str) -> dict[str, Rows]:
    datasets = _datasets()
    try:
        loaded = datasets.load_from_disk(str(p))
    except Exception as e:  # any failure means the folder is not one save_to_disk wrote
        raise TaskError(f"{path}: not a folder written by save_to_disk ({_one_line(e)})") from e
    if isinstance(loaded, datasets.DatasetDict):
        return {name: _numbered(f"{path}[{name}]", split.to_list()) for name, split in loaded.items()}
    return {"train": _numbered(path, loaded.to_list())}


def _pick_split(splits: dict[str, Rows], preferred: tuple[str, ...], path: str) -> Rows:
    for name in preferred:
        if name in splits:
            return splits[name]
    if len(splits) == 1:
        return next(iter(splits.values()))
    raise TaskError(f"{path}: no split named {' or '.join(preferred)}; it has {', '.join(sorted(splits))}")


def _lines(text: str) -> list[str]:
    # Only "\n" ends a JSON line; str.splitlines would also split at U+2028 inside a string value.
    return text.split("\n")


def _read_json(p: Path, path: str) -> Rows:
    try:
        rows = _load_dataset("json", p)
    except Exception as e:  # datasets names no line: find the bad one ourselves
        _raise_json_error(p, path, e)
    line_numbers = [n for n, line in enumerate(_lines(p.read_text(encoding="utf-8")), 1) if line.strip()]
    # JSON Lines: row i is the i-th non-blank line. A JSON array: rows are counted from 1.
    return _numbered(path, rows, line_numbers if len(line_numbers) == len(rows) else None)


def _raise_json_error(p: Path, path: str, error: Exception) -> NoReturn:
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TaskError(f"{path}: cannot read it as UTF-8 text ({e})") from error
    if not text.strip():
        raise TaskError(f"{path}: no rows")
    if text.lstrip().startswith("["):
        try:
            json.loads(text)
        except json.JSONDecodeError as e:
            raise TaskError(f"{path}: line {e.lineno}: not valid JSON ({e.msg})") from error
    else:
        for n, line in enumerate(_lines(text), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise TaskError(f"{path}: line {n}: not valid JSON ({e.msg} at column {e.colno})") from error
            if not isinstance(row, dict):
                raise TaskError(f"{path}: line {n}: not a JSON object") from error
    raise TaskError(f"{path}: datasets cannot read it ({_one_line(error)})") from error


# ---------------------------------------------------------------------------------------------------------------------
# Rows -> prompts

_SCALARS = (str, bool, int, float)


def _is_missing(value: object) -> bool:
    # Parquet written from pandas stores a missing number as NaN.
    return value is None or (isinstance(value, float) and math.isnan(value))


def _field(where: str, row: dict, name: str) -> Any:
    value = row.get(name)
    if _is_missing(value):
        present = ", ".join(repr(k) for k, v in row.items() if not _is_missing(v))
        raise TaskError(f"{where}: field {name!r} is missing (the row has {present or 'no fields'})")
    return value


def _answer_text(value: object) -> str:
    # A JSON column mixing 12 and 12.5 reads 12 back as 12.0; the reference answer is still "12".
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _row_prompt(where: str, row: dict, task: TaskSection) -> Prompt:
    text = _field(where, row, task.prompt_field)
    if not isinstance(text, str):
        raise TaskError(f"{where}: field {task.prompt_field!r} is a {type(text).__name__}, not a string")
    if not text.strip():
        raise TaskError(f"{where}: field {task.prompt_field!r} is empty")
    answer = _field(where, row, task.answer_field)
    if not isinstance(answer, _SCALARS):
        raise TaskError(f"{where}: field {task.answer_field!r} is a {type(answer).__name__}, not a string or number")
    # Null fields are left out: datasets fills a key that only some rows have with None in all the others.
    others = {k: v for k, v in row.items() if k not in (task.prompt_field, task.answer_field)}
    metadata = {k: v for k, v in others.items() if isinstance(v, _SCALARS) and not _is_missing(v)}
    return Prompt(text, _answer_text(answer), metadata, source=where)


def _prompts(rows: Rows, task: TaskSection) -> list[Prompt]:
    return [_row_prompt(where, row, task) for where, row in rows]
