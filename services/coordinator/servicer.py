"""Coordinator gRPC control API: start, status, stop, and the number of rollout workers."""

from __future__ import annotations

import time

from protos.grpo.v1 import coordinator_pb2, coordinator_pb2_grpc
from services.common.grpcio import servicer_edge
from services.common.queue import WorkQueue

from .refits import HEARTBEAT_FRESH_S
from .runner import Runner

MAX_ROLLOUT_WORKERS = 64
"""The most rollout workers ScaleRollout asks for: past it a count is more likely a typo than a plan."""


class CoordinatorServicer(coordinator_pb2_grpc.CoordinatorServicer):
    def __init__(self, runner: Runner, default_num_steps: int):
        self.runner, self.default_num_steps = runner, default_num_steps

    @servicer_edge
    def StartRun(self, request, context):
        self.runner.start(request.num_steps or self.default_num_steps)
        return self.runner.state.to_proto()

    @servicer_edge
    def GetStatus(self, request, context):
        status = self.runner.state.to_proto()
        if request.with_workers:
            status.rollout_workers.extend(live_workers(self.runner.loop.queue))
        return status

    @servicer_edge
    def StopRun(self, request, context):
        self.runner.stop()
        return self.runner.state.to_proto()

    @servicer_edge
    def ScaleRollout(self, request, context):
        if not 0 < request.num_workers <= MAX_ROLLOUT_WORKERS:
            raise ValueError(f"num_workers must be in 1..{MAX_ROLLOUT_WORKERS}, got {request.num_workers}")
        with self.runner.state.lock:
            self.runner.state.num_rollout_workers = request.num_workers
        return self.runner.state.to_proto()


def live_workers(queue: WorkQueue) -> list[coordinator_pb2.RolloutWorker]:
    """The workers whose last heartbeat is fresh, by id (the hash keeps the beats of workers long gone)."""
    now = time.time()
    return [
        coordinator_pb2.RolloutWorker(
            worker_id=worker,
            policy_version=beat.get("policy_version", 0),
            joining=bool(beat.get("joining")),
            groups_done=beat.get("groups_done", 0),
            heartbeat_age_s=now - beat["ts"],
        )
        for worker, beat in sorted(queue.workers().items())
        if now - beat["ts"] < HEARTBEAT_FRESH_S
    ]
