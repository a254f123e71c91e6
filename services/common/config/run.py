"""run: the run as a whole (its folder, steps, evaluation, checkpoints, resume)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import _Section


class RunSection(_Section):
    run_id: str = ""
    """Name of the run; empty = a timestamp. Output goes to `<output_dir>/<run_id>/`."""
    output_dir: str = "runs"
    """Folder that holds one subfolder per run."""
    num_steps: int = Field(default=50, ge=1)
    """GRPO steps to run before stopping."""
    seed: int = 0
    """Seed of prompt sampling, model creation and sampling."""
    train_minutes: float = Field(default=0.0, ge=0)
    """A time budget: the step during which the run's training time (its steps' timing/total_s, evaluations
    excluded) passes this many minutes is the last one, and it evaluates and saves as a last step does;
    0 = run.num_steps only."""
    eval_every: int = Field(default=10, ge=0)
    """Evaluate the held-out prompts every this many steps (and at step 0 and the last step); 0 = only those two."""
    eval_k: int = Field(default=0, ge=0)
    """Samples per held-out prompt for eval/pass@k (at coordinator.temperature); 0 = greedy accuracy only."""
    samples_per_step: int = Field(default=4, ge=0)
    """Completions of each step (and of each evaluation) written to samples.jsonl and shown on /status."""
    loggers: list[Literal["tensorboard", "wandb"]] = []
    """Experiment trackers that get every metrics row: tensorboard (event files in <run>/tensorboard) and wandb
    (offline in <run>/wandb unless WANDB_MODE is set; `wandb sync` uploads it). metrics.jsonl is always written."""
    save_every: int = Field(default=0, ge=0)
    """Export the policy as an HF folder (checkpoints/step_N) every this many steps, and always at the end."""
    checkpoint_every: int = Field(default=10, ge=0)
    """Save the run's whole state (the trainer's weights, optimizer, lr-schedule clock and RNG; the coordinator's
    step, policy version, data cursor and eval history; the offsets of every file the run writes) under
    resume/step_N every this many steps, at the end and when the run is stopped; 0 = only those two."""
    keep_checkpoints: int = Field(default=2, ge=1)
    """Resumable checkpoints (resume/step_N) kept; older ones are deleted once a newer one is complete. The HF
    exports of run.save_every are never deleted."""
    locked: bool = True
    """Every state-changing call, Redis and the streams need the run's secret (runs/<id>/run.secret; see
    docs/architecture.md, "Who may change a run"). false: no secret is written, and anyone on the host can stop, steer
    or poison the run; for measuring what the locks cost (bench/step_ab.py), or on a machine of one's own. A
    run started locked stays locked."""
    tls: bool = False
    """gRPC over mutual TLS: the launcher makes a CA and a certificate for the run in runs/<id>/tls/ and every service
    serves and calls with them (services/common/tls.py), so a neighbour on the network can neither read a call nor
    open a connection. For runs across machines; on one, every listener is on 127.0.0.1. Needs run.locked. Redis,
    the status endpoint and the weights' data path (gloo, ucxx) stay plaintext: see docs/architecture.md."""
    max_restarts: int = Field(default=3, ge=0)
    """Times `make run` resumes the run from its newest checkpoint by itself after the trainer, weightsync or the
    coordinator died, and restarts a dead Redis in place (from its append-only file; rollout workers are restarted
    alone, see rollout.max_restarts); then a death ends the run with one line naming the process and the command
    that resumes it. 0 = a death ends the run."""
    resume: str = ""
    """A run folder (`runs/<id>`) to continue from its newest complete checkpoint: its config.toml is the base
    (the overrides given with run.resume apply on top), and its run_id and output_dir are kept."""
