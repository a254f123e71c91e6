"""Supervise a launched run from its launcher: signals, every service ready, the run started and shown to its end."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable

import grpc

from services.common.config import RunConfig


def stop_on_sigterm() -> None:
    """SIGTERM (`make down`, `scancel`) and SIGHUP (the terminal closed) unwind like Ctrl-C, so the launcher's
    cleanup still runs. Ctrl-C itself is armed again: a resumed run's launcher comes here after the cleanup of the
    attempt before, which ignored it (shield_cleanup)."""

    def interrupt(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGHUP, interrupt)


def shield_cleanup() -> None:
    """From here on Ctrl-C, SIGTERM and SIGHUP are ignored: a second one must not cut the stopping of services
    short."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)


def wait_ready(addresses: list[str], check_alive: Callable[[], None], timeout_s: float = 600.0) -> None:
    """Until every gRPC address is healthy; check_alive raises as soon as a service died."""
    from services.common.grpcio import wait_healthy

    deadline = time.monotonic() + timeout_s
    for address in addresses:
        while True:
            check_alive()
            try:
                wait_healthy(address, timeout_s=2.0)
                break
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{address} not healthy after {timeout_s:.0f}s") from None


def run_to_end(
    cfg: RunConfig,
    coordinator: str,
    status_url: str,
    check_alive: Callable[[], None],
    scale_rollout: Callable[[int], None] = lambda num_workers: None,
) -> int:
    """Start the run on the coordinator at `coordinator`, print a row per step; 0 when it ends DONE.

    scale_rollout: called with the rollout workers the coordinator wants at each poll (deploy/scale.py)."""
    from protos.grpo.v1 import coordinator_pb2
    from services.common import auth, tls
    from services.coordinator.client import CoordinatorClient

    print(f"status: {status_url}", flush=True)
    run_dir = f"{cfg.run.output_dir}/{cfg.run.run_id}"
    with CoordinatorClient(coordinator, secret=auth.run_secret(run_dir), creds=tls.load(run_dir)) as client:
        done = client.status().step  # a resumed run (run.resume) starts at its checkpoint's step
        if done:
            print(f"resuming run {cfg.run.run_id} at step {done} of {cfg.run.num_steps}", flush=True)
        if done >= cfg.run.num_steps:
            print(f"run {cfg.run.run_id} has all {cfg.run.num_steps} steps already", flush=True)
            return 0
        status = _show_steps(client, client.start_run(cfg.run.num_steps - done), check_alive, scale_rollout)
    if status.state == coordinator_pb2.RUN_STATE_FAILED:
        _blame_a_death(check_alive)
    state = coordinator_pb2.RunState.Name(status.state)
    print(f"run {cfg.run.run_id} ended: {state} after {status.step} steps; {run_dir}/metrics.jsonl", flush=True)
    if status.error:
        print(f"error: {status.error}", file=sys.stderr)
    return 0 if status.state == coordinator_pb2.RUN_STATE_DONE else 1


DEATH_GRACE_S = 15.0
"""After a failed step, how long the launcher waits to see whether a service is dying (torchrun takes a few seconds
to end its other ranks after one died): a death makes the run resume, a failure with every service alive ends it."""


def _blame_a_death(check_alive: Callable[[], None]) -> None:
    deadline = time.monotonic() + DEATH_GRACE_S
    while time.monotonic() < deadline:
        check_alive()
        time.sleep(0.5)


def _show_steps(client, status, check_alive: Callable[[], None], scale_rollout: Callable[[int], None]):
    """A row and a progress tick per finished step while the run is running; returns its last status."""
    from tqdm import tqdm

    from protos.grpo.v1 import coordinator_pb2
    from services.coordinator.metrics import header, row

    bar = tqdm(total=status.num_steps, unit="step", dynamic_ncols=True)
    bar.write(header())
    shown = 0
    while status.state == coordinator_pb2.RUN_STATE_RUNNING:
        time.sleep(0.5)
        check_alive()
        try:
            status = client.status()
        except grpc.RpcError:
            _blame_a_death(check_alive)  # the coordinator itself, most likely
            raise
        scale_rollout(status.num_rollout_workers)
        if status.step > shown:
            bar.write(row(dict(status.last_metrics)))
            bar.update(status.step - shown)
            shown = status.step
    bar.close()
    return status
