"""Coordinator gRPC control API: start, status, stop."""

from __future__ import annotations

from protos.grpo.v1 import coordinator_pb2_grpc
from services.common.grpcio import servicer_edge

from .runner import Runner


class CoordinatorServicer(coordinator_pb2_grpc.CoordinatorServicer):
    def __init__(self, runner: Runner, default_num_steps: int):
        self.runner, self.default_num_steps = runner, default_num_steps

    @servicer_edge
    def StartRun(self, request, context):
        self.runner.start(request.num_steps or self.default_num_steps)
        return self.runner.state.to_proto()

    @servicer_edge
    def GetStatus(self, request, context):
        return self.runner.state.to_proto()

    @servicer_edge
    def StopRun(self, request, context):
        self.runner.stop()
        return self.runner.state.to_proto()
