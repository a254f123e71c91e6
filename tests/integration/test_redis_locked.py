"""A run's Redis, locked (services/common/redis_server.py), and its streams signed (services/common/queue.py): a
neighbour without the password gets nothing, the run's own user cannot reconfigure Redis, and a group or work item
not signed with the run secret never reaches a batch or an engine."""

from __future__ import annotations

import secrets
import subprocess
import uuid

import pytest
import redis

from protos.grpo.v1 import queue_pb2
from services.common import auth
from services.common.ports import free_port
from services.common.queue import ROLLOUT_GROUP, WorkQueue, connect
from services.common.redis_server import USER, password, redis_command, wait_answering


@pytest.fixture
def secret():
    value = secrets.token_hex(32)
    auth.set_secret(value)
    yield value
    auth.set_secret(None)


@pytest.fixture
def locked_redis(tmp_path, secret):
    port = free_port()
    proc = subprocess.Popen(
        redis_command(port, tmp_path, secret=secret), stdout=subprocess.DEVNULL, start_new_session=True
    )
    try:
        wait_answering(proc, port, tmp_path / "redis.log", secret=secret)
        yield port, tmp_path
    finally:
        proc.terminate()
        proc.wait()


def test_without_the_password_nothing_and_with_it_no_reconfiguring(locked_redis, tmp_path_factory):
    port, data_dir = locked_redis
    assert (data_dir / "redis.conf").stat().st_mode & 0o077 == 0  # the password is in no world-readable file
    for stranger in (redis.Redis(port=port), redis.Redis(port=port, username=USER, password="0" * 64)):
        with pytest.raises((redis.AuthenticationError, redis.ResponseError)):
            stranger.xadd("trajectories", {"pb": b"forged"})
    ours = connect(f"redis://{USER}@127.0.0.1:{port}/0")  # the password comes from the run secret
    assert ours.ping()
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    for command in (("CONFIG", "SET", "dir", str(elsewhere)), ("SAVE",), ("FLUSHALL",), ("DEBUG", "SLEEP", "0")):
        # Our ACL refuses each (NOPERM); Redis 7 refuses DEBUG itself before the ACL is asked (enable-debug-command).
        with pytest.raises(redis.ResponseError, match="NOPERM|permission|DEBUG command not allowed"):
            ours.execute_command(*command)
    assert not any(elsewhere.iterdir())


def _queue(url: str) -> WorkQueue:
    suffix = uuid.uuid4().hex[:8]
    q = WorkQueue(connect(url), f"prompts-{suffix}", f"trajectories-{suffix}")
    q.ensure_group()
    return q


def test_forged_and_unsigned_groups_are_dropped_and_counted(locked_redis, secret):
    port, _ = locked_redis
    q = _queue(f"redis://{USER}@127.0.0.1:{port}/0")
    cursor = q.trajectories_tail()
    genuine = queue_pb2.TrajectoryGroup(run_id="r", step=1, prompt_index=0, trajectories=[queue_pb2.Trajectory()])
    q.enqueue([queue_pb2.PromptWork(run_id="r", step=1, prompt_index=0, num_samples=1)])
    entry_id, _ = q.claim("w", block_ms=100, lease_timeout_s=60)
    q.complete(entry_id, genuine)
    # Someone holding the password (a leaked one) but not the secret: an unsigned group, one signed with another
    # secret, and a copy of the genuine group's signature over other bytes.
    forged = queue_pb2.TrajectoryGroup(run_id="r", step=1, prompt_index=1, trajectories=[queue_pb2.Trajectory()] * 4)
    payload = forged.SerializeToString()
    signature = auth.sign("group", genuine.SerializeToString())
    q.r.xadd(q.trajectories, {"pb": payload})
    q.r.xadd(q.trajectories, {"pb": payload, "sig": auth.sign("group", payload, secret="f" * 64)})
    q.r.xadd(q.trajectories, {"pb": payload, "sig": signature})
    q.r.xadd(q.trajectories, {"pb": payload, "sig": auth.sign("prompt", payload)})  # signed, as another kind
    _, groups = q.read_trajectories(cursor, block_ms=100)
    assert [(g.step, g.prompt_index) for g in groups] == [(1, 0)]
    assert q.forged == 4


def test_a_forged_work_item_is_never_generated(locked_redis, secret):
    port, _ = locked_redis
    q = _queue(f"redis://{USER}@127.0.0.1:{port}/0")
    item = queue_pb2.PromptWork(run_id="r", step=1, prompt_index=7, num_samples=64)
    q.r.xadd(q.prompts, {"pb": item.SerializeToString()})
    q.r.xadd(q.prompts, {"pb": item.SerializeToString(), "sig": auth.sign("prompt", b"", secret=secret)})
    q.enqueue([queue_pb2.PromptWork(run_id="r", step=1, prompt_index=0, num_samples=1)])
    claimed = q.claim_batch("w", max_sequences=256, block_ms=100, lease_timeout_s=60)
    assert [work.prompt_index for _, work in claimed] == [0]
    assert q.forged == 2
    assert q.r.xpending(q.prompts, ROLLOUT_GROUP)["pending"] == 1  # the forged ones acked: never re-delivered


def test_a_heartbeat_without_the_runs_signature_is_not_a_worker(locked_redis, secret):
    """A forged beat would make the coordinator republish weights for a joiner that does not exist, or list it."""
    import json
    import time

    from services.common.queue import WORKERS_KEY

    port, _ = locked_redis
    q = _queue(f"redis://{USER}@127.0.0.1:{port}/0")
    q.heartbeat("rollout-0@h:1", policy_version=2, joining=False)
    beat = {"ts": time.time(), "policy_version": 0, "joining": True}
    q.r.hset(WORKERS_KEY, "rollout-9@h:2", json.dumps(beat))
    signed_for_another = json.loads(q.r.hget(WORKERS_KEY, "rollout-0@h:1"))
    q.r.hset(WORKERS_KEY, "rollout-8@h:3", json.dumps(signed_for_another))  # a genuine beat under another name
    tampered = {**signed_for_another, "joining": True}
    q.r.hset(WORKERS_KEY, "rollout-0@h:1", json.dumps(tampered))
    assert q.workers() == {}
    q.heartbeat("rollout-0@h:1", policy_version=2, joining=False)
    assert list(q.workers()) == ["rollout-0@h:1"] and q.workers()["rollout-0@h:1"]["policy_version"] == 2


def test_the_password_is_the_run_secrets_alone(secret):
    assert password(secret) == password() and len(password()) == 64
    assert password("e" * 64) != password(secret)
