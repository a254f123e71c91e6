"""Python client of the coordinator's gRPC control API."""

from __future__ import annotations

from pathlib import Path

from protos.grpo.v1 import coordinator_pb2, coordinator_pb2_grpc
from services.common import auth, tls
from services.common.grpcio import channel


class CoordinatorClient:
    """secret: the run's (its folder's run.secret); without one, this process's (GRPO_RUN_SECRET, or the run a
    service of which this process is), else none: GetStatus answers, the calls that change the run are refused."""

    def __init__(
        self, address: str, timeout_s: float = 30.0, secret: str | None = None, creds: tls.Credentials | None = None
    ):
        self._channel = channel(address, secret, creds)
        self._stub = coordinator_pb2_grpc.CoordinatorStub(self._channel)
        self.timeout_s = timeout_s

    @classmethod
    def for_run(cls, run_dir: str | Path, timeout_s: float = 30.0) -> CoordinatorClient:
        """The client of the run in run_dir: its coordinator's address (config.toml), its secret (run.secret) and,
        for a run.tls run, its TLS files (tls/)."""
        import tomllib

        coordinator = tomllib.loads((Path(run_dir) / "config.toml").read_text())["coordinator"]
        address = f"{coordinator['host']}:{coordinator['grpc_port']}"
        return cls(address, timeout_s, auth.run_secret(run_dir), tls.load(run_dir))

    def start_run(self, num_steps: int = 0) -> coordinator_pb2.RunStatus:
        return self._stub.StartRun(coordinator_pb2.StartRunRequest(num_steps=num_steps), timeout=self.timeout_s)

    def status(self, with_workers: bool = False) -> coordinator_pb2.RunStatus:
        request = coordinator_pb2.GetStatusRequest(with_workers=with_workers)
        return self._stub.GetStatus(request, timeout=self.timeout_s)

    def stop_run(self) -> coordinator_pb2.RunStatus:
        return self._stub.StopRun(coordinator_pb2.StopRunRequest(), timeout=self.timeout_s)

    def scale_rollout(self, num_workers: int) -> coordinator_pb2.RunStatus:
        request = coordinator_pb2.ScaleRolloutRequest(num_workers=num_workers)
        return self._stub.ScaleRollout(request, timeout=self.timeout_s)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> CoordinatorClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
