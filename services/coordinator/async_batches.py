"""Asynchronous GRPO's batch source (coordinator.max_staleness = eta >= 1): prompt work stays queued ahead, so the
rollout workers generate while the trainer trains, and a batch is the oldest complete groups sampled by a version at
most eta behind the one it trains."""

from __future__ import annotations

import logging
import time
from collections import Counter

from protos.grpo.v1 import queue_pb2
from services.common.config import RunConfig
from services.common.queue import WorkQueue
from services.common.tasks import Prompt

from .batches import Batch, StepFailed, SyncBatches
from .feed import PromptFeed
from .refits import Refits
from .state import RunState

log = logging.getLogger(__name__)


def staleness(trained_version: int, sampled_version: int) -> int:
    """Versions between the policy a group was sampled by and the one it trains (AReaL's off-policyness)."""
    return trained_version - sampled_version


class AsyncBatches(SyncBatches):
    """Keeps (1 + eta) x num_prompts prompts in the pipeline (queued, being generated, or complete and not yet
    trained): while a step trains, eta batches' worth is generated at the versions the engines hold.

    Groups are used oldest first; one whose version is more than eta behind the version being trained is dropped
    and counted (never trained on), as is a group a worker rejected, and the pipeline is topped up in their place.
    Prompts in the pipeline when a checkpoint is taken are saved with it (`pending`) and enqueued first on resume:
    a resumed run neither skips them nor trains twice what it trained already."""

    def __init__(self, cfg: RunConfig, queue: WorkQueue, feed: PromptFeed, state: RunState, refits: Refits):
        super().__init__(cfg, queue, feed, state, refits)
        self.max_staleness = cfg.coordinator.max_staleness
        self.cursor: str | None = None
        """The trajectory stream read so far; None until the first batch."""
        self.queued: dict[tuple[int, int], queue_pb2.PromptWork] = {}
        """Prompt work enqueued and not yet back, by (step, prompt_index)."""
        self.prompts: dict[tuple[int, int], Prompt] = {}
        """The prompt of each queued work item."""
        self.ready: list[tuple[Prompt, queue_pb2.TrajectoryGroup]] = []
        """Complete groups not yet trained on, oldest first."""
        self._index_step, self._next_index = -1, 0
        self._clocks_seen: dict[tuple[str, str], float] = {}
        self.trained_staleness: Counter[int] = Counter()
        self.num_stale = 0

    def read_cursor(self) -> str:
        return self.cursor or ""

    def pending(self) -> list[Prompt]:
        return self.resumed + [self.prompts[k] for k in sorted(self.prompts)] + [p for p, _ in self.ready]

    def take(self, step: int) -> Batch:
        start, c = time.perf_counter(), self.cfg.coordinator
        deadline = time.monotonic() + c.batch_timeout_s
        if self.cursor is None:
            self.cursor = self.queue.trajectories_tail()
        rejected = stale = refilled = 0
        refill_budget = c.dynamic_sampling_max_extra * c.num_prompts if self.has_signal else 0
        batch: list[tuple[Prompt, queue_pb2.TrajectoryGroup]] = []
        while True:
            kept = []
            for prompt, g in self.ready:
                if staleness(self.policy_version, g.policy_version) > self.max_staleness:
                    stale += 1
                    log.info("step %d: a group of policy version %d dropped, more than %d behind version %d",
                             step, g.policy_version, self.max_staleness, self.policy_version)  # fmt: skip
                elif refilled < refill_budget and not self.has_signal(g):
                    refilled += 1  # DAPO's dynamic sampling: the top-up below brings another prompt's group
                else:
                    kept.append((prompt, g))
            need = c.num_prompts - len(batch)
            batch, self.ready = batch + kept[:need], kept[need:]
            if len(batch) == c.num_prompts:
                break
            self._top_up(step, len(batch))
            if self.state.stop.is_set():
                raise StepFailed("run stopped while collecting trajectories")
            if time.monotonic() > deadline:
                raise StepFailed(
                    f"step {step}: {len(batch)}/{c.num_prompts} groups after coordinator.batch_timeout_s="
                    f"{c.batch_timeout_s}s; {self._who_works()}"
                )
            self.refits.catch_up_joiners(self.policy_version)
            rejected += self._read(step)
        waited_s = time.perf_counter() - start
        self._top_up(step, c.num_prompts)  # eta batches' work, generated while this one trains
        ages = [staleness(self.policy_version, g.policy_version) for _, g in batch]
        self.trained_staleness.update(ages)
        self.num_stale += stale
        self.status()
        groups = [g for _, g in batch]
        return Batch([p for p, _ in batch], groups, rejected + stale, waited_s, ages, stale, refilled)

    def status(self) -> None:
        """What /status shows of the pipeline."""
        waiting = Counter(g.policy_version for _, g in self.ready)
        pipeline = {
            "max_staleness": self.max_staleness,
            "prompts_queued": len(self.queued),
            "groups_waiting_by_version": {str(v): n for v, n in sorted(waiting.items())},
            "trained_groups_by_staleness": {str(a): n for a, n in sorted(self.trained_staleness.items())},
            "dropped_stale": self.num_stale,
        }
        with self.state.lock:
            self.state.pipeline = pipeline

    def _read(self, step: int) -> int:
        """Move the groups that came back from `queued` to `ready`; returns how many were rejected by a worker."""
        self.cursor, groups = self.queue.read_trajectories(self.cursor, block_ms=500)
        rejected = 0
        for g in groups:
            key = (g.step, g.prompt_index)
            work = self.queued.get(key)
            # Another run's group, a held-out one, or the second copy of a re-leased item (the first one won).
            if g.run_id != self.state.run_id or g.eval or work is None or g.prompt_ids != work.prompt_ids:
                continue
            prompt = self.prompts.pop(key)
            del self.queued[key]
            if not g.trajectories:
                log.warning("step %d: prompt %s dropped, rejected by %s: %s", step, key, g.worker_id, g.error)
                rejected += 1
            else:
                self.ready.append((prompt, g))
        return rejected

    def _top_up(self, step: int, in_batch: int) -> None:
        """Enqueue prompts until (1 + eta) x num_prompts are in the pipeline, the current batch's counted: while a
        batch trains, eta batches' worth is generated, to be trained at most eta versions later."""
        c = self.cfg.coordinator
        missing = (1 + self.max_staleness) * c.num_prompts - in_batch - len(self.queued) - len(self.ready)
        if missing <= 0:
            return
        prompts = self.next_prompts(missing)
        if self._index_step != step:
            self._index_step, self._next_index = step, 0
        items = []
        for p in prompts:
            key = (step, self._next_index)
            self._next_index += 1
            items.append(self._work(step, key[1], p, c.num_samples, c.temperature))
            self.queued[key], self.prompts[key] = items[-1], p
        self.queue.enqueue(items)

    def async_metrics(self, batch: Batch) -> dict[str, float]:
        ages = batch.staleness or [0]
        return {
            "async/staleness_mean": sum(ages) / len(ages),
            "async/staleness_max": float(max(ages)),
            "async/dropped_stale": float(batch.num_stale),
            "async/trainer_idle_s": batch.generation_s,
            **self._rollout_clocks(),
        }

    def _rollout_clocks(self) -> dict[str, float]:
        """async/rollout_idle_s and async/rollout_pause_s: seconds the workers together spent without work, and
        with generation stopped for an in-flight load, since the last call, from the clocks in their heartbeats (a
        beat a second: the figures lag by up to that). A restarted worker's clocks start again."""
        beats = self.queue.workers()
        out = {}
        for clock in ("idle_s", "pause_s"):
            total = 0.0
            for worker, beat in beats.items():
                now = beat.get(clock)
                if not isinstance(now, int | float):
                    continue
                seen = self._clocks_seen.get((worker, clock))
                if seen is not None:
                    total += now - seen if now >= seen else now
                self._clocks_seen[(worker, clock)] = now
            out[f"async/rollout_{clock}"] = total
        return out
