"""What `make up` started, one JSON file per launch under `<output_dir>/.up/`, so `make down` can stop it."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

# `make down` stops launchers before the batch jobs that hold them, so they get to stop their services.
KINDS = ("local", "docker", "slurm", "sbatch")


def write(output_dir: str | Path, kind: str, run_id: str, **fields) -> Path:
    assert kind in KINDS, kind
    path = Path(output_dir) / ".up" / f"{run_id}.{kind}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"kind": kind, "run_id": run_id, "host": socket.gethostname(), "pid": os.getpid(), **fields}
    path.write_text(json.dumps(record, indent=1))
    return path


def read_all(output_dir: str | Path) -> list[tuple[Path, dict]]:
    """Every record, launchers first."""
    found = [(p, json.loads(p.read_text())) for p in (Path(output_dir) / ".up").glob("*.json")]
    return sorted(found, key=lambda pr: (KINDS.index(pr[1]["kind"]), pr[1]["run_id"]))


def remove(path: Path) -> None:
    path.unlink(missing_ok=True)
