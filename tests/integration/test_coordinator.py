"""The coordinator's control API, CLI and HTTP status endpoint, on real Redis and real gRPC."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import grpc
import pytest

from protos.grpo.v1 import coordinator_pb2
from services.common.grpcio import channel, wait_healthy
from services.common.ports import free_port
from services.common.queue import WORKERS_KEY, connect
from services.coordinator.client import CoordinatorClient


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.read()


def _until(fn, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while True:
        value = fn()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.2)


@pytest.fixture
def coordinator(services, tiny_model, redis_url, tmp_path):
    grpc_port, http_port, trainer_port = free_port(), free_port(), free_port()
    _, path = services.config(
        [
            f'model.path="{tiny_model}"',
            f'redis.url="{redis_url}"',
            'redis.prompts_stream="prompts-ctl"',
            'redis.trajectories_stream="trajectories-ctl"',
            f'run.output_dir="{tmp_path}"',
            'run.run_id="ctl"',
            f"coordinator.grpc_port={grpc_port}",
            f"coordinator.http_port={http_port}",
            f"trainer.grpc_port={trainer_port}",  # nobody serves it: a run must fail cleanly
            "coordinator.rpc_timeout_s=5",
        ]
    )
    services.start("coordinator", ["-m", "services.coordinator.main", "--config", str(path)])
    wait_healthy(f"127.0.0.1:{grpc_port}", 60)
    return f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{http_port}"


def test_status_endpoint_and_prometheus_metrics(coordinator, redis_url):
    _, http = coordinator
    assert _until(lambda: _safe_get(f"{http}/healthz")) == (200, b'{"ok":true}')
    # Entries in the workers hash that are not heartbeats (a stale or foreign writer) are skipped, not a 500.
    r = connect(redis_url)
    bad = {"ctl-bad-bytes": b"\x00not json", "ctl-no-ts": b'{"policy_version": 1}', "ctl-list": b"[1]"}
    r.hset(WORKERS_KEY, mapping=bad)
    try:
        code, body = _get(f"{http}/status")
        assert code == 200 and not set(bad) & set(json.loads(body)["workers"])
    finally:
        r.hdel(WORKERS_KEY, *bad)
    status = json.loads(_get(f"{http}/status")[1])
    assert {"run_id", "state", "step", "policy_version", "last_metrics", "queues", "workers", "alerts"} <= set(status)
    assert (status["run_id"], status["state"], status["step"], status["alerts"]) == ("ctl", "idle", 0, [])
    assert {"prompts_len", "prompts_pending", "trajectories_len"} <= set(status["queues"])
    code, body = _get(f"{http}/metrics")
    assert code == 200 and b"grpo_reward_mean" in body and b"grpo_queue_depth" in body
    assert b"grpo_alert_eval_accuracy_drop" in body and b"grpo_alert_entropy_shift" in body


def _safe_get(url: str):
    try:
        return _get(url)
    except OSError:
        return None


def test_cli_and_a_run_that_fails_leave_the_server_up(coordinator):
    address, http = coordinator
    out = subprocess.run(
        [sys.executable, "-m", "services.coordinator.cli", address, "status"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert json.loads(out.stdout)["run_id"] == "ctl"
    with CoordinatorClient(address) as client:
        started = client.start_run(num_steps=1)
        assert started.state == coordinator_pb2.RUN_STATE_RUNNING
        with pytest.raises(grpc.RpcError) as e:
            client.start_run(num_steps=1)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # No rollout worker and no trainer: the step cannot finish; stopping ends it cleanly.
        client.stop_run()
        final = _until(lambda: (s := client.status()).state != coordinator_pb2.RUN_STATE_RUNNING and s)
        assert final.state == coordinator_pb2.RUN_STATE_STOPPED
        assert "stopped" in final.error
        assert json.loads(_get(f"{http}/status")[1])["state"] == "stopped"


def test_malformed_rpc_gets_invalid_argument(coordinator):
    address, _ = coordinator
    with channel(address) as ch:
        with pytest.raises(grpc.RpcError) as e:
            ch.unary_unary("/grpo.v1.Coordinator/StartRun")(
                b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", timeout=5
            )
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with CoordinatorClient(address) as client:
        assert client.status().run_id == "ctl"
        # A step count past what the status can carry is refused before the run starts: accepted, it made every
        # later GetStatus and StopRun fail to serialize (step + num_steps beyond uint64) for the process's life.
        before = client.status().state
        with pytest.raises(grpc.RpcError) as e:
            client.start_run(num_steps=2**64 - 1)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "num_steps must be in 1.." in e.value.details()
        assert client.status().state == before != coordinator_pb2.RUN_STATE_RUNNING


def test_scale_rollout_sets_the_wanted_workers_and_refuses_bad_counts(coordinator, redis_url):
    address, _ = coordinator
    with CoordinatorClient(address) as client:
        assert client.status().num_rollout_workers == 1  # rollout.num_workers
        for bad in (0, 65):
            with pytest.raises(grpc.RpcError) as e:
                client.scale_rollout(bad)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "num_workers must be in 1..64" in str(e.value)
        assert client.scale_rollout(3).num_rollout_workers == 3
    r = connect(redis_url)
    beats = {"ctl-live@h:1": json.dumps({"ts": time.time(), "policy_version": 2, "groups_done": 5})}
    beats["ctl-gone@h:2"] = json.dumps({"ts": time.time() - 60, "policy_version": 1})
    r.hset(WORKERS_KEY, mapping=beats)
    try:
        cli = [sys.executable, "-m", "services.coordinator.cli", address, "workers", "--set", "2"]
        out = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    finally:
        r.hdel(WORKERS_KEY, *beats)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("rollout workers: 2 wanted")
    assert "ctl-live@h:1  policy v2  5 groups" in out.stdout and "ctl-gone" not in out.stdout
