"""Rank 0 drives the other ranks: each command is an opcode plus request bytes, broadcast on a gloo group."""

from __future__ import annotations

import threading
import time

import torch
import torch.distributed as dist
from google.protobuf.message import Message

from .commands import Executor, Op

_STOP_CHECK_S = 0.1
# A follower told to stop waits this long for rank 0's SHUTDOWN before concluding rank 0 is gone;
# longer than rank 0's gRPC grace period, shorter than torchrun's 30 s before SIGKILL.
_FOLLOWER_GRACE_S = 10.0


class CommandChannel:
    """Broadcasts (opcode, payload length) then the payload bytes; never pickle."""

    def __init__(self, group: dist.ProcessGroup):
        self.group = group

    def send(self, op: Op, payload: bytes) -> None:
        dist.broadcast(torch.tensor([int(op), len(payload)], dtype=torch.int64), src=0, group=self.group)
        if payload:
            dist.broadcast(torch.frombuffer(bytearray(payload), dtype=torch.uint8), src=0, group=self.group)

    def receive(self, stop: threading.Event) -> tuple[Op, bytes] | None:
        """The next command, or None if stop was set and rank 0 sent nothing within the grace period."""
        header_2 = torch.zeros(2, dtype=torch.int64)
        work = dist.broadcast(header_2, src=0, group=self.group, async_op=True)
        # A blocking wait() in C++ on this thread would keep the signal handler from running, and polling
        # is_completed() made every command wait for the next poll (rank 0 blocks in the payload's
        # broadcast meanwhile: 10 ms per refit with a 10 ms poll). A helper thread waits instead and
        # wakes this one at once.
        arrived = threading.Event()
        threading.Thread(target=_wait_then_set, args=(work, arrived), name="command-wait", daemon=True).start()
        deadline = None
        while not arrived.wait(_STOP_CHECK_S):
            if stop.is_set():
                deadline = deadline or time.monotonic() + _FOLLOWER_GRACE_S
                if time.monotonic() > deadline:
                    return None
        work.wait()  # raises here if the broadcast failed (rank 0 gone)
        op, num_bytes = Op(int(header_2[0])), int(header_2[1])
        payload_B = torch.empty(num_bytes, dtype=torch.uint8)
        if num_bytes:
            dist.broadcast(payload_B, src=0, group=self.group)
        return op, payload_B.numpy().tobytes()


def _wait_then_set(work, done: threading.Event) -> None:
    try:
        work.wait()
    except Exception:  # the receiving thread calls wait() again, and raises
        pass
    finally:
        done.set()


class Driver:
    """Rank 0's side: one command at a time, run locally after the others have been told."""

    def __init__(self, channel: CommandChannel, executor: Executor):
        self.channel, self.executor = channel, executor
        self._lock = threading.Lock()

    def call(self, op: Op, request: Message) -> Message | None:
        payload = request.SerializeToString()
        with self._lock:
            self.channel.send(op, payload)
            # Rank 0 runs the same bytes the others decode, so every rank sees the identical request.
            return self.executor.run(op, payload)

    def ping(self) -> None:
        """Send PING unless a command is running (that one keeps the followers busy anyway)."""
        if self._lock.acquire(blocking=False):
            try:
                self.channel.send(Op.PING, b"")
            finally:
                self._lock.release()

    def shutdown(self) -> None:
        with self._lock:
            self.channel.send(Op.SHUTDOWN, b"")


def follow(channel: CommandChannel, executor: Executor, stop: threading.Event) -> bool:
    """Run rank 0's commands until SHUTDOWN (True), or until rank 0 is gone after a stop signal (False)."""
    while True:
        command = channel.receive(stop)
        if command is None:
            return False
        op, payload = command
        if op is Op.SHUTDOWN:
            return True
        if op is not Op.PING:
            executor.run(op, payload)
