"""The run's shared state, read by the gRPC control API and the HTTP status endpoint."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from protos.grpo.v1 import coordinator_pb2


@dataclass
class RunState:
    run_id: str
    num_steps: int
    state: int = coordinator_pb2.RUN_STATE_IDLE
    step: int = 0
    policy_version: int = 0
    last_metrics: dict[str, float] = field(default_factory=dict)
    last_eval: dict[str, float] = field(default_factory=dict)
    """The latest held-out metrics (eval/*) and the step they were measured at."""
    last_samples: list[dict] = field(default_factory=list)
    """The latest step's (or evaluation's) sample completions, as in samples.jsonl."""
    alerts: list[dict] = field(default_factory=list)
    """Collapse warnings (alerts.CollapseMonitor.status): each signal's last warning, and whether it still fires."""
    pipeline: dict = field(default_factory=dict)
    """Asynchronous GRPO's (coordinator.max_staleness >= 1): prompts queued, complete groups waiting by the version
    that sampled them, and how many groups were trained at each staleness so far (AsyncBatches.status)."""
    error: str = ""
    num_rollout_workers: int = 1
    """Rollout workers wanted: rollout.num_workers at start, then ScaleRollout's; the launcher reconciles to it."""
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def to_proto(self) -> coordinator_pb2.RunStatus:
        with self.lock:
            return coordinator_pb2.RunStatus(
                run_id=self.run_id,
                state=self.state,
                step=self.step,
                num_steps=self.num_steps,
                policy_version=self.policy_version,
                last_metrics=self.last_metrics,
                error=self.error,
                num_rollout_workers=self.num_rollout_workers,
            )

    def to_json(self) -> dict:
        with self.lock:
            return {
                "run_id": self.run_id,
                "state": coordinator_pb2.RunState.Name(self.state).removeprefix("RUN_STATE_").lower(),
                "step": self.step,
                "num_steps": self.num_steps,
                "policy_version": self.policy_version,
                "last_metrics": dict(self.last_metrics),
                "last_eval": dict(self.last_eval),
                "samples": list(self.last_samples),
                "alerts": list(self.alerts),
                "error": self.error,
                "num_rollout_workers": self.num_rollout_workers,
                **({"pipeline": dict(self.pipeline)} if self.pipeline else {}),
            }
