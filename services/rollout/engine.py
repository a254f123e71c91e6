"""The engine seam: generation with per-token logprobs and in-place weight loading."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from protos.grpo.v1 import queue_pb2


@dataclass(frozen=True, slots=True)
class Sample:
    token_ids: list[int]
    logprobs: list[float]
    """Logprob of each sampled token under the distribution it was sampled from (logits / temperature)."""
    finish_reason: str
    versions: list[int] = field(default_factory=list)
    """The policy version that sampled each token, where the engine ran between_steps (in-flight updates)."""


BetweenSteps = Callable[[], int]
"""Called by an engine that can between its decode steps: may load new weights; returns the version in force."""


class EngineDead(RuntimeError):
    """The engine failed part way through a generation (not a request it refused up front): its state is unknown,
    and with vLLM in-process the next call hangs. The worker exits on it; its supervisor starts a fresh one and
    the work it held goes back to the queue when its lease ends."""


@dataclass(frozen=True, slots=True)
class Request:
    """One prompt and how to sample it; a generate call takes many, each with its own parameters."""

    prompt_ids: list[int]
    num_samples: int
    sampling: queue_pb2.SamplingParams


class Engine(Protocol):
    dtype: torch.dtype
    """Dtype of the floating weights, which refits should arrive in (registered with weightsync)."""

    def generate(self, requests: list[Request], between_steps: BetweenSteps | None = None) -> list[list[Sample]]:
        """The samples of each request, in order; temperature 0 is greedy. An engine that can calls between_steps
        after each decode step (and once before the first), where weights may be loaded, and records per token the
        version it returned; one that cannot ignores it. A request it refuses (too long, a token id past the vocabulary)
        raises before anything is generated; a failure after that raises EngineDead."""

    def load_weights(self, named: list[tuple[str, torch.Tensor]]) -> None:
        """Replace the weights in place (HF names); the engine keeps running. The tensors may be views of the
        sender's memory (cuda_ipc), valid during the call only: copy them, keep no reference."""

    def read_weights(self) -> dict[str, torch.Tensor]:
        """The weights the engine holds (views, not copies), in HF names, where it lets them be read."""

    def sleep(self) -> None:
        """Free what the engine can while it has no work (the trainer trains); the next call wakes it."""
