"""coordinator: the GRPO step (sampling, advantages, batches) and its collapse alerts."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import _Section


class AlertsSection(_Section):
    """When the run warns of a collapse (services/coordinator/alerts.py): in the log, as alert/<signal> metrics and
    on /status."""

    eval_drop: float = Field(default=0.10, ge=0)
    """Warn when eval/accuracy falls this far (absolute) below the run's first evaluation: the collapses seen on
    2 prompts x 4 samples fell 13-29 points within 10-20 steps, a steady run stays within ~5 of its start."""
    eval_drop_stderrs: float = Field(default=2.0, ge=0)
    """...or this many binomial standard errors of one evaluation at the first accuracy, when that is more: 0.048 at
    100 prompts and 0.35 accuracy (two: 0.095, so eval_drop decides), 0.11 at 20 prompts (two: 0.21)."""
    shift_z: float = Field(default=5.0, gt=0)
    """Warn when a step's value lies this many running standard deviations from its running mean (the spread comes
    from ~40 steps' worth of memory, so it is itself off by ~10-20 %: 4 gave a false warning in 4,000 steady
    steps of 8 completions; the collapses seen moved 7-10 of them at once)..."""
    entropy_min_shift: float = Field(default=0.3, ge=0)
    """...and at least this fraction of the running mean away (response/neg_logprob, the sampled tokens' entropy)..."""
    length_min_shift: float = Field(default=0.3, ge=0)
    """...or this fraction of the running mean away (avg_generated_tokens)..."""
    eos_min_shift: float = Field(default=0.25, ge=0, le=1)
    """...or this far in absolute terms (response/eos_frac)..."""
    eos_tail_p: float = Field(default=1e-4, gt=0, le=1)
    """...and, with the step's number of completions known, only when a count of EOS endings that far out has at most
    this chance under the running share (a binomial tail): a few completions' share jumps by chance far more often
    than a normal z says (at 8 a step and a share of 0.22, 6 EOS come once in ~700 steps), so at 8 a step only all
    8 ending at EOS from a share under ~0.3 warns, at 32 a move of ~0.3."""
    baseline_steps: int = Field(default=20, ge=1)
    """Memory of the running baseline: a plain mean over the first steps, then an exponential average with weight
    1 / baseline_steps, so a slow drift (the completions shortening as the model learns the format) never warns."""
    warmup_steps: int = Field(default=5, ge=1)
    """Steps that only build the baseline: the first steps' estimate of the spread is too noisy to judge by."""


class CoordinatorSection(_Section):
    host: str = "127.0.0.1"
    """Interface the gRPC control API and the HTTP status endpoint bind to."""
    grpc_port: int = Field(default=0, ge=0, le=65535)
    """gRPC control port; 0 = a free port chosen at launch."""
    http_port: int = Field(default=0, ge=0, le=65535)
    """FastAPI status port; 0 = a free port chosen at launch."""
    num_prompts: int = Field(default=16, ge=1)
    """Prompts per GRPO step."""
    num_samples: int = Field(default=8, ge=2)
    """Completions sampled per prompt (the GRPO group)."""
    max_tokens: int = Field(default=128, ge=1)
    """Maximum generated tokens per completion."""
    temperature: float = Field(default=1.0, gt=0.0)
    """Sampling temperature. On-policy at any value: the engines report, and the trainer scores, each token's
    logprob under softmax(logits / temperature), the distribution it was drawn from."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass; only 1.0 is accepted: the trainer cannot score a token under the renormalised
    nucleus, so top_p < 1 would train off-policy with a silently wrong ratio."""
    ignore_eos: bool = False
    """Generate exactly max_tokens, past EOS (only the built-in toy task wants it: it scores fixed-length answers)."""
    advantage: Literal["grpo", "dr_grpo"] = "grpo"
    """Group-relative advantage: grpo ((r - mean) / std within the group) or dr_grpo (r - mean, no std division).
    Unset, it follows trainer.loss.name = "dr_grpo" (the pairing Dr.GRPO's paper uses)."""
    dynamic_sampling: bool = False
    """Train only on groups whose rewards differ (DAPO): an all-equal group has zero advantage everywhere. The step
    replaces each group without signal by a new prompt's (data/refill_groups), up to dynamic_sampling_max_extra."""
    dynamic_sampling_max_extra: int = Field(default=3, ge=0)
    """Extra groups a step may generate to replace groups without signal, in num_prompts (verl's
    max_num_gen_batches - 1); past them the batch is completed with groups without signal (they train nothing)."""
    overlong_buffer_tokens: int = Field(default=0, ge=0)
    """DAPO overlong shaping: the last this many tokens before max_tokens cost up to overlong_penalty; 0 = off."""
    overlong_penalty: float = Field(default=1.0, ge=0)
    """Reward subtracted from a response that reaches max_tokens (with overlong_buffer_tokens > 0)."""
    batch_timeout_s: float = Field(default=600.0, gt=0)
    """A step fails if its batch is not complete within this time."""
    rpc_timeout_s: float = Field(default=600.0, gt=0)
    """Deadline of each Train / PublishWeights call."""
    max_staleness: int = Field(default=0, ge=0)
    """Asynchronous GRPO (AReaL's max_head_offpolicyness): 0 = synchronous steps. With eta >= 1 prompt work stays
    queued ahead, so the workers generate while the trainer trains, and a batch takes complete groups sampled by a
    version at most eta behind the one it trains; older groups are dropped and counted. The loss is then the
    decoupled objective: the clip around the trainer's own (proximal) policy, the sampling policy entering
    through trainer.loss.importance_sampling's truncated weight ("token" unless set)."""
    alerts: AlertsSection = AlertsSection()
    """Thresholds of the collapse warnings."""
