"""Checkpoints: an HF export (safetensors + config + tokenizer) that transformers and vLLM load as they are,
plus the sharded training state (torch distributed checkpoint) that resumes a run exactly."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from torch import Tensor, nn

TRAIN_STATE = "train_state"
"""Subfolder of a checkpoint holding the sharded training state."""

# Weight files of the source directory are replaced by the trained weights; everything else
# (config, generation config, tokenizer, chat template) is copied unchanged.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".safetensors.index.json", ".bin.index.json")


def staging_dir(path: Path) -> Path:
    """Sibling folder every rank writes into; renamed to path once complete, so a crash never leaves a
    checkpoint that looks complete."""
    return path.with_name(f"{path.name}.partial")


def reset_dir(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)


def publish_dir(staging: Path, path: Path) -> None:
    assert not path.exists() or not any(path.iterdir()), f"{path} is not empty"
    if path.exists():
        path.rmdir()
    staging.rename(path)


def write_hf(state_dict: dict[str, Tensor], source_dir: Path, folder: Path) -> None:
    from huggingface_hub import save_torch_state_dict

    save_torch_state_dict(state_dict, folder)
    for f in source_dir.iterdir():
        if f.is_file() and not f.name.endswith(_WEIGHT_SUFFIXES):
            shutil.copy2(f, folder / f.name)


def _rng_states(rank: int) -> dict[str, Tensor]:
    # Each rank's generators differ, so each rank saves and restores its own under its own keys.
    states = {f"rng/cpu/rank{rank}": torch.get_rng_state()}
    if torch.cuda.is_available():
        states[f"rng/cuda/rank{rank}"] = torch.cuda.get_rng_state()
    return states


def save_train_state(
    folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer, policy_version: int, rank: int
) -> None:
    """Collective: every rank writes its shards of model and optimizer, plus policy_version and its RNG."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optimizer": optim_sd, "policy_version": torch.tensor(policy_version)}
    dcp.save({**state, **_rng_states(rank)}, checkpoint_id=folder)


def load_train_state(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer, rank: int) -> int:
    """Collective: restore what save_train_state wrote (resharded if the rank count changed); returns
    policy_version. RNG states are restored where this rank's were saved."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    saved_keys = dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    rng = {k: torch.empty_like(v) for k, v in _rng_states(rank).items() if k in saved_keys}
    state = {"model": model_sd, "optimizer": optim_sd, "policy_version": torch.tensor(0), **rng}
    dcp.load(state, checkpoint_id=folder)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    for key, value in rng.items():
        (torch.set_rng_state if "/cpu/" in key else torch.cuda.set_rng_state)(value)
    return int(state["policy_version"])
