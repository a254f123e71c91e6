"""What the synchronous batch source (services/coordinator/batches.py) does with groups it must not train on,
against a real Redis."""

from __future__ import annotations

import uuid

import pytest

from protos.grpo.v1 import queue_pb2
from services.common.config import load_config
from services.common.queue import WorkQueue, connect
from services.coordinator.batches import MAX_REQUEUES, StepFailed, SyncBatches
from services.coordinator.refits import Refits
from services.coordinator.state import RunState


def _source(redis_url) -> SyncBatches:
    suffix = uuid.uuid4().hex[:8]
    queue = WorkQueue(connect(redis_url), f"prompts-{suffix}", f"trajectories-{suffix}")
    queue.ensure_group()
    cfg = load_config(None, ["coordinator.batch_timeout_s=20"])
    source = SyncBatches(cfg, queue, None, RunState(run_id="r", num_steps=5), Refits(None, queue, 5.0))
    source.policy_version = 3
    return source


def _items(n: int) -> list[queue_pb2.PromptWork]:
    return [
        queue_pb2.PromptWork(run_id="r", step=4, prompt_index=i, prompt_ids=[1], policy_version=3) for i in range(n)
    ]


def _group(index: int, version: int = 3, error: str = "") -> queue_pb2.TrajectoryGroup:
    trajectories = [] if error else [queue_pb2.Trajectory(trajectory_id=f"r/4/{index}/0", response_ids=[5])]
    return queue_pb2.TrajectoryGroup(
        run_id="r", step=4, prompt_index=index, policy_version=version, trajectories=trajectories, error=error
    )


def test_a_rejected_prompt_is_dropped_and_the_step_goes_on(redis_url):
    source = _source(redis_url)
    cursor = source.queue.trajectories_tail()
    for g in (_group(0), _group(1, error="prompt too long"), _group(2)):
        source.queue.complete("0-1", g)
    got = source.collect(4, cursor, _items(3))
    assert [g is not None for g in got] == [True, False, True]


def test_a_group_of_another_policy_version_is_never_used_and_its_prompt_is_enqueued_again(redis_url):
    source = _source(redis_url)
    cursor = source.queue.trajectories_tail()
    # prompt 1 comes back from a worker that joined with the initial weights, then from one at version 3
    for g in (_group(0), _group(1, version=0), _group(1)):
        source.queue.complete("0-1", g)
    got = source.collect(4, cursor, _items(2))
    assert [g.policy_version for g in got] == [3, 3]
    [(_, again)] = [source.queue.claim("w", block_ms=100, lease_timeout_s=60)]
    assert (again.step, again.prompt_index, again.policy_version) == (4, 1, 3)


def test_a_prompt_only_stale_workers_sample_is_dropped_after_the_requeue_limit(redis_url):
    source = _source(redis_url)
    cursor = source.queue.trajectories_tail()
    for g in [_group(0)] + [_group(1, version=2)] * (MAX_REQUEUES + 1):
        source.queue.complete("0-1", g)
    got = source.collect(4, cursor, _items(2))
    assert got[0] is not None and got[1] is None


def test_a_batch_that_never_completes_fails_naming_the_queue_and_the_workers(redis_url):
    source = _source(redis_url)
    source.cfg.coordinator.batch_timeout_s = 1.0
    source.queue.heartbeat("rollout-7@host:1", policy_version=3)
    cursor = source.queue.trajectories_tail()
    source.queue.enqueue(_items(2))
    source.queue.complete("0-1", _group(0))
    with pytest.raises(StepFailed) as e:
        source.collect(4, cursor, _items(2))
    assert "1/2 groups after coordinator.batch_timeout_s=1.0s" in str(e.value)
    assert "rollout-7@host:1" in str(e.value)
