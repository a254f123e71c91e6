"""What `make up` started, one JSON file per launch under `<output_dir>/.up/`, so `make down` can stop it."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

from .launchers import STOP_ORDER as KINDS


def write(output_dir: str | Path, kind: str, run_id: str, **fields) -> Path:
    assert kind in KINDS, kind
    path = Path(output_dir) / ".up" / f"{run_id}.{kind}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"kind": kind, "run_id": run_id, "host": socket.gethostname(), "pid": os.getpid(), **fields}
    path.write_text(json.dumps(record, indent=1))
    return path


def read_all(output_dir: str | Path) -> list[tuple[Path, dict]]:
    """Every record, launchers first. One that is not a launcher's record (unreadable, or of no launcher's kind) is
    named on stderr and left where it is."""
    found = []
    for path in (Path(output_dir) / ".up").glob("*.json"):
        try:
            record = json.loads(path.read_text())
            if record.get("kind") not in KINDS or not isinstance(record.get("run_id"), str):
                raise ValueError(f"kind {record.get('kind')!r} is none of {', '.join(KINDS)}")
        except (OSError, ValueError, AttributeError) as e:
            print(f"{path}: not a record of `make up` ({e}); left as it is", file=sys.stderr)
            continue
        found.append((path, record))
    return sorted(found, key=lambda pr: (KINDS.index(pr[1]["kind"]), pr[1]["run_id"]))


def remove(path: Path) -> None:
    path.unlink(missing_ok=True)
