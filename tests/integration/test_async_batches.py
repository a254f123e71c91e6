"""Asynchronous GRPO's batch source (services/coordinator/async_batches.py) against a real Redis and a real prompt
feed: the groups come from a scripted worker whose engine version the test sets, so that staleness is exact."""

from __future__ import annotations

import threading
import uuid

import pytest

from protos.grpo.v1 import queue_pb2
from services.common.config import load_config
from services.common.queue import WorkQueue, connect
from services.coordinator.advantages import groups_with_signal
from services.coordinator.async_batches import AsyncBatches
from services.coordinator.batches import StepFailed, SyncBatches
from services.coordinator.feed import PromptFeed
from services.coordinator.refits import Refits
from services.coordinator.state import RunState

NUM_PROMPTS = 2


def _source(redis_url, tiny_model, eta: int, *overrides: str) -> SyncBatches:
    suffix = uuid.uuid4().hex[:8]
    queue = WorkQueue(connect(redis_url), f"prompts-{suffix}", f"trajectories-{suffix}")
    queue.ensure_group()
    cfg = load_config(
        None,
        [
            f'model.path="{tiny_model}"',
            f"coordinator.max_staleness={eta}",
            f"coordinator.num_prompts={NUM_PROMPTS}",
            "coordinator.num_samples=2",
            "coordinator.batch_timeout_s=20",
            *overrides,
        ],
    )
    source = AsyncBatches if eta else SyncBatches
    return source(cfg, queue, PromptFeed(cfg, None), RunState(run_id="r", num_steps=100), Refits(None, queue, 5))


class ScriptedWorker:
    """Claims work and completes it as an engine holding `version` would; `reject` names prompts it refuses, their
    samples' rewards differ except for the prompts in `no_signal` (or all, with `no_signal = ALL`), and
    `slow_every` > 0 holds every such item back until the engine is 3 versions further (a slow or re-leased one)."""

    ALL = "all"

    def __init__(self, source: SyncBatches, slow_every: int = 0):
        self.source, self.version, self.reject, self.slow_every = source, 0, set(), slow_every
        self.no_signal: set[str] | str = set()
        self.produced: list[queue_pb2.TrajectoryGroup] = []
        self.held: list[tuple[str, queue_pb2.TrajectoryGroup]] = []
        self.running = threading.Event()
        self.running.set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        queue = self.source.queue
        while not self.stop.is_set():
            if not self.running.wait(0.05):
                continue
            for entry_id, g in [h for h in self.held if self.version >= h[1].policy_version + 3]:
                self.held.remove((entry_id, g))
                self.produced.append(g)
                queue.complete(entry_id, g)
            for entry_id, work in queue.claim_batch("w", max_sequences=2, block_ms=50, lease_timeout_s=60):
                g = queue_pb2.TrajectoryGroup(
                    run_id=work.run_id, step=work.step, prompt_index=work.prompt_index, prompt_ids=work.prompt_ids,
                    policy_version=self.version, worker_id="w", eval=work.eval,
                )  # fmt: skip
                if work.task.prompt in self.reject:
                    g.error = "refused"
                    queue.complete(entry_id, g)
                    continue
                for i in range(work.num_samples):
                    tid = f"{work.run_id}/{work.step}/{work.prompt_index}/{i}"
                    flat = self.no_signal == self.ALL or work.task.prompt in self.no_signal
                    reward = 0.0 if flat else float(i % 2)
                    g.trajectories.append(queue_pb2.Trajectory(trajectory_id=tid, response_ids=[5], reward=reward))
                if self.slow_every and work.prompt_index % self.slow_every == self.slow_every - 1:
                    self.held.append((entry_id, g))
                    continue
                self.produced.append(g)
                queue.complete(entry_id, g)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)


@pytest.fixture
def worker_for():
    workers = []

    def make(source, slow_every: int = 0):
        workers.append(ScriptedWorker(source, slow_every))
        return workers[-1]

    yield make
    for w in workers:
        w.close()


def _ids(batch) -> list[str]:
    return [t.trajectory_id for g in batch.groups for t in g.trajectories]


def test_with_slow_groups_no_batch_is_older_than_eta_and_no_fresh_group_is_lost(redis_url, tiny_model, worker_for):
    eta = 2
    source = _source(redis_url, tiny_model, eta)
    worker = worker_for(source, slow_every=3)
    trained, stale = [], 0
    for step in range(1, 13):
        batch = source.take(step)
        assert len(batch.groups) == NUM_PROMPTS
        assert max(batch.staleness) <= eta
        assert batch.staleness == [source.policy_version - g.policy_version for g in batch.groups]
        trained += _ids(batch)
        stale += batch.num_stale
        source.policy_version += 1  # the trainer trains, and the refit brings the engine the new version
        worker.version = source.policy_version
    assert stale > 0, "the slow items made no group stale: the test tests nothing"
    shown = source.state.to_json()["pipeline"]  # what /status shows
    assert sum(shown["trained_groups_by_staleness"].values()) == 12 * NUM_PROMPTS
    assert max(map(int, shown["trained_groups_by_staleness"])) <= eta and shown["dropped_stale"] == stale
    assert len(trained) == len(set(trained)), "a trajectory was trained twice"
    # Every complete group is trained, dropped as stale, or still in the pipeline: none vanished.
    worker.running.clear()
    in_pipeline = {t.trajectory_id for _, g in source.ready for t in g.trajectories}
    produced = [t.trajectory_id for g in worker.produced for t in g.trajectories]
    source._read(99)  # what the worker completed after the last batch
    in_pipeline |= {t.trajectory_id for _, g in source.ready for t in g.trajectories}
    accounted = set(trained) | in_pipeline
    assert len(set(produced) - accounted) == 2 * stale  # num_samples trajectories per stale group, and only those


def test_the_next_batches_work_is_queued_before_this_one_trains(redis_url, tiny_model, worker_for):
    source = _source(redis_url, tiny_model, 1)
    worker = worker_for(source)
    source.take(1)
    # eta x num_prompts prompts stay in the pipeline while step 1 trains: the worker generates them meanwhile.
    assert len(source.pending()) == NUM_PROMPTS
    worker.running.clear()
    assert source.feed.cursor == 2 * NUM_PROMPTS


def test_a_rejected_prompt_is_dropped_counted_and_replaced(redis_url, tiny_model, worker_for):
    source = _source(redis_url, tiny_model, 1)
    first = PromptFeed(source.cfg, None).take(1)[0]  # the feed's order is a pure function of the seed
    worker = worker_for(source)
    worker.reject.add(first.text)
    batch = source.take(1)
    assert len(batch.groups) == NUM_PROMPTS and batch.num_dropped == 1
    assert first not in batch.prompts


def test_a_resumed_source_hands_out_the_checkpoints_pending_prompts_first(redis_url, tiny_model, worker_for):
    source = _source(redis_url, tiny_model, 1)
    worker = worker_for(source)
    source.take(1)
    worker.running.clear()
    pending, cursor = source.pending(), source.feed.cursor

    resumed = _source(redis_url, tiny_model, 1)
    resumed.feed.skip_to(cursor)
    resumed.resumed = list(pending)
    worker_for(resumed)
    batch = resumed.take(2)
    taken = list(batch.prompts) + resumed.pending()
    assert pending and all(p in taken for p in pending), "a prompt handed out before the checkpoint was skipped"
    fresh = [p for p in taken if p not in pending]
    assert fresh == PromptFeed(source.cfg, None, cursor).take(len(fresh)), "the feed went on where it stopped"


def test_a_batch_that_never_fills_fails_naming_the_wait(redis_url, tiny_model):
    source = _source(redis_url, tiny_model, 1, "coordinator.batch_timeout_s=1")
    with pytest.raises(StepFailed, match=r"0/2 groups after coordinator.batch_timeout_s=1.0s; prompt items pending"):
        source.take(1)


def _signal(g: queue_pb2.TrajectoryGroup) -> bool:
    return bool(groups_with_signal([[t.reward for t in g.trajectories]]))


@pytest.mark.parametrize("eta", [0, 1])
def test_dynamic_sampling_replaces_flat_groups_until_the_batch_is_full(redis_url, tiny_model, worker_for, eta):
    source = _source(redis_url, tiny_model, eta, "coordinator.dynamic_sampling=true")
    source.has_signal = _signal
    flat = [p.text for p in PromptFeed(source.cfg, None).take(NUM_PROMPTS)]  # the first prompts the feed gives
    worker = worker_for(source)
    worker.no_signal = set(flat)
    batch = source.take(1)
    assert len(batch.groups) == NUM_PROMPTS and all(map(_signal, batch.groups))
    assert batch.num_refilled == NUM_PROMPTS and not {p.text for p in batch.prompts} & set(flat)
    ids = _ids(batch)
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("eta", [0, 1])
def test_dynamic_sampling_stops_refilling_at_its_budget(redis_url, tiny_model, worker_for, eta):
    source = _source(redis_url, tiny_model, eta, "coordinator.dynamic_sampling=true")
    source.has_signal = _signal
    worker = worker_for(source)
    worker.no_signal = ScriptedWorker.ALL  # a task too hard to start with: nothing has signal
    batch = source.take(1)
    assert batch.num_refilled == source.cfg.coordinator.dynamic_sampling_max_extra * NUM_PROMPTS
    assert len(batch.groups) == NUM_PROMPTS  # completed with groups that train nothing, not a step that hangs


@pytest.mark.parametrize("eta", [0, 1])
def test_held_out_groups_come_back_greedy_first_then_sampled_in_prompt_order(redis_url, tiny_model, worker_for, eta):
    """evaluate() reads the first n as the greedy runs of the n held-out prompts and the rest as their k samples; the
    items go out interleaved (a prompt's two runs side by side), and the groups must not come back so."""
    source = _source(redis_url, tiny_model, eta)
    worker_for(source)
    n, prompts = 3, PromptFeed(source.cfg, None).take(3)  # the toy task holds none out; any prompts will do
    groups = source.held_out(1, prompts, k=2)
    assert [g.prompt_index for g in groups] == list(range(2 * n))
    assert all(g.eval for g in groups)
    assert [len(g.trajectories) for g in groups] == [1] * n + [2] * n
    assert [g.prompt_ids for g in groups[:n]] == [g.prompt_ids for g in groups[n:]]
