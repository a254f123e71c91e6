"""Publishing the trainer's weights to the rollout engines: retried when an engine died during it, and again for
workers that joined mid-run (a restart, an added worker) and wait for the current version before taking work."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import grpc

from protos.grpo.v1 import trainer_pb2, trainer_pb2_grpc
from services.common.queue import WorkQueue

log = logging.getLogger(__name__)

RETRY_FOR_S = 300.0
"""How long one refit is tried again (after 1 s, doubling up to 15 s) while its transfer fails: weightsync leaves out
an engine that no longer answers, so a refit that failed because an engine died during it goes to the survivors
the next time; with no engine left, it waits for the launcher's restarted one (a GPU vLLM engine starts in ~1 min)."""
JOINER_CHECK_S = 2.0
"""How often the coordinator looks for joining workers while it waits for a batch."""
HEARTBEAT_FRESH_S = 10.0
"""A heartbeat older than this is a worker that is gone."""


@dataclass
class Refit:
    """One version published to the engines: the trainer's reply, and the call's seconds (retries included)."""

    reply: trainer_pb2.PublishWeightsReply
    seconds: float


class Refits:
    def __init__(self, trainer: trainer_pb2_grpc.TrainerStub, queue: WorkQueue, rpc_timeout_s: float):
        self.trainer, self.queue, self.rpc_timeout_s = trainer, queue, rpc_timeout_s
        self._checked_at = 0.0

    def publish(self, what: str) -> Refit:
        """The trainer's current version to every engine that answers; raises once RETRY_FOR_S has passed."""
        start = time.perf_counter()
        deadline, wait_s, attempt = time.monotonic() + RETRY_FOR_S, 1.0, 1
        while True:
            try:
                # timeout_s=0: the refit deadline is the trainer's own (weightsync.timeout_s); ours bounds the call.
                reply = self.trainer.PublishWeights(
                    trainer_pb2.PublishWeightsRequest(timeout_s=0), timeout=self.rpc_timeout_s
                )
                return Refit(reply, time.perf_counter() - start)
            except grpc.RpcError as e:
                # FAILED_PRECONDITION: the trainer is fine and its weights unchanged, the transfer failed.
                if e.code() != grpc.StatusCode.FAILED_PRECONDITION or time.monotonic() + wait_s > deadline:
                    raise
                log.warning("%s: refit try %d failed, again in %.0fs: %s", what, attempt, wait_s, e.details())
            time.sleep(wait_s)
            wait_s, attempt = min(2 * wait_s, 15.0), attempt + 1

    def catch_up_joiners(self, policy_version: int) -> None:
        """Publish the current version again when a live worker says it is joining and does not hold it yet (a
        collective transport cannot hand a joiner the weights by itself). Looks at most every JOINER_CHECK_S."""
        if policy_version == 0 or time.monotonic() - self._checked_at < JOINER_CHECK_S:
            return
        self._checked_at = time.monotonic()
        now = time.time()
        beats = self.queue.workers().items()
        joining = [
            worker
            for worker, beat in beats
            if beat.get("joining") and now - beat["ts"] < HEARTBEAT_FRESH_S and beat["policy_version"] < policy_version
        ]
        if joining:
            log.info("workers joining without version %d: %s; publishing it again", policy_version, ", ".join(joining))
            self.publish(f"catching up {', '.join(joining)}")
