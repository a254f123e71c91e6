"""Which nodes the trainer ranks and the rollout workers get, from the placement section."""

from __future__ import annotations

from services.common.config import RunConfig

from .gpus import colocated
from .types import PlacementError


def split_nodes(cfg: RunConfig, nodes: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """Trainer and rollout nodes as the placement section names them; one left empty gets the nodes the
    other does not use (all nodes if none is left); both empty = first half trainer, second half rollout.

    Colocated (see gpus.colocated), the rollout workers go where trainer rank 0 is: its first node."""
    trainer = _named(cfg.placement.trainer_nodes, nodes, "placement.trainer_nodes")
    rollout = _named(cfg.placement.rollout_nodes, nodes, "placement.rollout_nodes")
    if colocated(cfg):
        return _colocated_split(nodes, trainer, rollout)
    if not trainer and not rollout:
        half = max(1, len(nodes) // 2)
        return list(nodes[:half]), list(nodes[half:]) or list(nodes)
    if not trainer:
        trainer = [n for n in nodes if n not in rollout] or list(nodes)
    if not rollout:
        rollout = [n for n in nodes if n not in trainer] or list(nodes)
    return _in_order(nodes, trainer), _in_order(nodes, rollout)


def _colocated_split(nodes: tuple[str, ...], trainer: list[str], rollout: list[str]) -> tuple[list[str], list[str]]:
    trainer = _in_order(nodes, trainer or list(nodes))
    if rollout and rollout != trainer[:1]:
        raise PlacementError(
            f"weightsync.transport = 'cuda_ipc' puts every rollout worker on trainer rank 0's GPU, on node "
            f"{trainer[0]}: leave placement.rollout_nodes empty or set it to [{trainer[0]!r}]"
        )
    return trainer, trainer[:1]


def _in_order(nodes: tuple[str, ...], chosen: list[str]) -> list[str]:
    # Allocation order: Slurm gives node rank 0 of a multi-node step to the first of its nodes in that order.
    return [n for n in nodes if n in chosen]


def _named(entries: list[str | int], nodes: tuple[str, ...], key: str) -> list[str]:
    out = []
    for entry in entries:
        if isinstance(entry, int):
            if not 0 <= entry < len(nodes):
                raise PlacementError(f"{key}: index {entry} is outside the allocation's {len(nodes)} nodes")
            entry = nodes[entry]
        elif entry not in nodes:
            raise PlacementError(f"{key}: node {entry!r} is not in the allocation ({', '.join(nodes)})")
        if entry in out:
            raise PlacementError(f"{key}: node {entry!r} is listed twice")
        out.append(entry)
    return out


def ranks_per_node(cfg: RunConfig, trainer_nodes: list[str]) -> int:
    # torchrun starts the same number of ranks on every node it spans.
    num_ranks, num_nodes = cfg.trainer.num_ranks, len(trainer_nodes)
    if num_ranks % num_nodes:
        raise PlacementError(f"trainer.num_ranks = {num_ranks} does not split evenly over {num_nodes} trainer nodes")
    return num_ranks // num_nodes
