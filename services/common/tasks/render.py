"""PromptRenderer: a prompt to the token ids the policy sees, through the chat template or as raw text."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .data import Prompt, TaskError, _one_line
from .tools import Tool, hermes_tools_text


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

    def __init__(self, model_path: str, system_prompt: str = "", chat_template: bool = True, tools: Sequence[str] = ()):
        self.tokenizer = _load_tokenizer(model_path)
        self.system_prompt = system_prompt
        self.uses_template = chat_template and bool(getattr(self.tokenizer, "chat_template", None))
        # The JSON schemas of task.episode.tools, which the chat template lists for the model.
        try:
            self.tools = [Tool.from_path(p).schema for p in tools] or None
        except ValueError as e:
            raise TaskError(f"task.episode.tools: {e}") from None
        if self.tools and not self.uses_template:
            raise TaskError(f"{model_path}: tools need a tokenizer with a chat template and task.chat_template = true")
        if self.tools and self._ignores_tools():
            # The template never shows the model its tools: say them in the system turn, in the Hermes format.
            self.system_prompt = "\n\n".join(filter(None, [system_prompt, hermes_tools_text(self.tools)]))
            self.tools = None

    def _ignores_tools(self) -> bool:
        probe = [{"role": "user", "content": "x"}]
        with_tools = self.tokenizer.apply_chat_template(probe, tools=self.tools, tokenize=False)
        return with_tools == self.tokenizer.apply_chat_template(probe, tokenize=False)

    def messages(self, prompt: Prompt) -> list[dict[str, str]]:
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*system, {"role": "user", "content": prompt.text}]

    def text(self, prompt: Prompt) -> str:
        """The rendered prompt as text (for logs and tests)."""
        if not self.uses_template:
            return prompt.text
        return self.tokenizer.apply_chat_template(
            self.messages(prompt), tools=self.tools, add_generation_prompt=True, tokenize=False
        )

    def ids(self, prompt: Prompt) -> list[int]:
        return self.ids_batch([prompt])[0]

    def ids_batch(self, prompts: Sequence[Prompt]) -> list[list[int]]:
        if not prompts:
            return []
        if not self.uses_template:
            encoded = self.tokenizer([p.text for p in prompts], add_special_tokens=False)["input_ids"]
        else:
            conversations = [self.messages(p) for p in prompts]
            encoded = self.tokenizer.apply_chat_template(
                conversations, tools=self.tools, add_generation_prompt=True, tokenize=True
            )
            # transformers 5 returns a BatchEncoding here; older versions a plain list of id lists.
            if isinstance(encoded, Mapping):
                encoded = encoded["input_ids"]
        return [[int(i) for i in ids] for ids in encoded]
