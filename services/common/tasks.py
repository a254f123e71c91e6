"""Prompt sources (the toy task, data files, reasoning-gym), their seeded order, and their rendering into token ids.

Imports no torch: datasets, reasoning_gym and transformers are imported only by the functions that need them.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import random
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

from .config import RunConfig, TaskSection

# The built-in task: a prompt is a few symbols of one class; the answer should continue with
# symbols of that same class. A uniform random policy over the tiny model's vocabulary hits a
# class with probability 8 / vocab_size (about 0.11), so a random model scores well under 0.2.
SYMBOL_CLASSES = ("abcdefgh", "ijklmnop", "qrstuvwx", "01234567")

_EVAL_SPLITS = ("test", "validation")
_RENDER_CHUNK = 1024  # prompts tokenized per batch by check_task


@dataclass(frozen=True, slots=True)
class Prompt:
    text: str
    """The user's prompt as in the data (not rendered)."""
    answer: str
    """Reference answer the rewards compare against."""
    metadata: dict = field(default_factory=dict)
    """JSON-serialisable: the reasoning-gym entry's metadata, or a file row's other scalar fields."""
    source: str = field(default="", compare=False)
    """Where the prompt came from, for error messages: "data/train.jsonl: row 3"."""


class TaskError(ValueError):
    """One line naming the file, row and field (or the generator and key) at fault."""


@dataclass(frozen=True, slots=True)
class TaskData:
    train: list[Prompt]
    eval: list[Prompt]


# ---------------------------------------------------------------------------------------------------------------------
# The toy task and the prompt order


def builtin_prompts(seed: int, prompt_len: int) -> Iterator[Prompt]:
    rng = random.Random(seed)
    while True:
        symbols = rng.choice(SYMBOL_CLASSES)
        yield Prompt("".join(rng.choice(symbols) for _ in range(prompt_len)), symbols)


class PromptOrder:
    """Seeded, epoch-aware order over n prompts with a resumable cursor."""

    def __init__(self, n: int, seed: int, cursor: int = 0):
        if n < 1 or cursor < 0:
            raise ValueError(f"PromptOrder needs n >= 1 and cursor >= 0, got n={n}, cursor={cursor}")
        self.n, self.seed, self.cursor = n, seed, cursor
        self._epoch = -1
        self._permutation: list[int] = []

    @property
    def epoch(self) -> int:
        return self.cursor // self.n

    def take(self, k: int) -> list[int]:
        """The next k indices; every epoch is a fresh permutation of range(n) that depends only on (seed, epoch)."""
        out: list[int] = []
        while len(out) < k:
            if self._epoch != self.epoch:
                self._epoch, self._permutation = self.epoch, self._shuffled(self.epoch)
            start = self.cursor % self.n
            chunk = self._permutation[start : start + k - len(out)]
            out += chunk
            self.cursor += len(chunk)
        return out

    def _shuffled(self, epoch: int) -> list[int]:
        order = list(range(self.n))
        # A string seed is hashed with SHA-512: the same order in every process, whatever PYTHONHASHSEED is.
        random.Random(f"{self.seed}/{epoch}").shuffle(order)
        return order


# ---------------------------------------------------------------------------------------------------------------------
# Loading a task


def load_task(task: TaskSection) -> TaskData | None:
    """Training and held-out prompts of the task's source (SOURCES); train never holds an eval prompt's text. None
    for a source without finite data: the toy task, whose prompts the coordinator draws from builtin_prompts."""
    return SOURCES[task.name](task)


def _without_overlap(train: list[Prompt], held_out: list[Prompt], label: str) -> TaskData:
    held_texts = {p.text for p in held_out}
    kept = [p for p in train if p.text not in held_texts]
    if not kept:
        raise TaskError(
            f"{label}: no training prompts left after holding out {len(held_out)} for eval; lower task.eval_size"
        )
    return TaskData(kept, held_out)


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


def _one_line(error: BaseException) -> str:
    cause = error.__cause__ or error
    text = str(cause).strip().splitlines()
    return text[0] if text else type(cause).__name__


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


# ---------------------------------------------------------------------------------------------------------------------
# reasoning-gym


def _json_safe(value: object) -> Any:
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((_json_safe(v) for v in value), key=repr)
    return str(value)  # Fraction, sympy expressions, numpy scalars, ...


def _gym_dataset(task: TaskSection, size: int, seed: int) -> Any:
    import reasoning_gym
    from reasoning_gym.factory import DATASETS

    name, label = task.generator, f"reasoning_gym {task.generator}"
    if name not in DATASETS:
        close = difflib.get_close_matches(name, DATASETS, n=3) or sorted(DATASETS)[:8]
        raise TaskError(f"reasoning_gym: unknown generator {name!r}; e.g. {', '.join(close)} ({len(DATASETS)} in all)")
    keys = [f.name for f in dataclasses.fields(DATASETS[name][1]) if f.name not in ("size", "seed")]
    for key in task.generator_config:
        if key in ("size", "seed"):
            raise TaskError(f"{label}: task.generator_config.{key}: set task.train_{key} / task.eval_{key} instead")
        if key not in keys:
            raise TaskError(f"{label}: task.generator_config has no key {key!r}; it takes {', '.join(keys)}")
    try:
        return reasoning_gym.create_dataset(name, size=size, seed=seed, **task.generator_config)
    except (AssertionError, TypeError, ValueError) as e:  # the generator config's own validation
        raise TaskError(f"{label}: bad task.generator_config {task.generator_config} ({e or type(e).__name__})") from e


def _gym_prompts(task: TaskSection, split: str, size: int, seed: int) -> list[Prompt]:
    if size == 0:
        return []
    label = f"reasoning_gym {task.generator}: {split} prompt"
    # Prompt i is create_dataset(...)[i], so the index in a message is the one that regenerates it.
    return [
        Prompt(entry["question"], str(entry["answer"]), _json_safe(entry["metadata"]), source=f"{label} {i}")
        for i, entry in enumerate(_gym_dataset(task, size, seed))
    ]


def _load_gym_task(task: TaskSection) -> TaskData:
    train = _gym_prompts(task, "train", task.train_size, task.train_seed)
    held_out = _gym_prompts(task, "eval", task.eval_size, task.eval_seed)
    return _without_overlap(train, held_out, f"reasoning_gym {task.generator}")


# ---------------------------------------------------------------------------------------------------------------------
# Rendering and the up-front check


def _load_tokenizer(model_path: str) -> Any:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    # transformers 5's AutoTokenizer rebuilds some tokenizers from the model type: the tiny Qwen2's character
    # tokenizer comes back with Qwen2's byte-level pre-tokenizer, which drops spaces. tokenizer.json as written is
    # what the rollout's Vocab decodes with, so load it as it is whenever the folder has one.
    cls = PreTrainedTokenizerFast if (Path(model_path) / "tokenizer.json").is_file() else AutoTokenizer
    try:
        return cls.from_pretrained(model_path, local_files_only=True)
    except (OSError, ValueError) as e:
        raise TaskError(f"{model_path}: cannot load a tokenizer ({_one_line(e)})") from e


class PromptRenderer:
    """Turns a prompt into the token ids the policy sees: through the chat template, or the raw text."""

    def __init__(self, model_path: str, system_prompt: str = "", chat_template: bool = True):
        self.tokenizer = _load_tokenizer(model_path)
        self.system_prompt = system_prompt
        self.uses_template = chat_template and bool(getattr(self.tokenizer, "chat_template", None))

    def messages(self, prompt: Prompt) -> list[dict[str, str]]:
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*system, {"role": "user", "content": prompt.text}]

    def text(self, prompt: Prompt) -> str:
        """The rendered prompt as text (for logs and tests)."""
        if not self.uses_template:
            return prompt.text
        return self.tokenizer.apply_chat_template(self.messages(prompt), add_generation_prompt=True, tokenize=False)

    def ids(self, prompt: Prompt) -> list[int]:
        return self.ids_batch([prompt])[0]

    def ids_batch(self, prompts: Sequence[Prompt]) -> list[list[int]]:
        if not prompts:
            return []
        if not self.uses_template:
            encoded = self.tokenizer([p.text for p in prompts], add_special_tokens=False)["input_ids"]
        else:
            conversations = [self.messages(p) for p in prompts]
            encoded = self.tokenizer.apply_chat_template(conversations, add_generation_prompt=True, tokenize=True)
            # transformers 5 returns a BatchEncoding here; older versions a plain list of id lists.
            if isinstance(encoded, Mapping):
                encoded = encoded["input_ids"]
        return [[int(i) for i in ids] for ids in encoded]


SOURCES: dict[str, Callable[[TaskSection], TaskData | None]] = {
    "class_continuation": lambda task: None,  # the toy task: endless generated prompts, no held-out set
    "dataset": _load_file_task,
    "jsonl": _load_file_task,
    "reasoning_gym": _load_gym_task,
}
"""Where a task.name's prompts come from: a new source is its loader (returning TaskData) and one line here, its
name in TaskSection.name's Literal (services/common/config/task.py)."""


def check_task(cfg: RunConfig) -> TaskData | None:
    """Load the task and check every prompt fits the context, before any process starts; None for the toy task."""
    data = load_task(cfg.task)
    if data is None:
        return None
    if not Path(cfg.model.path).is_dir():
        raise TaskError(f"model.path {cfg.model.path!r}: no such folder (create the model before checking the task)")
    limit = cfg.rollout.max_model_len - cfg.coordinator.max_tokens
    renderer = PromptRenderer(cfg.model.path, cfg.task.system_prompt, cfg.task.chat_template)
    for prompts in (data.train, data.eval):
        for start in range(0, len(prompts), _RENDER_CHUNK):
            chunk = prompts[start : start + _RENDER_CHUNK]
            for prompt, ids in zip(chunk, renderer.ids_batch(chunk)):
                if len(ids) > limit:
                    raise TaskError(
                        f"{prompt.source}: prompt is {len(ids)} tokens; "
                        f"rollout.max_model_len - coordinator.max_tokens leaves {limit}"
                    )
    return data
