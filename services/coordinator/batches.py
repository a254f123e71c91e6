"""Where a step's batch comes from: the synchronous batch source enqueues a step's prompts at the one policy version
it accepts and collects their groups, dropping what must not be trained on."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from protos.grpo.v1 import queue_pb2
from services.common.config import RunConfig
from services.common.queue import WorkQueue
from services.common.tasks import Prompt

from .feed import PromptFeed
from .refits import Refits
from .state import RunState

log = logging.getLogger(__name__)

MAX_REQUEUES = 3
"""Times a prompt is enqueued again after its group came back sampled by another policy version (a worker that
joined and had not received the current weights yet) before the step goes on without it."""


class StepFailed(RuntimeError):
    """A step could not complete; the message says which part and why."""


@dataclass
class Batch:
    prompts: list[Prompt]
    groups: list[queue_pb2.TrajectoryGroup]
    """One per prompt, in the prompts' order."""
    num_dropped: int
    """Prompts of the step left out: rejected, undeliverable, or only ever sampled by another version."""
    generation_s: float
    """Seconds the step waited for its groups (asynchronous: only what was not generated while the last trained)."""
    staleness: list[int] = field(default_factory=list)
    """Per group: versions between its sampling policy and the one it trains (asynchronous GRPO); empty = all 0."""
    num_stale: int = 0
    """Groups dropped as more than coordinator.max_staleness versions behind (counted in num_dropped too)."""
    num_refilled: int = 0
    """Extra groups generated to replace groups without signal (coordinator.dynamic_sampling)."""


class SyncBatches:
    """Synchronous GRPO: every group of a batch is sampled by `policy_version`, the version all engines hold."""

    def __init__(self, cfg: RunConfig, queue: WorkQueue, feed: PromptFeed, state: RunState, refits: Refits):
        self.cfg, self.queue, self.feed, self.state, self.refits = cfg, queue, feed, state, refits
        self.policy_version = state.policy_version
        """The version every engine holds after the last refit: the only one whose groups are used."""
        self.resumed: list[Prompt] = []
        """A checkpoint's pending prompts (handed out, not trained on), taken before the feed's next ones."""
        self._read_up_to = ""
        self.has_signal: Callable[[queue_pb2.TrajectoryGroup], bool] | None = None
        """With coordinator.dynamic_sampling, whether a group's (shaped) rewards differ; set by the loop."""

    def take(self, step: int) -> Batch:
        start, num_prompts = time.perf_counter(), self.cfg.coordinator.num_prompts
        prompts = self.next_prompts(num_prompts)
        collected = self._generate(step, prompts, 0)
        kept = [(p, g) for p, g in zip(prompts, collected) if g is not None]
        if not kept:
            raise StepFailed(f"step {step}: every prompt was dropped (worker logs say why)")
        num_dropped, refilled = num_prompts - len(kept), 0
        if self.has_signal is not None:
            kept, refilled = self._refill(step, kept)
        return Batch(
            [p for p, _ in kept], [g for _, g in kept], num_dropped, time.perf_counter() - start,
            num_refilled=refilled,
        )  # fmt: skip

    def _generate(self, step: int, prompts: list[Prompt], first_index: int) -> list[queue_pb2.TrajectoryGroup | None]:
        c = self.cfg.coordinator
        items = [self._work(step, first_index + i, p, c.num_samples, c.temperature) for i, p in enumerate(prompts)]
        cursor = self.queue.trajectories_tail()
        self.queue.enqueue(items)
        return self.collect(step, cursor, items)

    def _refill(self, step: int, kept: list[tuple[Prompt, queue_pb2.TrajectoryGroup]]) -> tuple[list, int]:
        """DAPO's dynamic sampling: groups without signal replaced by new prompts' until the batch has num_prompts
        groups with signal or the extra budget is spent; the batch is then completed with groups without signal
        (they train nothing: the loop's advantages leave them out). Returns the batch and the extra groups."""
        c = self.cfg.coordinator
        with_signal = [(p, g) for p, g in kept if self.has_signal(g)]
        without = [(p, g) for p, g in kept if not self.has_signal(g)]
        budget, extra = c.dynamic_sampling_max_extra * c.num_prompts, 0
        while len(with_signal) < c.num_prompts and extra < budget:
            prompts = self.next_prompts(min(c.num_prompts - len(with_signal), budget - extra))
            got = self._generate(step, prompts, c.num_prompts + extra)
            extra += len(prompts)
            for p, g in zip(prompts, got):
                if g is not None:
                    (with_signal if self.has_signal(g) else without).append((p, g))
        return with_signal + without[: max(0, c.num_prompts - len(with_signal))], extra

    def next_prompts(self, k: int) -> list[Prompt]:
        prompts, self.resumed = self.resumed[:k], self.resumed[k:]
        return prompts + self.feed.take(k - len(prompts))

    def read_cursor(self) -> str:
        """The trajectory stream up to here is read and used: it may be trimmed."""
        return self._read_up_to

    def pending(self) -> list[Prompt]:
        """Prompts taken from the feed and not yet trained on or dropped: what a checkpoint must hand out again."""
        return list(self.resumed)

    def held_out(self, step: int, prompts: list[Prompt], k: int) -> list[queue_pb2.TrajectoryGroup | None]:
        """Greedy groups of the held-out prompts, then (k > 0) k samples each at the run's temperature."""
        n, items = len(prompts), []
        for i, p in enumerate(prompts):
            runs = [(i, 1, 0.0)] + ([(n + i, k, self.cfg.coordinator.temperature)] if k else [])
            items += [self._work(step, index, p, num, temperature, held_out=True) for index, num, temperature in runs]
        cursor = self.queue.trajectories_tail()
        self.queue.enqueue(items)  # a prompt's greedy and sampled runs side by side, for the worker's prefix cache
        groups = dict(zip((item.prompt_index for item in items), self.collect(step, cursor, items, held_out=True)))
        return [groups[i] for i in range(len(items))]  # every greedy one, then every sampled one

    def sampling(self, step: int, index: int, temperature: float) -> queue_pb2.SamplingParams:
        c = self.cfg.coordinator
        return queue_pb2.SamplingParams(
            temperature=temperature,
            top_p=c.top_p,
            max_tokens=c.max_tokens,
            ignore_eos=c.ignore_eos,
            seed=(self.cfg.run.seed * 1_000_003 + step * 10_007 + index) % 2**63 + 1,
        )

    def _work(
        self, step: int, index: int, p: Prompt, num_samples: int, temperature: float, held_out: bool = False
    ) -> queue_pb2.PromptWork:
        return queue_pb2.PromptWork(
            run_id=self.state.run_id,
            step=step,
            prompt_index=index,
            prompt_ids=self.feed.renderer.ids(p),
            num_samples=num_samples,
            sampling=self.sampling(step, index, temperature),
            policy_version=self.policy_version,
            task=self.feed.task_spec(p),
            eval=held_out,
        )

    def collect(
        self, step: int, cursor: str, items: list[queue_pb2.PromptWork], held_out: bool = False
    ) -> list[queue_pb2.TrajectoryGroup | None]:
        """Read trajectory groups until every item has one, or None where its prompt was dropped: rejected by a
        worker (a bad item, or one that failed on every delivery), or sampled by another policy version more
        than MAX_REQUEUES times. A group of another version is never used; its item is enqueued again."""
        want, position = len(items), {item.prompt_index: k for k, item in enumerate(items)}
        got: dict[int, queue_pb2.TrajectoryGroup | None] = {}
        requeued: Counter[int] = Counter()
        deadline = time.monotonic() + self.cfg.coordinator.batch_timeout_s
        what = "held-out groups" if held_out else "groups"
        while len(got) < want:
            if self.state.stop.is_set():
                raise StepFailed("run stopped while collecting trajectories")
            if time.monotonic() > deadline:
                raise StepFailed(
                    f"step {step}: {len(got)}/{want} {what} after coordinator.batch_timeout_s="
                    f"{self.cfg.coordinator.batch_timeout_s}s; {self._who_works()}"
                )
            self.refits.catch_up_joiners(self.policy_version)
            cursor, groups = self.queue.read_trajectories(cursor, block_ms=500)
            for g in groups:
                i = position.get(g.prompt_index, -1)
                # A re-leased item can come back twice; its ids are deterministic, the first copy wins.
                if g.run_id != self.state.run_id or g.step != step or g.eval != held_out or i < 0 or i in got:
                    continue
                if not g.trajectories:
                    log.warning("step %d: prompt %d dropped, rejected by %s: %s", step, i, g.worker_id, g.error)
                    got[i] = None
                elif g.policy_version != self.policy_version:
                    if requeued[i] == MAX_REQUEUES:
                        log.warning("step %d: prompt %d dropped: only stale policies sampled it", step, i)
                        got[i] = None
                        continue
                    requeued[i] += 1
                    log.warning(
                        "step %d: prompt %d came back from %s sampled by policy version %d, not %d: enqueued again",
                        step, i, g.worker_id, g.policy_version, self.policy_version,
                    )  # fmt: skip
                    self.queue.enqueue([items[i]])
                else:
                    got[i] = g
        self._read_up_to = cursor
        return [got[i] for i in range(want)]

    def _who_works(self) -> str:
        """The queue and the workers as the coordinator sees them, for an error that names the wait's peers."""
        depths, now = self.queue.depths(), time.time()
        beats = {w: now - b["ts"] for w, b in self.queue.workers().items()}
        live = sorted(w for w, age in beats.items() if age < 10) or "none"
        return f"prompt items pending {depths['prompts_pending']}; workers with a heartbeat in the last 10 s: {live}"
