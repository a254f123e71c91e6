"""Resumable checkpoints of a run: the trainer's sharded state and the coordinator's, saved together and restored
together, so a resumed run trains what an uninterrupted one would have."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from protos.grpo.v1 import trainer_pb2, trainer_pb2_grpc
from services.common.config import RunConfig

from .run_record import CoordinatorState, RunRecord

log = logging.getLogger(__name__)


class Checkpoints:
    def __init__(self, cfg: RunConfig, trainer: trainer_pb2_grpc.TrainerStub, record: RunRecord):
        self.cfg, self.trainer, self.record = cfg, trainer, record
        self.last_step = -1
        """Step of the newest complete checkpoint of this run (-1: none yet)."""
        self.pending_load: Path | None = None
        """A checkpoint whose trainer state is still to be loaded: the resumed run's first act."""

    def due(self, step: int, last_step: int) -> bool:
        every = self.cfg.run.checkpoint_every
        return step == last_step or bool(every and step % every == 0)

    def save(self, state: CoordinatorState) -> dict[str, float]:
        """The trainer's state (Save without weights_only), then the coordinator's; older ones pruned."""
        start = time.perf_counter()
        folder = self.record.checkpoint_dir(state.step)
        reply = self.trainer.Save(
            trainer_pb2.SaveRequest(path=str(folder.resolve()), weights_only=False),
            timeout=self.cfg.coordinator.rpc_timeout_s,
        )
        assert reply.policy_version == state.policy_version, (reply.policy_version, state.policy_version)
        self.record.write_state(folder, state)
        seconds = time.perf_counter() - start
        num_bytes = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        self.record.note_checkpoint(
            {"step": state.step, "policy_version": state.policy_version, "path": str(folder.resolve()),
             "resumable": True, "seconds": seconds, "bytes": num_bytes}
        )  # fmt: skip
        self.record.prune(self.cfg.run.keep_checkpoints)
        self.last_step = state.step
        log.info("checkpoint of step %d in %s: %.2fs, %.1f MB", state.step, folder, seconds, num_bytes / 1e6)
        return {"checkpoint/seconds": seconds, "checkpoint/bytes": float(num_bytes)}

    def restore(self) -> CoordinatorState:
        """The newest complete checkpoint of the run folder: the appended files cut back to it, its trainer state
        marked to load when the run starts. Raises ValueError when the folder holds none."""
        found = self.record.latest()
        if found is None:
            raise ValueError(f"run.resume: {self.record.run_dir} holds no complete checkpoint (resume/step_N)")
        folder, state = found
        self.record.cut_back(state.offsets)
        self.record.forget_checkpoints_after(state.step)
        self.pending_load, self.last_step = folder, state.step
        log.info("resuming from %s: step %d, policy version %d", folder, state.step, state.policy_version)
        return state

    def load_pending(self, publish: Callable[[], object]) -> None:
        """Trainer.Load of the checkpoint being resumed from, then a refit so every engine holds those weights."""
        if self.pending_load is None:
            return
        timeout_s = self.cfg.coordinator.rpc_timeout_s
        reply = self.trainer.Load(trainer_pb2.LoadRequest(path=str(self.pending_load.resolve())), timeout=timeout_s)
        publish()
        log.info("trainer restored to policy version %d and the engines refitted", reply.policy_version)
        self.pending_load = None
