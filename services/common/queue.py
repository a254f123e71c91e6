"""Redis Streams client for the two work streams. Payloads are serialized protos (field `pb`), each signed with the
run secret (field `sig`, services/common/auth.py): the coordinator signs prompt items, workers sign trajectory
groups, and a reader drops, counts and logs an entry whose signature is missing or wrong, so a neighbour who
reaches Redis cannot feed the batch. Locally started Redis also needs a password (services/common/redis_server.py):
the URL names the user `grpo`, and its password is derived from the run secret, never written down."""

from __future__ import annotations

import json
import logging
import time

import redis
from google.protobuf.message import DecodeError
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from protos.grpo.v1 import queue_pb2

from . import auth

log = logging.getLogger(__name__)

ROLLOUT_GROUP = "rollout"
WORKERS_KEY = "workers"


RECONNECT_TRIES = 10
"""Reconnects of one call (backoff 0.1 s doubling to 5 s: ~30 s in all, the time a Redis restarted from its
append-only file takes to answer) before the error reaches the caller."""


def connect(url: str) -> redis.Redis:
    """A client of url; as user `grpo` without a password in the URL, with the run's Redis password."""
    # Every call retries on a lost connection: a restarted Redis is a pause, not the end of the run. A retried
    # XADD whose first try did land makes a duplicate entry; trajectory ids are deterministic and readers dedup.
    from urllib.parse import urlsplit

    from . import tls
    from .redis_server import USER, password, ssl_options

    parts = urlsplit(url)
    key = password() if parts.username == USER and not parts.password else None
    if parts.username == USER and not parts.password and key is None:  # a process outside any run: no login
        url = url.replace(f"{USER}@", "", 1)
    # A run.tls run's own Redis (rediss:// as user grpo) wants the run's certificate; another rediss:// server is
    # checked against the system's CAs, as redis-py does by default.
    creds = tls.current()
    ssl = (
        ssl_options(creds.folder)
        if parts.scheme == "rediss" and parts.username == USER and creds and creds.folder
        else {}
    )
    return redis.Redis.from_url(
        url,
        **({"password": key} if key else {}),
        **ssl,
        socket_timeout=30,
        socket_connect_timeout=10,
        retry=Retry(ExponentialBackoff(cap=5.0, base=0.1), RECONNECT_TRIES),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
    )


class WorkQueue:
    """`prompts` is consumed by the rollout consumer group; `trajectories` is read by cursor."""

    def __init__(
        self,
        r: redis.Redis,
        prompts_stream: str = "prompts",
        trajectories_stream: str = "trajectories",
        max_deliveries: int = 3,
    ):
        self.r, self.prompts, self.trajectories = r, prompts_stream, trajectories_stream
        self.max_deliveries = max_deliveries
        """Deliveries of one work item (each worker that claimed it died or hung on it) before it is dropped."""
        self.forged = 0
        """Entries read (groups by the coordinator, items by a worker) whose signature was missing or wrong."""

    def _signed(self, kind: str, payload: bytes) -> dict[str, bytes]:
        return {"pb": payload, "sig": auth.sign(kind, payload)}

    def _genuine(self, kind: str, entry_id: bytes, fields: dict) -> bool:
        """Whether the entry carries this run's signature over its payload; a forged one is counted and logged."""
        if auth.verify(fields.get(b"sig", b""), kind, fields.get(b"pb", b"")):
            return True
        self.forged += 1
        log.error(
            "%s entry %s has no valid signature of this run: dropped (%d so far)", kind, entry_id.decode(), self.forged
        )
        return False

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
            pipe.xadd(self.prompts, self._signed("prompt", item.SerializeToString()))
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
                if not self._genuine("group", entry_id, fields):
                    continue
                try:
                    groups.append(queue_pb2.TrajectoryGroup.FromString(fields[b"pb"]))
                except DecodeError as e:  # signed by this run yet not a group: a defect, not an attack
                    log.error("trajectory entry %s is not a TrajectoryGroup (%s): skipped", entry_id.decode(), e)
        return cursor, groups

    def drop_run_work(self, run_id: str) -> int:
        """Delete every prompt item of run_id (a resumed run redoes its steps; their old items would be generated
        for nobody); returns how many."""
        dropped, start = 0, "-"
        while entries := self.r.xrange(self.prompts, min=start, count=1000):
            ours = []
            for entry_id, fields in entries:
                try:
                    if queue_pb2.PromptWork.FromString(fields.get(b"pb", b"")).run_id == run_id:
                        ours.append(entry_id)
                except DecodeError:
                    pass
            if ours:
                self.r.xack(self.prompts, ROLLOUT_GROUP, *ours)
                self.r.xdel(self.prompts, *ours)
                dropped += len(ours)
            start = "(" + entries[-1][0].decode()
        return dropped

    def trim(self, read_up_to: str) -> None:
        """Delete what no one needs any more, so a long run's Redis memory stays flat: prompt items before the
        oldest one pending at a worker or not yet delivered (workers delete what they complete; this takes what
        a crash or a dropped entry left acked), and trajectory groups up to the coordinator's read cursor (it is
        their only reader)."""
        if self.r.exists(self.prompts):
            groups = self.r.xinfo_groups(self.prompts)
            [info] = [g for g in groups if _as_str(g["name"]) == ROLLOUT_GROUP]
            pending = self.r.xpending(self.prompts, ROLLOUT_GROUP)
            keep_from = pending["min"] if pending["pending"] else _next_id(info["last-delivered-id"])
            self.r.xtrim(self.prompts, minid=_as_str(keep_from), approximate=False)
        if read_up_to not in ("", "0", "0-0", "$"):
            self.r.xtrim(self.trajectories, minid=_next_id(read_up_to), approximate=False)

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
        """Up to count items; entries dropped on reading (forged, corrupt) make it read again at once, so a run of
        them ahead of genuine work does not turn into an empty claim."""
        while True:
            read, out = self._claim_once(consumer, count, block_ms, lease_timeout_s)
            if out or not read:
                return out
            block_ms = 0

    def _claim_once(
        self, consumer: str, count: int, block_ms: int, lease_timeout_s: float
    ) -> tuple[int, list[tuple[str, queue_pb2.PromptWork]]]:
        reclaimed = self.r.xautoclaim(
            self.prompts, ROLLOUT_GROUP, consumer, int(lease_timeout_s * 1000), "0-0", count=count
        )
        # Redis 6.2 answers [next, entries], Redis 7 [next, entries, deleted].
        entries = [e for e in reclaimed[1] if e[1] and not self._drop_if_poison(consumer, *e)]
        if not entries:
            # block=None: return at once (block=0 would wait forever).
            reply = self.r.xreadgroup(ROLLOUT_GROUP, consumer, {self.prompts: ">"}, count=count, block=block_ms or None)
            entries = reply[0][1] if reply else []
        out = []
        for entry_id, fields in entries:
            if not self._genuine("prompt", entry_id, fields):
                self.r.xack(self.prompts, ROLLOUT_GROUP, entry_id)
                continue
            try:
                out.append((entry_id.decode(), queue_pb2.PromptWork.FromString(fields[b"pb"])))
            except (KeyError, DecodeError) as e:  # not ours, or corrupt: drop it loudly, keep working
                log.error("prompt entry %s is not a PromptWork (%s): acked and dropped", entry_id.decode(), e)
                self.r.xack(self.prompts, ROLLOUT_GROUP, entry_id)
        return len(entries), out

    def _drop_if_poison(self, consumer: str, entry_id: bytes, fields: dict) -> bool:
        """A re-claimed item delivered more than max_deliveries times (every worker that took it died or hung) is
        acked and answered with an error group, which the coordinator counts as a dropped prompt: it neither
        fails the step nor circles the workers forever."""
        [pending] = self.r.xpending_range(self.prompts, ROLLOUT_GROUP, min=entry_id, max=entry_id, count=1) or [{}]
        deliveries = pending.get("times_delivered", 0)
        if deliveries <= self.max_deliveries:
            return False
        try:
            work = queue_pb2.PromptWork.FromString(fields[b"pb"])
        except (KeyError, DecodeError):
            return False  # _claim drops what is not a PromptWork
        why = f"dropped after {deliveries - 1} deliveries whose workers died or hung on it"
        log.error("prompt entry %s (step %d, prompt %d) %s", entry_id.decode(), work.step, work.prompt_index, why)
        group = queue_pb2.TrajectoryGroup(
            run_id=work.run_id, step=work.step, prompt_index=work.prompt_index, eval=work.eval,
            prompt_ids=work.prompt_ids, policy_version=work.policy_version, worker_id=consumer, error=why,
        )  # fmt: skip
        self.complete(entry_id.decode(), group)
        return True

    def give_back(self, claimed: list[tuple[str, queue_pb2.PromptWork]]) -> None:
        """Items this worker cannot generate (its engine lacks their version) back to the queue for another worker:
        added again, then acked, so a crash between the two leaves a copy too many (its group dedups), never none."""
        if not claimed:
            return
        self.enqueue([work for _, work in claimed])
        self.r.xack(self.prompts, ROLLOUT_GROUP, *(entry_id for entry_id, _ in claimed))
        self.r.xdel(self.prompts, *(entry_id for entry_id, _ in claimed))

    def complete(self, entry_id: str, group: queue_pb2.TrajectoryGroup) -> None:
        # Ack only after the trajectory is in the stream, so a crash re-leases the prompt, never loses it. The item
        # is then deleted (one that a crash left acked but there goes with the coordinator's next trim).
        self.r.xadd(self.trajectories, self._signed("group", group.SerializeToString()))
        pipe = self.r.pipeline(transaction=False)
        pipe.xack(self.prompts, ROLLOUT_GROUP, entry_id).xdel(self.prompts, entry_id).execute()

    def heartbeat(self, worker_id: str, **fields: object) -> None:
        beat = {"ts": time.time(), **fields}
        body = json.dumps(beat, sort_keys=True)
        beat["sig"] = auth.sign("beat", worker_id.encode(), body.encode()).hex()
        self.r.hset(WORKERS_KEY, worker_id, json.dumps(beat))

    def workers(self) -> dict[str, dict]:
        """Each worker's last heartbeat; an entry that is not one (a stale or foreign writer of the hash, a beat
        without this run's signature) is skipped with a warning, so the status endpoint keeps answering."""
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
            sig = beat.pop("sig", "")
            body = json.dumps(beat, sort_keys=True).encode()
            if not isinstance(sig, str) or not auth.verify(_unhex(sig), "beat", key, body):
                log.warning("workers[%r] has no valid signature of this run: skipped", name)
                continue
            out[name] = beat
        return out


def _unhex(text: str) -> bytes:
    try:
        return bytes.fromhex(text)
    except ValueError:
        return b""


def _as_str(entry_id: bytes | str) -> str:
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)


def _next_id(entry_id: bytes | str) -> str:
    """The stream id right after entry_id (XTRIM MINID keeps ids >= its argument)."""
    ms, _, seq = _as_str(entry_id).partition("-")
    return f"{ms}-{int(seq or 0) + 1}"
