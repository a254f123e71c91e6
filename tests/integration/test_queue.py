"""Redis Streams semantics with a real server: leases, a killed worker, dedup by id."""

from __future__ import annotations

import multiprocessing as mp
import time
import uuid

from protos.grpo.v1 import queue_pb2
from services.common.queue import WorkQueue, connect


def _queue(redis_url: str) -> WorkQueue:
    suffix = uuid.uuid4().hex[:8]
    q = WorkQueue(connect(redis_url), f"prompts-{suffix}", f"trajectories-{suffix}")
    q.ensure_group()
    return q


def _claim_and_die(redis_url: str, prompts: str, trajectories: str) -> None:
    q = WorkQueue(connect(redis_url), prompts, trajectories)
    assert q.claim("doomed", block_ms=2000, lease_timeout_s=60) is not None
    import os

    os._exit(1)  # dies holding the lease: no trajectory, no ack


def test_trajectory_survives_a_killed_worker(redis_url):
    q = _queue(redis_url)
    q.enqueue([queue_pb2.PromptWork(run_id="r", step=1, prompt_index=0, prompt_ids=[1, 2], num_samples=2)])
    cursor = q.trajectories_tail()
    p = mp.get_context("spawn").Process(target=_claim_and_die, args=(redis_url, q.prompts, q.trajectories))
    p.start()
    p.join(30)
    assert p.exitcode == 1
    assert q.depths()["prompts_pending"] == 1
    assert q.claim("alive", block_ms=100, lease_timeout_s=60) is None  # still leased to the dead one
    time.sleep(0.3)
    entry_id, work = q.claim("alive", block_ms=100, lease_timeout_s=0.2)
    assert (work.step, work.prompt_index) == (1, 0)
    q.complete(
        entry_id, queue_pb2.TrajectoryGroup(run_id="r", step=1, prompt_index=0, trajectories=[queue_pb2.Trajectory()])
    )
    assert q.depths()["prompts_pending"] == 0
    _, groups = q.read_trajectories(cursor, block_ms=100)
    assert [(g.step, g.prompt_index) for g in groups] == [(1, 0)]


def test_each_item_goes_to_one_worker(redis_url):
    q = _queue(redis_url)
    q.enqueue([queue_pb2.PromptWork(prompt_index=i) for i in range(6)])
    seen = []
    for worker in ["w1", "w2", "w1", "w2", "w1", "w2"]:
        entry_id, work = q.claim(worker, block_ms=100, lease_timeout_s=60)
        seen.append(work.prompt_index)
        q.complete(entry_id, queue_pb2.TrajectoryGroup(prompt_index=work.prompt_index))
    assert sorted(seen) == list(range(6))
    assert q.claim("w3", block_ms=100, lease_timeout_s=60) is None


def test_a_poison_item_is_dropped_after_its_delivery_limit(redis_url):
    # Every worker that takes the item dies on it (it never completes): after max_deliveries the next claim
    # answers it with an error group instead of handing it out again.
    q = _queue(redis_url)
    q.max_deliveries = 2
    q.enqueue([queue_pb2.PromptWork(run_id="r", step=3, prompt_index=1, prompt_ids=[1, 2], num_samples=2)])
    cursor = q.trajectories_tail()
    assert q.claim("first", block_ms=100, lease_timeout_s=0.05) is not None
    time.sleep(0.1)
    assert q.claim("second", block_ms=100, lease_timeout_s=0.05) is not None
    time.sleep(0.1)
    assert q.claim("third", block_ms=100, lease_timeout_s=0.05) is None
    assert q.depths()["prompts_pending"] == 0
    _, [group] = q.read_trajectories(cursor, block_ms=100)
    assert (group.run_id, group.step, group.prompt_index, len(group.trajectories)) == ("r", 3, 1, 0)
    assert "after 2 deliveries" in group.error and group.worker_id == "third"


def test_a_resumed_run_drops_its_own_old_work_only(redis_url):
    q = _queue(redis_url)
    q.enqueue(
        [queue_pb2.PromptWork(run_id=run, step=s, prompt_index=0, prompt_ids=[1]) for run in ("a", "b") for s in (1, 2)]
    )
    assert q.claim("w", block_ms=100, lease_timeout_s=60) is not None  # one of a's, now pending
    assert q.drop_run_work("a") == 2
    assert q.depths()["prompts_pending"] == 0
    left = [q.claim("w", block_ms=100, lease_timeout_s=60) for _ in range(3)]
    assert [(w.run_id, w.step) for _, w in filter(None, left)] == [("b", 1), ("b", 2)]


def _used_memory(q: WorkQueue) -> int:
    return q.r.info("memory")["used_memory"]


def _step(q: WorkQueue, step: int, cursor: str) -> str:
    prompt_ids = list(range(64))
    q.enqueue([queue_pb2.PromptWork(run_id="r", step=step, prompt_index=i, prompt_ids=prompt_ids) for i in range(8)])
    group = [queue_pb2.Trajectory(response_ids=list(range(32)), logprobs=[-1.0] * 32, text="x" * 64) for _ in range(4)]
    for entry_id, work in q.claim_batch("w", max_sequences=8 * 4, block_ms=100, lease_timeout_s=60):
        q.complete(entry_id, queue_pb2.TrajectoryGroup(run_id="r", step=step, prompt_index=work.prompt_index,
                                                       trajectories=group))  # fmt: skip
    got = 0
    while got < 8:
        cursor, groups = q.read_trajectories(cursor, block_ms=100)
        got += len(groups)
    return cursor


def test_trimming_keeps_redis_memory_flat_over_a_long_run_and_never_loses_work(tmp_path):
    """1,000 steps of 8 prompts x 4 samples through the streams, trimmed after each step as the coordinator does:
    Redis's used_memory at step 1,000 is within 10 % of step 100's; an item leased to a dead worker and one not yet
    delivered survive every trim."""
    from services.common.ports import free_port
    from services.common.redis_server import start_redis

    port = free_port()
    server = start_redis(port, tmp_path)
    try:
        q = _queue(f"redis://127.0.0.1:{port}/0")
        q.enqueue([queue_pb2.PromptWork(run_id="r", step=0, prompt_index=99)])
        assert q.claim("dead", block_ms=100, lease_timeout_s=60)  # leased, never completed
        cursor, memory = q.trajectories_tail(), {}
        for step in range(1, 1001):
            cursor = _step(q, step, cursor)
            q.trim(cursor)
            if step in (100, 1000):
                memory[step] = _used_memory(q)
        assert memory[1000] <= 1.1 * memory[100], memory
        assert q.r.xlen(q.trajectories) == 0 and q.r.xlen(q.prompts) == 1  # only the leased item is left
        q.enqueue([queue_pb2.PromptWork(run_id="r", step=1001, prompt_index=0)])
        q.trim(cursor)
        _, work = q.claim("alive", block_ms=100, lease_timeout_s=0)  # the dead worker's item, re-leased
        assert (work.step, work.prompt_index) == (0, 99)
        _, work = q.claim("alive", block_ms=100, lease_timeout_s=60)  # the undelivered one
        assert (work.step, work.prompt_index) == (1001, 0)
    finally:
        server.terminate()
        server.wait()
