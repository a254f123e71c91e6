"""Token-in, token-out episodes.

An episode is kept as token ids from its first prompt on: each model turn exactly as the engine sampled it, each
environment message (a tool result, a user turn, feedback) appended as the chat template renders that one message
after a finished model turn. Earlier turns are never re-tokenized, so the ids the trainer scores are the ids the
engine sampled, and the loss mask covers the model's tokens only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# A stand-in conversation the template renders a message after: its content never reaches an episode, only the ids
# the template puts between the end of a model turn and the next model turn.
_BEFORE = ({"role": "user", "content": "."}, {"role": "assistant", "content": "."})


class MessageRenderer:
    """The ids a chat template gives the messages that follow a finished model turn, the next turn's generation
    prompt included: `<|im_end|>` ends the model's turn as sampled; this gives `\\n<|im_start|>tool\\n42<|im_end|>\\n
    <|im_start|>assistant\\n` (ChatML) for a tool message "42"."""

    def __init__(self, tokenizer: Any):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("multi-turn episodes need a tokenizer with a chat template (task.chat_template = true)")
        self.tokenizer = tokenizer

    def ids(self, messages: Sequence[Mapping[str, Any]], turn_end: int) -> list[int]:
        """The ids of `messages` (one or more, e.g. a turn's tool results) after a model turn that ended with the
        token `turn_end` (the stop token the engine sampled), and the next turn's generation prompt. ValueError
        where the template renders the earlier turns differently once the messages follow, or never ends a model
        turn with `turn_end`: appending ids would then not be what the template gives."""
        before = self._render([*_BEFORE], generation_prompt=False)
        after = self._render([*_BEFORE, *map(dict, messages)], generation_prompt=True)
        if after[: len(before)] != before:
            raise ValueError(
                f"the chat template renders the turns before a {messages[0].get('role')!r} message differently once "
                "it follows: its ids cannot be appended without re-tokenizing the episode"
            )
        if turn_end not in before:
            raise ValueError(f"the chat template never ends a model turn with token {turn_end}")
        end = len(before) - before[::-1].index(turn_end)  # just past the model turn's last token
        return before[end:] + after[len(before) :]

    def _render(self, messages: list[dict[str, Any]], generation_prompt: bool) -> list[int]:
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=True)
        if isinstance(ids, Mapping):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        return [int(i) for i in ids]


@dataclass
class Episode:
    """One episode as the trainer gets it: prompt_ids, then response_ids with a mask and a logprob per id."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    """1 on the model's tokens (trained on), 0 on the environment's (never in the loss, the KL or the entropy)."""
    logprobs: list[float] = field(default_factory=list)
    """The engine's logprob of each model token; 0.0 on the environment's, which nobody sampled."""
    messages: list[dict[str, str]] = field(default_factory=list)
    """The turns as text, for samples.jsonl: {"role": "assistant", ...} for the model's, the environment's as sent."""
    model_turns: int = 0

    def add_model_turn(self, ids: Sequence[int], logprobs: Sequence[float], text: str) -> None:
        if len(ids) != len(logprobs):
            raise ValueError(f"a model turn of {len(ids)} tokens came with {len(logprobs)} logprobs")
        self.response_ids += [int(i) for i in ids]
        self.logprobs += [float(x) for x in logprobs]
        self.loss_mask += [1] * len(ids)
        self.messages.append({"role": "assistant", "content": text})
        self.model_turns += 1

    def add_messages(self, messages: Sequence[Mapping[str, str]], ids: Sequence[int]) -> None:
        """Environment messages, with the ids MessageRenderer.ids gave them."""
        self.response_ids += [int(i) for i in ids]
        self.logprobs += [0.0] * len(ids)
        self.loss_mask += [0] * len(ids)
        self.messages += [dict(m) for m in messages]

    @property
    def context_ids(self) -> list[int]:
        """What the engine continues from for the next model turn."""
        return self.prompt_ids + self.response_ids
