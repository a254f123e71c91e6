"""What every result file says about how it was made: the command, the machine and the commit.

from provenance import stamp, write_result
write_result(out, figures)     # adds the stamp; or result |= stamp() where a script writes its file itself
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def command(argv: list[str] | None = None) -> str:
    """The command line that ran this script, as run from the repo root."""
    argv = sys.argv if argv is None else argv
    return "python " + shlex.join([f"bench/{Path(argv[0]).name}", *argv[1:]])


def _gpus() -> str:
    """The GPUs nvidia-smi names: not torch, which would open a CUDA context in a process that holds none while the
    services it measures run."""
    query = ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"]
    try:
        names = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
    except (OSError, subprocess.TimeoutExpired):
        return "no GPU"
    return f"{len(names)}x {names[0]}" if names else "no GPU"


def machine() -> str:
    """Architecture, the cores this process may use, Python, and the GPUs (or none)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{platform.machine()}, {cores} cores, Python {platform.python_version()}, {_gpus()}"


def commit() -> str:
    """The commit the code was at ("+dirty" where files differed from it), or "" outside a git checkout (the GPU
    machine gets the working tree without .git)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True)
        if head.returncode != 0:
            return ""
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True).stdout.strip()  # fmt: skip
    except OSError:
        return ""
    return head.stdout.strip() + ("+dirty" if dirty else "")


def stamp(argv: list[str] | None = None) -> dict[str, str]:
    return {"command": command(argv), "machine": machine(), "commit": commit()}


def write_result(path: str | Path, result: dict) -> Path:
    """The result as indented JSON at path (its folder made), with the stamp's keys where the result lacks them."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**stamp(), **result}, indent=2) + "\n")
    return path
