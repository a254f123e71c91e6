"""Where the loop's prompts come from: the training order (seeded, epoch-aware, resumable), the held-out set, and
their rendering to token ids (the chat template, when the tokenizer has one)."""

from __future__ import annotations

import json
from collections.abc import Iterator

from protos.grpo.v1 import queue_pb2
from services.common.config import RunConfig
from services.common.tasks import Prompt, PromptOrder, PromptRenderer, TaskData, builtin_prompts


class PromptFeed:
    def __init__(self, cfg: RunConfig, data: TaskData | None, cursor: int = 0):
        task = cfg.task
        self.renderer = PromptRenderer(cfg.model.path, task.system_prompt, task.chat_template, task.episode.tools)
        self.name = f"reasoning_gym/{task.generator}" if task.name == "reasoning_gym" else task.name
        self.eval_prompts: list[Prompt] = data.eval if data else []
        self._train = data.train if data else []
        self._order = PromptOrder(len(self._train), cfg.run.seed, cursor) if data else None
        self._toy: Iterator[Prompt] | None = None if data else builtin_prompts(cfg.run.seed, task.prompt_len)
        self._toy_taken = 0
        self.skip_to(cursor)

    @property
    def cursor(self) -> int:
        """Training prompts handed out so far; a resumed run starts its PromptFeed here."""
        return self._order.cursor if self._order else self._toy_taken

    def skip_to(self, cursor: int) -> None:
        """Continue a resumed run's order at `cursor`: the prompts before it were handed out already."""
        assert cursor >= self.cursor, (cursor, self.cursor)
        if self._order is not None:
            self._order.cursor = cursor
        else:
            self.take(cursor - self.cursor)

    def take(self, k: int) -> list[Prompt]:
        if self._toy is not None:
            self._toy_taken += k
            return [next(self._toy) for _ in range(k)]
        return [self._train[i] for i in self._order.take(k)]

    def task_spec(self, prompt: Prompt) -> queue_pb2.TaskSpec:
        return queue_pb2.TaskSpec(
            name=self.name, answer=prompt.answer, prompt=prompt.text, metadata_json=json.dumps(prompt.metadata)
        )
