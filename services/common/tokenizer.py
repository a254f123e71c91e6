"""The tiny model's character-level tokenizer, and id <-> text helpers that need no torch."""

from __future__ import annotations

import string
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

EOS, PAD = "<|endoftext|>", "<|pad|>"
CHARS = string.ascii_lowercase + string.ascii_uppercase + string.digits + " .,:;?!=+-*/()"


def build_char_tokenizer() -> Tokenizer:
    vocab = {tok: i for i, tok in enumerate([EOS, PAD, *CHARS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([EOS, PAD])
    return tok


class Vocab:
    """Encodes raw prompts and decodes completions for the rewards (any tokenizer.json, not only the toy one)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> Vocab:
        return cls(Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json")))

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        """The completion as text, special tokens (EOS, pad) skipped."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)
