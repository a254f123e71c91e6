"""Redis Streams client for the two work streams. Payloads are serialized protos (field `pb`)."""

from __future__ import annotations

import json
import logging
import time

import redis
from google.protobuf.message import DecodeError

from protos.grpo.v1 import queue_pb2

log = logging.getLogger(__name__)

ROLLOUT_GROUP = "rollout"
WORKERS_KEY = "workers"


def connect(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=30, socket_connect_timeout=10)


class WorkQueue:
    """`prompts` is consumed by the rollout consumer group; `trajectories` is read by cursor."""

    def __init__(self, r: redis.Redis, prompts_stream: str = "prompts", trajectories_stream: str = "trajectories"):
        self.r, self.prompts, self.trajectories = r, prompts_stream, trajectories_stream

    def ensure_group(self) -> None:
        try:
            self.r.xgroup_create(self.prompts, ROLLOUT_GROUP, id="0", mkstream=True)
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise

    # --- coordinator side -------------------------------------------------------------
    def enqueue(self, items: list[queue_pb2.PromptWork]) -> None:
        pipe = self.r.pipeline(transaction=False)
        for item in items:
            pipe.xadd(self.prompts, {"pb": item.SerializeToString()})
        pipe.execute()

    def trajectories_tail(self) -> str:
        """Cursor at the stream's current end: only groups added after this call are read."""
        last = (
            self.r.xinfo_stream(self.trajectories)["last-generated-id"] if self.r.exists(self.trajectories) else b"0-0"
        )
        return last.decode() if isinstance(last, bytes) else str(last)

    def read_trajectories(self, cursor: str, block_ms: int) -> tuple[str, list[queue_pb2.TrajectoryGroup]]:
        reply = self.r.xread({self.trajectories: cursor}, count=256, block=block_ms)
        groups = []
        for _stream, entries in reply or []:
            for entry_id, fields in entries:
                cursor = entry_id.decode()
                groups.append(queue_pb2.TrajectoryGroup.FromString(fields[b"pb"]))
        return cursor, groups

    def depths(self) -> dict[str, int]:
        pending = 0
        if self.r.exists(self.prompts):
            pending = self.r.xpending(self.prompts, ROLLOUT_GROUP)["pending"]
        return {
            "prompts_len": self.r.xlen(self.prompts),
            "prompts_pending": pending,
            "trajectories_len": self.r.xlen(self.trajectories),
        }

    # --- rollout side ------------------------------------------------------------------
    def claim(self, consumer: str, block_ms: int, lease_timeout_s: float) -> tuple[str, queue_pb2.PromptWork] | None:
        """A work item: first one a dead worker left pending too long, else a new one."""
        claimed = self._claim(consumer, 1, block_ms, lease_timeout_s)
        return claimed[0] if claimed else None

    def claim_batch(
        self, consumer: str, max_sequences: int, block_ms: int, lease_timeout_s: float
    ) -> list[tuple[str, queue_pb2.PromptWork]]:
        """Work for one engine call: waits up to block_ms for the first item, then takes what is already there
        until the items' samples fill max_sequences (re-leased items first)."""
        claimed = self._claim(consumer, 1, block_ms, lease_timeout_s)
        used = sum(work.num_samples for _, work in claimed)
        per_item = max(1, claimed[0][1].num_samples) if claimed else 1
        while claimed and used < max_sequences:
            more = self._claim(consumer, max(1, (max_sequences - used) // per_item), 0, lease_timeout_s)
            if not more:
                break
            claimed += more
            used += sum(work.num_samples for _, work in more)
        return claimed

    def _claim(
        self, consumer: str, count: int, block_ms: int, lease_timeout_s: float
    ) -> list[tuple[str, queue_pb2.PromptWork]]:
        reclaimed = self.r.xautoclaim(
            self.prompts, ROLLOUT_GROUP, consumer, int(lease_timeout_s * 1000), "0-0", count=count
        )
        # Redis 6.2 answers [next, entries], Redis 7 [next, entries, deleted].
        entries = [e for e in reclaimed[1] if e[1]]
        if not entries:
            # block=None: return at once (block=0 would wait forever).
            reply = self.r.xreadgroup(ROLLOUT_GROUP, consumer, {self.prompts: ">"}, count=count, block=block_ms or None)
            entries = reply[0][1] if reply else []
        out = []
        for entry_id, fields in entries:
            try:
                out.append((entry_id.decode(), queue_pb2.PromptWork.FromString(fields[b"pb"])))
            except (KeyError, DecodeError) as e:  # not ours, or corrupt: drop it loudly, keep working
                log.error("prompt entry %s is not a PromptWork (%s): acked and dropped", entry_id.decode(), e)
                self.r.xack(self.prompts, ROLLOUT_GROUP, entry_id)
        return out

    def complete(self, entry_id: str, group: queue_pb2.TrajectoryGroup) -> None:
        # Ack only after the trajectory is in the stream, so a crash re-leases the prompt, never loses it.
        self.r.xadd(self.trajectories, {"pb": group.SerializeToString()})
        self.r.xack(self.prompts, ROLLOUT_GROUP, entry_id)

    def heartbeat(self, worker_id: str, **fields: object) -> None:
        self.r.hset(WORKERS_KEY, worker_id, json.dumps({"ts": time.time(), **fields}))

    def workers(self) -> dict[str, dict]:
        """Each worker's last heartbeat; an entry that is not one (a stale or foreign writer of the hash) is
        skipped with a warning, so the status endpoint keeps answering."""
        out = {}
        for key, value in self.r.hgetall(WORKERS_KEY).items():
            name = key.decode(errors="replace")
            try:
                beat = json.loads(value)
            except (ValueError, RecursionError):
                beat = None
            if not isinstance(beat, dict) or not isinstance(beat.get("ts"), int | float):
                log.warning("workers[%r] is not a worker heartbeat: skipped", name)
                continue
            out[name] = beat
        return out
