"""Which engine a worker builds: rollout.engine's name -> its class, imported only when chosen (vLLM and
transformers are heavy). A new engine is one module implementing `engine.Engine` and one line here."""

from __future__ import annotations

from importlib import import_module

from services.common.config import RolloutSection

from .engine import Engine

ENGINES = {
    "vllm": "services.rollout.vllm_engine:VllmEngine",
    "hf": "services.rollout.hf_engine:HFEngine",
}


def make_engine(cfg: RolloutSection, model_path: str, seed: int, lm_head_fp32: bool = True) -> Engine:
    """lm_head_fp32: model.lm_head_fp32 (the logits of a bf16 engine computed in fp32, as the trainer's)."""
    if cfg.engine not in ENGINES:
        raise ValueError(f"rollout.engine must be one of {', '.join(map(repr, ENGINES))}; got {cfg.engine!r}")
    module, _, name = ENGINES[cfg.engine].partition(":")
    return getattr(import_module(module), name)(model_path, seed=seed, cfg=cfg, lm_head_fp32=lm_head_fp32)
