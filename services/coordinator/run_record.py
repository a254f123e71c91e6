"""The run record: every file a run writes into its folder, and the coordinator's part of a resumable checkpoint
(resume/step_N/run_state.json beside the trainer's train_state/), written atomically and read back on resume."""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .refits import Refit

log = logging.getLogger(__name__)

APPENDED = ("metrics.jsonl", "samples.jsonl", "batches.jsonl", "refits.jsonl")
"""Files the run appends to every step: a checkpoint holds their sizes, and a resumed run cuts them back to those
sizes first, so rows written after the checkpoint (by the run that died) appear once, when the step is redone."""

RESUME_DIR = "resume"
EXPORT_DIR = "checkpoints"
"""The HF exports of run.save_every: checkpoints/step_N."""
RUN_STATE = "run_state.json"
"""Written last into a checkpoint folder: a checkpoint without it is incomplete and never resumed from."""


@dataclass
class CoordinatorState:
    """What the coordinator needs to continue a run exactly where a checkpoint left it."""

    step: int
    policy_version: int
    data_cursor: int
    """Training prompts handed out: the feed's order is a pure function of (run.seed, cursor)."""
    train_s: float
    """Seconds of training so far, what run.train_minutes budgets."""
    wall_s: float
    """Wall seconds of the run so far: time/wall_s continues from here."""
    last_eval: dict[str, float] = field(default_factory=dict)
    offsets: dict[str, int] = field(default_factory=dict)
    """Size in bytes of each APPENDED file when the checkpoint was taken."""
    num_rollout_workers: int = 0
    """Rollout workers wanted (ScaleRollout's count) when the checkpoint was taken; 0 = rollout.num_workers."""
    pending_prompts: list[dict] = field(default_factory=list)
    """Prompts handed out before data_cursor and not yet trained on (asynchronous GRPO's pipeline), as
    tasks.Prompt fields: a resumed run enqueues them first."""


class RunRecord:
    """The run folder: its appended files, its resumable checkpoints, and the checkpoints.jsonl that lists both
    those and the HF exports."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir

    def offsets(self) -> dict[str, int]:
        return {name: _size(self.run_dir / name) for name in APPENDED}

    def cut_back(self, offsets: dict[str, int]) -> None:
        """Truncate each appended file to its checkpointed size (a file the checkpoint did not know is emptied)."""
        for name in APPENDED:
            path = self.run_dir / name
            if path.exists():
                os.truncate(path, min(offsets.get(name, 0), path.stat().st_size))

    def checkpoint_dir(self, step: int) -> Path:
        return self.run_dir / RESUME_DIR / f"step_{step}"

    def write_state(self, folder: Path, state: CoordinatorState) -> None:
        """run_state.json into a checkpoint folder the trainer has completed: written, flushed to disk, renamed,
        so the folder counts as complete only once every byte of it is on disk."""
        tmp = folder / f"{RUN_STATE}.tmp"
        with tmp.open("w") as f:
            json.dump(asdict(state), f)
            f.flush()
            os.fsync(f.fileno())
        for path in (p for p in folder.rglob("*") if p.is_file() and p != tmp):
            _fsync(path)  # the trainer's files: its rename made them visible, not durable
        tmp.rename(folder / RUN_STATE)
        _fsync(folder)

    def complete_checkpoints(self) -> list[Path]:
        """Complete resumable checkpoints, oldest first."""
        root = self.run_dir / RESUME_DIR
        found = [p for p in root.glob("step_*") if (p / RUN_STATE).is_file()] if root.is_dir() else []
        return sorted(found, key=_step_of)

    def latest(self) -> tuple[Path, CoordinatorState] | None:
        """The newest checkpoint whose run_state.json reads back; one that does not (a damaged disk, an edit by
        hand) is skipped with a warning, so the run resumes from the one before."""
        for folder in reversed(self.complete_checkpoints()):
            try:
                return folder, CoordinatorState(**json.loads((folder / RUN_STATE).read_text()))
            except (OSError, ValueError, TypeError) as e:
                log.warning("%s is unreadable (%s): skipped", folder / RUN_STATE, e)
        return None

    def prune(self, keep: int) -> None:
        """Keep the newest `keep` complete checkpoints; drop older ones and any incomplete one older than those."""
        complete = self.complete_checkpoints()
        if not complete:
            return
        oldest_kept = _step_of(complete[-keep:][0])
        root = self.run_dir / RESUME_DIR
        for folder in root.iterdir():
            if _step_of(folder) < oldest_kept:
                shutil.rmtree(folder, ignore_errors=True)

    def note_batch(self, step: int, trajectory_ids: list[str]) -> None:
        """batches.jsonl: the trajectory ids of each training batch."""
        self._append("batches.jsonl", {"step": step, "trajectory_ids": trajectory_ids})

    def note_refit(self, step: int, refit: Refit) -> None:
        """refits.jsonl: each refit's checksums, and where its seconds went: the trainer's gather, its publish
        (send, the engines' loads, verification) and each engine's LoadWeights."""
        r = refit.reply
        self._append(
            "refits.jsonl",
            {
                "step": step,
                "policy_version": r.policy_version,
                "checksum": r.checksum,
                "received_checksums": dict(r.received_checksums),
                "num_readback_verified": r.num_readback_verified,
                "payload_bytes": r.payload_bytes,
                "refit_s": refit.seconds,
                "gather_s": r.gather_s,
                "publish_s": r.publish_s,
                "apply_s": dict(r.apply_s),
            },
        )

    def note_checkpoint(self, record: dict) -> None:
        """checkpoints.jsonl: the HF exports and the resumable checkpoints."""
        self._append("checkpoints.jsonl", record)

    def _append(self, name: str, record: dict) -> None:
        with (self.run_dir / name).open("a") as f:
            f.write(json.dumps(record) + "\n")

    def export_dir(self, step: int) -> Path:
        return self.run_dir / EXPORT_DIR / f"step_{step}"

    def forget_checkpoints_after(self, step: int) -> None:
        """What the steps a resumed run is about to redo left behind: their checkpoints.jsonl entries, their HF
        exports and any resumable checkpoint of theirs (incomplete, or the resume would have started there). The
        redone steps write them again; left in place, a redone step's save found its folder taken and failed."""
        path = self.run_dir / "checkpoints.jsonl"
        if path.exists():
            rows = [line for line in path.read_text().splitlines() if line.strip()]
            path.write_text("".join(line + "\n" for line in rows if json.loads(line)["step"] <= step))
        for root in (self.run_dir / EXPORT_DIR, self.run_dir / RESUME_DIR):
            for folder in root.glob("step_*") if root.is_dir() else ():
                if _step_of(folder) > step:
                    log.info("%s: of a step the resumed run redoes (after step %d), removed", folder, step)
                    shutil.rmtree(folder, ignore_errors=True)


def _step_of(folder: Path) -> int:
    # step_N and its trainer staging sibling step_N.partial
    digits = folder.name.removeprefix("step_").split(".")[0]
    return int(digits) if digits.isdigit() else -1


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
