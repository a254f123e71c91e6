"""The placement as the table every launcher prints before anything starts (all of `make up DRY_RUN=1`)."""

from __future__ import annotations

from .gpus import gpu_list
from .types import Placement


def format_placement(placement: Placement) -> str:
    """One row per service: node(s), host, GPUs, ports; then Redis and the status URL."""
    c = placement.cluster
    lines = [
        f"plan of run {placement.cfg.run.run_id}: {c.backend}, {len(c.nodes)} node(s), "
        f"{c.gpus_per_node} GPU(s) per node, device {placement.device}",
        f"  {'service':<12} {'node(s)':<24} {'host':<20} {'GPUs':<10} ports",
    ]
    for a in placement.assignments:
        gpus = gpu_list(a.gpus) if a.gpus else "-"
        ports = ", ".join(f"{name} {port}" for name, port in a.ports.items())
        lines.append(f"  {a.service:<12} {','.join(a.nodes):<24} {a.host:<20} {gpus:<10} {ports}")
    redis = placement.cfg.redis.url + ("" if placement.start_redis else " (external)")
    lines += [f"redis: {redis}", f"status: {placement.status_url}"]
    return "\n".join(lines)
