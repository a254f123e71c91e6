"""The pairing of bench/vs_trl.py: the one mapping from our resolved RunConfig to TRL 1.16's GRPOConfig, and what each
side's step then does, read back in one vocabulary (tests/integration/test_trl_pairing.py compares the two).

Imports neither TRL nor torch at module level: bench/trl_side.py runs it with TRL on its path, the test without.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from services.common.config import RunConfig
from services.trainer.lr_schedule import TRANSFORMERS_NAMES


def _clip_low(c: RunConfig) -> float:
    loss = c.trainer.loss
    return loss.clip_eps if loss.name in ("grpo", "dr_grpo") else loss.clip_eps_low


def _clip_high(c: RunConfig) -> float:
    # TRL 1.16 leaves epsilon_high unset (= epsilon) unless told: our dapo's clip-higher is 0.28, not 0.2.
    loss = c.trainer.loss
    return loss.clip_eps if loss.name in ("grpo", "dr_grpo") else loss.clip_eps_high


# Our losses in TRL's loss_type, by how the per-token losses are aggregated (services/trainer/objective.py:
# loss_weights): our grpo and dapo take the token mean over the batch, which is TRL's "dapo" (its "grpo" is the
# mean of per-sequence means); our gspo's sequence mean is TRL's "grpo" with sequence-level ratios.
_LOSS_TYPE = {"grpo": "dapo", "dapo": "dapo", "gspo": "grpo", "dr_grpo": "dr_grpo"}


def _minibatch_size(c: RunConfig) -> int:
    batch, minibatches = c.coordinator.num_prompts * c.coordinator.num_samples, c.trainer.minibatches
    if batch % minibatches:
        raise ValueError(f"TRL splits a batch into equal steps: {batch} sequences by trainer.minibatches={minibatches}")
    return batch // minibatches


def _max_steps(c: RunConfig) -> int:
    # TRL's schedule spans its max_steps (optimizer steps); ours spans trainer.lr_schedule_steps.
    steps = c.run.num_steps * c.trainer.minibatches
    if c.trainer.lr_schedule_steps != steps:
        raise ValueError(
            f"TRL's lr schedule spans its run ({steps} optimizer steps); trainer.lr_schedule_steps is "
            f"{c.trainer.lr_schedule_steps}"
        )
    return steps


TO_TRL: tuple[tuple[str, str, Callable[[RunConfig], Any]], ...] = (
    # (our key, or what our code fixes in brackets; TRL's GRPOConfig field; the conversion)
    ("coordinator.num_samples", "num_generations", lambda c: c.coordinator.num_samples),
    ("coordinator.num_prompts x num_samples / trainer.minibatches", "per_device_train_batch_size", _minibatch_size),
    ("trainer.minibatches", "steps_per_generation", lambda c: c.trainer.minibatches),
    ("(one pass over each batch)", "num_iterations", lambda c: 1),
    ("(one optimizer step per mini-batch)", "gradient_accumulation_steps", lambda c: 1),
    ("trainer.loss.name", "loss_type", lambda c: _LOSS_TYPE[c.trainer.loss.name]),
    (
        "trainer.loss.name",
        "importance_sampling_level",
        lambda c: "sequence" if c.trainer.loss.name == "gspo" else "token",
    ),
    ("trainer.loss.clip_eps | clip_eps_low", "epsilon", _clip_low),
    ("trainer.loss.clip_eps | clip_eps_high", "epsilon_high", _clip_high),
    ("trainer.loss.kl_beta", "beta", lambda c: c.trainer.loss.kl_beta),
    ("trainer.loss.entropy_coef", "entropy_coef", lambda c: c.trainer.loss.entropy_coef),
    ("coordinator.advantage", "scale_rewards", lambda c: {"grpo": "group", "dr_grpo": "none"}[c.coordinator.advantage]),
    ("trainer.lr", "learning_rate", lambda c: c.trainer.lr),
    ("trainer.lr_schedule", "lr_scheduler_type", lambda c: TRANSFORMERS_NAMES[c.trainer.lr_schedule]),
    ("trainer.lr_warmup_steps", "warmup_steps", lambda c: c.trainer.lr_warmup_steps),
    ("trainer.lr_schedule_steps", "max_steps", _max_steps),
    ("(torch AdamW, fused: services/trainer/fsdp2/build.py)", "optim", lambda c: "adamw_torch_fused"),
    ("(AdamW's default betas)", "adam_beta1", lambda c: _adamw_default("betas")[0]),
    ("(AdamW's default betas)", "adam_beta2", lambda c: _adamw_default("betas")[1]),
    ("(AdamW's default eps)", "adam_epsilon", lambda c: _adamw_default("eps")),
    ("trainer.weight_decay", "weight_decay", lambda c: c.trainer.weight_decay),
    ("trainer.max_grad_norm", "max_grad_norm", lambda c: c.trainer.max_grad_norm),
    ("trainer.dtype", "bf16", lambda c: c.trainer.dtype == "bfloat16"),  # autocast over fp32 master weights
    ("model.lm_head_fp32", "cast_lm_head_to_fp32", lambda c: False),  # refused below where it would act
    ("(the policy stays in from_pretrained's eval mode)", "disable_dropout", lambda c: True),
    ("rollout.engine", "use_vllm", lambda c: False),  # TRL's vLLM wants a GPU or a server: transformers here
    ("coordinator.temperature", "temperature", lambda c: c.coordinator.temperature),
    ("coordinator.top_p", "top_p", lambda c: c.coordinator.top_p),
    ("(no top-k)", "top_k", lambda c: 0),
    ("(no min-p)", "min_p", lambda c: None),
    ("(no repetition penalty)", "repetition_penalty", lambda c: 1.0),
    ("coordinator.ignore_eos", "generation_kwargs", lambda c: None),  # refused below when set
    ("coordinator.max_tokens", "max_completion_length", lambda c: c.coordinator.max_tokens),
    ("(truncated completions are trained on)", "mask_truncated_completions", lambda c: False),
    ("(the top-entropy token filter is not ours)", "top_entropy_quantile", lambda c: 1.0),
    # The template itself travels in the dataset: trl_side gives TRL messages exactly when our renderer uses the
    # tokenizer's chat template, and TRL renders them with that template and a generation prompt, as we do.
    ("task.chat_template", "chat_template_kwargs", lambda c: None),
    ("run.seed", "seed", lambda c: c.run.seed),
    ("(the coordinator's prompt order, run.seed)", "shuffle_dataset", lambda c: False),
)
"""Every GRPOConfig field that changes a step, from our resolved config. Fields left out are TRL's plumbing
(output, logging, saving, devices), set by trl_side itself, or options ours has no counterpart of at their default."""

_TRL_IS_MODE = {"token": "token_truncate", "sequence": "sequence_truncate", "off": "token_truncate"}

TO_TRL_GPU: tuple[tuple[str, str, Callable[[RunConfig], Any]], ...] = (
    # On a GPU both sides sample with vLLM: TRL's colocated in its own process, on the trainer's GPU.
    ("rollout.engine", "use_vllm", lambda c: c.rollout.engine == "vllm"),
    ("(the engine beside the trainer, on its GPU)", "vllm_mode", lambda c: "colocate"),
    (
        "rollout.gpu.gpu_memory_utilization",
        "vllm_gpu_memory_utilization",
        lambda c: c.rollout.gpu.gpu_memory_utilization,
    ),
    ("rollout.max_model_len", "vllm_max_model_length", lambda c: c.rollout.max_model_len),
    # Our truncated importance weight min(pi_trainer / pi_rollout, is_truncation) is TRL's *_truncate mode with no
    # floor; TRL's default (sequence_mask at 3.0) is not ours, so it is always set.
    (
        "trainer.loss.importance_sampling",
        "vllm_importance_sampling_correction",
        lambda c: c.trainer.loss.importance_sampling != "off",
    ),
    (
        "trainer.loss.importance_sampling",
        "vllm_importance_sampling_mode",
        lambda c: _TRL_IS_MODE[c.trainer.loss.importance_sampling],
    ),
    ("trainer.loss.is_truncation", "vllm_importance_sampling_clip_max", lambda c: c.trainer.loss.is_truncation),
    ("(no floor on the importance weight)", "vllm_importance_sampling_clip_min", lambda c: None),
)
"""What a GPU run (vs_trl.py --gpu) changes: TO_TRL's fields and these, which replace its use_vllm."""


def refuse_unpaired(c: RunConfig, gpu: bool = False) -> None:
    """A ValueError naming the settings of ours that TRL 1.16's GRPOTrainer cannot run the same way (on a GPU, where
    TRL samples with vLLM, or without one, where it samples with transformers)."""
    loss = c.trainer.loss
    why = {
        "coordinator.dynamic_sampling": (c.coordinator.dynamic_sampling, "TRL has no dynamic sampling"),
        "coordinator.overlong_buffer_tokens": (c.coordinator.overlong_buffer_tokens > 0, "TRL's is a reward"),
        "coordinator.ignore_eos": (c.coordinator.ignore_eos, "TRL's mask ends a completion at its first EOS"),
        "trainer.loss.importance_sampling": (
            loss.importance_sampling != "off" and not gpu,
            "TRL corrects only vLLM's samples, on a GPU",
        ),
        "trainer.loss.kl_estimator": (loss.kl_beta > 0 and loss.kl_estimator != "k3", "TRL's KL is k3"),
        "trainer.weight_decay": (c.trainer.weight_decay > 0, "transformers exempts biases and norms, ours does not"),
        "model.lm_head_fp32": (
            c.model.lm_head_fp32 and c.trainer.dtype == "bfloat16",
            "TRL cannot cast a tied head to fp32: set it false to pair in bfloat16",
        ),
        "task.rewards": (len(c.task.reward_weights()) != 1, "trl_side passes one reward function"),
    }
    bad = [f"{key} ({reason})" for key, (unpaired, reason) in why.items() if unpaired]
    if bad:
        raise ValueError("not paired with TRL: " + "; ".join(bad))


def trl_kwargs(c: RunConfig, gpu: bool = False) -> dict[str, Any]:
    """GRPOConfig's step-changing keyword arguments for our resolved config (TO_TRL, and TO_TRL_GPU on a GPU), after
    refuse_unpaired."""
    refuse_unpaired(c, gpu)
    return {field: convert(c) for _, field, convert in (*TO_TRL, *(TO_TRL_GPU if gpu else ()))}


def _adamw_default(name: str) -> Any:
    # build.py passes lr, weight_decay and fused to torch's AdamW: betas and eps are torch's defaults.
    import torch

    return inspect.signature(torch.optim.AdamW).parameters[name].default


def _advantage_eps() -> float:
    from services.coordinator.advantages import group_advantages

    return inspect.signature(group_advantages).parameters["eps"].default


@dataclass(frozen=True)
class Setting:
    """One thing a step does, as ours does it (from RunConfig and our code) and as TRL does it (from the resolved
    GRPOConfig, as a dict, and TRL 1.16's code): the two readers are written apart, so a setting dropped or
    converted wrong in TO_TRL shows as a difference."""

    name: str
    ours: Callable[[RunConfig], Any]
    trl: Callable[[dict], Any]


def _trl_corrects(d: dict) -> bool:
    return bool(d["use_vllm"] and d["vllm_importance_sampling_correction"])


_AGGREGATION = {"grpo": "token mean", "dapo": "token mean", "gspo": "sequence mean", "dr_grpo": "constant length"}
# TRL's loss_type by aggregation: dapo over the global batch, bnpo over the local one (the same in one process).
_TRL_AGGREGATION = {"dapo": "token mean", "bnpo": "token mean", "grpo": "sequence mean", "dr_grpo": "constant length"}
_TRL_SCHEDULES = {v: k for k, v in TRANSFORMERS_NAMES.items()}

SETTINGS: tuple[Setting, ...] = (
    Setting("group size", lambda c: c.coordinator.num_samples, lambda d: d["num_generations"]),
    Setting(
        "prompts per generated batch",
        lambda c: c.coordinator.num_prompts,
        lambda d: d["generation_batch_size"] // d["num_generations"],  # one process: world size 1
    ),
    Setting(
        "optimizer steps per generated batch",
        lambda c: c.trainer.minibatches,
        lambda d: d["steps_per_generation"] * d["num_iterations"] // d["gradient_accumulation_steps"],
    ),
    Setting("passes over each batch", lambda c: 1, lambda d: d["num_iterations"]),
    Setting(
        "loss aggregation", lambda c: _AGGREGATION[c.trainer.loss.name], lambda d: _TRL_AGGREGATION[d["loss_type"]]
    ),
    Setting(
        "constant-length normaliser (tokens)",
        lambda c: (
            (c.trainer.loss.dr_grpo_norm_tokens or c.coordinator.max_tokens)
            if c.trainer.loss.name == "dr_grpo"
            else None
        ),
        lambda d: d["max_completion_length"] if d["loss_type"] == "dr_grpo" else None,
    ),
    Setting(
        "importance ratio level",
        lambda c: "sequence" if c.trainer.loss.name == "gspo" else "token",
        lambda d: d["importance_sampling_level"],
    ),
    Setting("clip range low", _clip_low, lambda d: d["epsilon"]),
    Setting(
        "clip range high",
        _clip_high,
        lambda d: d["epsilon"] if d["epsilon_high"] is None else d["epsilon_high"],  # grpo_trainer.py: None = epsilon
    ),
    Setting("two-sided clip (delta)", lambda c: None, lambda d: d["delta"]),
    Setting("KL weight", lambda c: c.trainer.loss.kl_beta, lambda d: d["beta"]),
    Setting(
        "KL estimator",
        lambda c: c.trainer.loss.kl_estimator if c.trainer.loss.kl_beta > 0 else None,
        lambda d: "k3" if d["beta"] > 0 else None,  # grpo_trainer.py: exp(ref - logp) - (ref - logp) - 1
    ),
    Setting(
        "entropy bonus",
        lambda c: c.trainer.loss.entropy_coef,
        lambda d: "adaptive" if d["use_adaptive_entropy"] else d["entropy_coef"],
    ),
    Setting("top-entropy token quantile", lambda c: 1.0, lambda d: d["top_entropy_quantile"]),
    Setting(
        "rollout importance-sampling correction",
        lambda c: c.trainer.loss.importance_sampling,
        lambda d: (
            {"token_truncate": "token", "sequence_truncate": "sequence"}.get(
                mode := d["vllm_importance_sampling_mode"], mode
            )
            if _trl_corrects(d)
            else "off"
        ),
    ),
    Setting(
        "importance weight bounds",
        lambda c: (None, c.trainer.loss.is_truncation) if c.trainer.loss.importance_sampling != "off" else None,
        lambda d: (
            (d["vllm_importance_sampling_clip_min"], d["vllm_importance_sampling_clip_max"])
            if _trl_corrects(d)
            else None
        ),
    ),
    Setting(
        "advantage scaling",
        lambda c: {"grpo": "group std", "dr_grpo": "none"}[c.coordinator.advantage],
        lambda d: {"group": "group std", "batch": "batch std", "none": "none"}[d["scale_rewards"]],
    ),
    # grpo_trainer.py: advantages / (std_rewards + 1e-4), a constant of TRL's code.
    Setting("advantage epsilon", lambda c: _advantage_eps(), lambda d: 1e-4),
    Setting("optimizer", lambda c: "adamw_torch_fused", lambda d: d["optim"]),
    Setting("adam betas", lambda c: tuple(_adamw_default("betas")), lambda d: (d["adam_beta1"], d["adam_beta2"])),
    Setting("adam epsilon", lambda c: _adamw_default("eps"), lambda d: d["adam_epsilon"]),
    Setting("weight decay", lambda c: c.trainer.weight_decay, lambda d: d["weight_decay"]),
    Setting("gradient clipping norm", lambda c: c.trainer.max_grad_norm, lambda d: d["max_grad_norm"]),
    Setting("learning rate", lambda c: c.trainer.lr, lambda d: d["learning_rate"]),
    Setting("lr schedule", lambda c: c.trainer.lr_schedule, lambda d: _TRL_SCHEDULES.get(d["lr_scheduler_type"])),
    Setting("lr warmup steps", lambda c: c.trainer.lr_warmup_steps, lambda d: d["warmup_steps"]),
    Setting("lr schedule steps", lambda c: c.trainer.lr_schedule_steps, lambda d: d["max_steps"]),
    Setting("compute dtype", lambda c: c.trainer.dtype, lambda d: "bfloat16" if d["bf16"] else "float32"),
    Setting(
        "fp32 lm head",
        lambda c: c.model.lm_head_fp32 and c.trainer.dtype == "bfloat16",  # no effect in fp32 (config.py)
        lambda d: d["cast_lm_head_to_fp32"],
    ),
    Setting("dropout", lambda c: "off", lambda d: "off" if d["disable_dropout"] else "the model's"),
    Setting(
        "activation recomputation",
        lambda c: c.trainer.memory.activation_checkpointing != "off",
        lambda d: d["gradient_checkpointing"],
    ),
    Setting("generation engine", lambda c: c.rollout.engine, lambda d: "vllm" if d["use_vllm"] else "hf"),
    Setting("temperature", lambda c: c.coordinator.temperature, lambda d: d["temperature"]),
    Setting("top-p", lambda c: c.coordinator.top_p, lambda d: d["top_p"]),
    Setting("top-k", lambda c: 0, lambda d: d["top_k"] or 0),
    Setting("min-p", lambda c: None, lambda d: d["min_p"]),
    Setting("repetition penalty", lambda c: 1.0, lambda d: d["repetition_penalty"]),
    Setting("extra generation arguments", lambda c: None, lambda d: d["generation_kwargs"]),
    Setting("max new tokens", lambda c: c.coordinator.max_tokens, lambda d: d["max_completion_length"]),
    Setting("generation stops at EOS", lambda c: not c.coordinator.ignore_eos, lambda d: True),
    Setting("truncated completions trained on", lambda c: True, lambda d: not d["mask_truncated_completions"]),
    Setting("dynamic sampling", lambda c: c.coordinator.dynamic_sampling, lambda d: False),
    Setting("overlong shaping (tokens)", lambda c: c.coordinator.overlong_buffer_tokens, lambda d: 0),
    Setting("chat template arguments", lambda c: None, lambda d: d["chat_template_kwargs"]),
    Setting("reshuffles the given prompt order", lambda c: False, lambda d: d["shuffle_dataset"]),
    Setting("seed", lambda c: c.run.seed, lambda d: d["seed"]),
)
"""What one step does on each side. Both stop at every EOS id the model declares and train on the EOS token
(vLLM's output keeps it; TRL's mask runs to the first EOS inclusive): code, not config, so not read here."""

KNOWN_DIFFERENCES: dict[str, str] = {
    "generation engine": (
        "ours samples with vLLM, TRL's side with transformers' generate (TRL's vLLM needs a GPU or a server): "
        "the same distribution, different draws; on the same batch the two steps agree "
        "(tests/integration/test_trl_step.py)"
    ),
    "advantage epsilon": (
        "TRL 1.16 divides by (std + 1e-4), a constant of its code, ours by (std + 1e-6): the advantages differ "
        "by ~1e-4 / std of themselves, < 4e-4 for a group of 0/1 rewards with signal (std >= 0.25 up to 16 "
        "samples), ~2 % for one whose rewards differ by a partial score (std 0.005)"
    ),
    "activation recomputation": (
        "TRL's side recomputes activations (gradient_checkpointing, as the reference TRL run; vs_trl.py "
        "--trl-no-gradient-checkpointing turns it off), ours does not on CPU: time and memory, not the gradient"
    ),
}
"""Differences allowed between the two sides on two cores, each with its reason (bench/README.md shows them)."""

KNOWN_DIFFERENCES_GPU: dict[str, str] = {"advantage epsilon": KNOWN_DIFFERENCES["advantage epsilon"]}
"""On a GPU (vs_trl.py --gpu) both sides sample with vLLM and neither recomputes activations."""


def ours_settings(c: RunConfig) -> dict[str, Any]:
    return {s.name: s.ours(c) for s in SETTINGS}


def trl_settings(resolved: dict) -> dict[str, Any]:
    """TRL's side from its resolved GRPOConfig (GRPOConfig.to_dict(): after __post_init__ filled its Nones)."""
    return {s.name: s.trl(resolved) for s in SETTINGS}


def differences(ours: dict[str, Any], trl: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Settings whose values differ, as (ours, TRL's); floats compare to 1e-12 of their size."""

    def same(a: Any, b: Any) -> bool:
        if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool):
            return abs(a - b) <= 1e-12 * max(abs(a), abs(b))
        return a == b

    return {k: (ours[k], trl[k]) for k in ours if not same(ours[k], trl[k])}
