"""redis and placement: where the queue and the services run."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import _Section


class RedisSection(_Section):
    url: str = ""
    """redis:// URL of a running server; empty = start one locally on `port`."""
    port: int = Field(default=0, ge=0, le=65535)
    """Port of the locally started server; 0 = a free port chosen at launch."""
    prompts_stream: str = "prompts"
    """Stream of prompt work items."""
    trajectories_stream: str = "trajectories"
    """Stream of scored trajectory groups."""


class PlacementSection(_Section):
    """Where `make run` and `make up` put trainer ranks and rollout workers: this machine, a Slurm allocation or a
    Docker host (deploy/placement/)."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto = one GPU per trainer rank and per rollout worker where the allocation has GPUs, else CPU."""
    trainer_nodes: list[str | int] = []
    """Nodes of the trainer ranks, as host names or indices into the allocation; empty = an even split."""
    rollout_nodes: list[str | int] = []
    """Nodes of the rollout workers (round robin), as host names or indices; empty = an even split."""
    num_nodes: int = Field(default=1, ge=1)
    """Nodes a batch job submitted by `make up` asks for; inside an allocation its own nodes are used."""
    gpus_per_node: int = Field(default=0, ge=0)
    """GPUs per node a submitted batch job asks for; 0 = none."""
    trainer_rdzv_port: int = Field(default=0, ge=0, le=65535)
    """torchrun rendezvous port when the trainer spans nodes; 0 = a free port chosen at launch."""
