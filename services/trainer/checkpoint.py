"""HF-format checkpoints (safetensors + config + tokenizer) that transformers and vLLM load as they are."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from torch import Tensor

# Weight files of the source directory are replaced by the trained weights; everything else
# (config, generation config, tokenizer, chat template) is copied unchanged.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".safetensors.index.json", ".bin.index.json")


def write_hf(state_dict: dict[str, Tensor], source_dir: Path, path: Path) -> None:
    """Write into a sibling temp folder, then rename: a crash never leaves a checkpoint that looks complete."""
    from huggingface_hub import save_torch_state_dict

    assert not path.exists() or not any(path.iterdir()), f"{path} is not empty"
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_torch_state_dict(state_dict, tmp)
    for f in source_dir.iterdir():
        if f.is_file() and not f.name.endswith(_WEIGHT_SUFFIXES):
            shutil.copy2(f, tmp / f.name)
    if path.exists():
        path.rmdir()
    tmp.rename(path)
