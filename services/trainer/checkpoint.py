"""Checkpoints: an HF export (safetensors + config + tokenizer) that transformers and vLLM load as they are,
plus the sharded training state (torch distributed checkpoint) that resumes a run exactly."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

TRAIN_STATE = "train_state"
"""Subfolder of a checkpoint holding the sharded training state."""

# Weight files of the source directory are replaced by the trained weights; everything else
# (config, generation config, tokenizer, chat template) is copied unchanged.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".safetensors.index.json", ".bin.index.json")


def confine(path: str, roots: Sequence[Path]) -> Path:
    """path resolved (symlinks followed), refused with ValueError unless it lies strictly inside one of roots (each
    resolved): Save and Load take paths from callers, and a checkpoint is written and read only where the run keeps
    its own. Strictly, so that the staging sibling of a Save lies inside too."""
    resolved = Path(path).resolve()
    if not any(root in resolved.parents for root in roots):
        allowed = " or ".join(str(root) for root in roots)
        raise ValueError(f"{path} resolves to {resolved}, outside {allowed} (the run folder, trainer.checkpoint_root)")
    return resolved


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


EMBED, LM_HEAD = "model.embed_tokens.weight", "lm_head.weight"
"""The input embedding and output head of the HF decoder families the trainer shards (model.model.layers)."""


def write_hf(state_dict: dict[str, Tensor], source_dir: Path, folder: Path) -> None:
    """Write state_dict as safetensors into folder (the caller's staging folder), plus every other file of
    source_dir (config, generation config, tokenizer, chat template)."""
    from huggingface_hub import save_torch_state_dict

    save_torch_state_dict(export_tensors(state_dict, tied_embeddings(source_dir, state_dict)), folder)
    for f in source_dir.iterdir():
        if f.is_file() and not f.name.endswith(_WEIGHT_SUFFIXES):
            shutil.copy2(f, folder / f.name)


def tied_embeddings(source_dir: Path, state_dict: dict[str, Tensor]) -> bool:
    """config.json's tie_word_embeddings; where it is absent, whether the head shares the embedding's storage."""
    config = json.loads((source_dir / "config.json").read_text())
    if "tie_word_embeddings" in config:
        return bool(config["tie_word_embeddings"])
    embed, head = state_dict.get(EMBED), state_dict.get(LM_HEAD)
    return embed is not None and head is not None and _storage(embed) == _storage(head)


def export_tensors(state_dict: dict[str, Tensor], tied: bool) -> dict[str, Tensor]:
    """The tensors to write: a tied model's embedding under both names, and no two names sharing storage.

    huggingface_hub's writer keeps one name of tensors that share storage (for a tied model, lm_head only):
    transformers loads that, but vLLM skips lm_head of a tied model and leaves its embedding unset, then
    generates garbage without an error (token 0 forever for SmolLM2). vLLM's in-place reload from a path
    needs lm_head.weight in turn, or it keeps its stale head. So every name gets its own copy."""
    out = dict(state_dict)
    if tied and (weight := out.get(EMBED, out.get(LM_HEAD))) is not None:
        out[EMBED] = out[LM_HEAD] = weight
    return _unshared(out)


def _unshared(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """A clone of every tensor whose storage an earlier name already holds (safetensors refuses shared storage)."""
    seen: set[int] = set()
    out = {}
    for name, t in state_dict.items():
        key = _storage(t)
        out[name] = t.clone() if key in seen else t
        seen.add(key)
    return out


def _storage(t: Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _rng_states(rank: int) -> dict[str, Tensor]:
    # Each rank's generators differ, so each rank saves and restores its own under its own keys.
    states = {f"rng/cpu/rank{rank}": torch.get_rng_state()}
    if torch.cuda.is_available():
        states[f"rng/cuda/rank{rank}"] = torch.cuda.get_rng_state()
    return states


def writer_threads() -> int:
    """Threads each rank writes its training state with: its share of the cores it may run on, at least 2 (one
    serializes while another waits on the disk) and at most 8. DCP's default is one; two wrote SmolLM2-135M's model
    and optimizer state 1.49x faster on 2 cores (bench/results/checkpoint_save/checkpoint_save_cpu.json)."""
    ranks_here = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return max(2, min(8, len(os.sched_getaffinity(0)) // ranks_here))


def save_train_state(
    folder: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    policy_version: int,
    rank: int,
    threads: int | None = None,
) -> None:
    """Collective: every rank writes its shards of model and optimizer, plus policy_version and its RNG, in
    `threads` files of its own (writer_threads() where None), each fsynced."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optimizer": optim_sd, "policy_version": torch.tensor(policy_version)}
    writer = dcp.FileSystemWriter(folder, thread_count=threads or writer_threads())
    dcp.save({**state, **_rng_states(rank)}, checkpoint_id=folder, storage_writer=writer)


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
