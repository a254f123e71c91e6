"""The locked control plane on real servers: every call of every service that changes state needs the run secret
(services/common/auth.py); without it, or with a wrong one, the call is UNAUTHENTICATED and nothing changes."""

from __future__ import annotations

import subprocess
import sys

import grpc
import pytest

from protos.grpo.v1 import (
    coordinator_pb2,
    rollout_pb2,
    rollout_pb2_grpc,
    trainer_pb2,
    weightsync_pb2,
    weightsync_pb2_grpc,
)
from services.common import auth
from services.common.grpcio import LOCKED, OPEN, channel, request_limit, wait_healthy
from services.common.ports import free_port
from services.coordinator.client import CoordinatorClient

PROTOS = {"coordinator": coordinator_pb2, "rollout": rollout_pb2, "trainer": trainer_pb2, "weightsync": weightsync_pb2}


def _methods(module) -> list[str]:
    return [f"/{s.full_name}/{m.name}" for s in module.DESCRIPTOR.services_by_name.values() for m in s.methods]


def test_every_rpc_of_every_proto_is_either_open_or_locked_with_a_reason():
    ours = {m for module in PROTOS.values() for m in _methods(module)}
    decided = {m for m in {**OPEN, **LOCKED} if not m.startswith("/grpc.health")}
    assert ours == decided, f"without a decision: {sorted(ours - decided)}; stale: {sorted(decided - ours)}"
    assert not set(OPEN) & set(LOCKED)
    assert all(reason.strip() for reason in {**OPEN, **LOCKED}.values())


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model, redis_url):
    """The four services of one run whose folder holds a secret, as the launcher leaves it."""
    from deploy.procs import spawn, stop_all
    from services.common.config import dump_toml, load_config

    tmp = tmp_path_factory.mktemp("auth")
    run_dir = tmp / "locked"
    secret = auth.read_secret(auth.ensure_secret(run_dir))
    ports = {name: free_port() for name in ("coordinator", "http", "trainer", "weightsync", "store", "rollout")}
    cfg = load_config(
        None,
        [
            f'model.path="{tiny_model}"',
            f'redis.url="{redis_url}"',
            'redis.prompts_stream="prompts-auth"',
            'redis.trajectories_stream="trajectories-auth"',
            f'run.output_dir="{tmp}"',
            'run.run_id="locked"',
            f"coordinator.grpc_port={ports['coordinator']}",
            f"coordinator.http_port={ports['http']}",
            f"trainer.grpc_port={ports['trainer']}",
            "trainer.num_ranks=1",
            f"weightsync.grpc_port={ports['weightsync']}",
            f"weightsync.store_port={ports['store']}",
            "weightsync.timeout_s=30",
            f"rollout.grpc_port={ports['rollout']}",
            'rollout.engine="hf"',
        ],
    )
    path = run_dir / "config.toml"
    path.write_text(dump_toml(cfg))
    logs, started = run_dir / "logs", []
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"]
    for name, args in [
        ("weightsync", ["-m", "services.weightsync.main"]),
        ("trainer", [*torchrun, "-m", "services.trainer.main"]),
        ("rollout", ["-m", "services.rollout.main", "--worker-index", "0"]),
        ("coordinator", ["-m", "services.coordinator.main"]),
    ]:
        started.append(spawn(name, [*args, "--config", str(path)], logs))
    addresses = {name: f"127.0.0.1:{ports[name]}" for name in PROTOS}
    try:
        for address in addresses.values():
            wait_healthy(address, 180)
        pids = {s.name: s.proc.pid for s in started}
        yield {"dir": run_dir, "secret": secret, "addresses": addresses, "coordinator": addresses["coordinator"],
               "pids": pids}  # fmt: skip
    finally:
        stop_all(started)


def _call(address: str, method: str, metadata: list[tuple[str, str]]) -> grpc.StatusCode:
    """The method with an empty request (valid for every message) and only the metadata given."""
    with grpc.insecure_channel(address) as ch:
        try:
            ch.unary_unary(method)(b"", metadata=metadata, timeout=20)
            return grpc.StatusCode.OK
        except grpc.RpcError as e:
            return e.code()


def _state(run) -> tuple:
    with CoordinatorClient(run["coordinator"]) as client:
        status = client.status()
    with channel(run["addresses"]["weightsync"]) as ch:
        ws = weightsync_pb2_grpc.WeightSyncStub(ch).Status(weightsync_pb2.StatusRequest(), timeout=10)
    with channel(run["addresses"]["rollout"]) as ch:
        info = rollout_pb2_grpc.RolloutStub(ch).Info(rollout_pb2.InfoRequest(), timeout=10)
    files = sorted(p.relative_to(run["dir"]).as_posix() for p in run["dir"].rglob("*") if "logs" not in p.parts)
    return (
        status.state,
        status.step,
        status.num_rollout_workers,
        ws.policy_version,
        len(ws.endpoints),
        info.policy_version,
        files,
    )


def test_every_locked_call_is_refused_without_the_secret_and_changes_nothing(run):
    before = _state(run)
    refused = []
    for service, module in PROTOS.items():
        for method in _methods(module):
            for metadata in ([], [(auth.METADATA_KEY, "0" * 64)], [(auth.METADATA_KEY, run["secret"][:-1])]):
                code = _call(run["addresses"][service], method, metadata)
                if method in OPEN:
                    assert code != grpc.StatusCode.UNAUTHENTICATED, method
                else:
                    assert code == grpc.StatusCode.UNAUTHENTICATED, (method, metadata, code)
                    refused.append(method)
    assert len(set(refused)) == len(LOCKED)
    assert _state(run) == before


def _rss_MiB(pid: int) -> float:
    fields = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024


def test_a_request_over_its_calls_limit_is_refused_before_it_is_parsed(run):
    """Each call takes what it needs (a batch, a manifest, a path): one byte more is RESOURCE_EXHAUSTED, with or
    without the secret, and nothing changes; a 200 MiB status request is not even received whole."""
    before = _state(run)
    secret = [(auth.METADATA_KEY, run["secret"])]
    for service, module in PROTOS.items():
        for method in _methods(module):
            limit = request_limit(method)
            if limit > 2**20:
                continue  # a batch or a manifest: its limit is the server's own, checked below for one of them
            with grpc.insecure_channel(run["addresses"][service]) as ch:
                with pytest.raises(grpc.RpcError) as refused:
                    ch.unary_unary(method)(b"\x00" * (limit + 1), metadata=secret, timeout=20)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (method, refused.value)
    coordinator = run["pids"]["coordinator"]
    rss = _rss_MiB(coordinator)
    with grpc.insecure_channel(run["coordinator"]) as ch:
        with pytest.raises(grpc.RpcError) as refused:
            ch.unary_unary("/grpo.v1.Coordinator/GetStatus")(b"\x00" * (200 * 2**20), timeout=60)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert _rss_MiB(coordinator) - rss < 50, "the coordinator took the 200 MiB in"
    assert _state(run) == before


def test_the_runs_own_secret_opens_the_locked_calls(run, tmp_path):
    # The CLI reads the secret from the run folder; given host:port and no secret it is refused in one line.
    cli = [sys.executable, "-m", "services.coordinator.cli"]
    out = subprocess.run([*cli, run["coordinator"], "workers", "--set", "3"], capture_output=True, text=True)
    assert out.returncode != 0 and "UNAUTHENTICATED" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    with CoordinatorClient(run["coordinator"]) as client:
        assert client.status().num_rollout_workers == 1
    out = subprocess.run([*cli, str(run["dir"]), "workers", "--set", "3"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    with CoordinatorClient.for_run(run["dir"]) as client:
        assert client.status().num_rollout_workers == 3
        client.scale_rollout(1)
    secret_file = tmp_path / "secret"
    secret_file.write_text(run["secret"])
    secret_file.chmod(0o644)  # readable by others: refused before any call
    out = subprocess.run(
        [*cli, run["coordinator"], "stop", "--secret-file", str(secret_file)], capture_output=True, text=True
    )
    assert out.returncode != 0 and "chmod 600" in out.stderr


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "run.tls"])
def test_a_running_run_listens_on_its_host_alone_and_obeys_its_owner_alone(tmp_path, tiny_model, tls):
    """`make run`'s processes (vLLM, the trainer ranks, their stores, Redis) listen on 127.0.0.1 only; a stranger's
    StopRun is refused and the owner's, through the run folder, stops the run. With run.tls every service speaks
    mutual TLS: a stranger holding even the secret, but not the run's certificate, gets no further than the
    handshake; Redis too, which then needs a redis-server built with TLS (.ci/run installs Debian's)."""
    import os
    import shutil
    import time
    from pathlib import Path

    import psutil

    if tls and not shutil.which("redis-server"):
        pytest.skip("run.tls needs a redis-server built with TLS on PATH (apt install redis-server)")

    repo = Path(__file__).resolve().parents[2]
    launcher = subprocess.Popen(
        [sys.executable, "-m", "deploy.local", "--config", str(repo / "deploy/configs/local.toml")]
        + [f'run.output_dir="{tmp_path}"', 'run.run_id="listen"', f'model.path="{tiny_model}"', "run.num_steps=1000"]
        + [
            "trainer.num_ranks=2",
            "rollout.cpu_compile=false",
            "coordinator.num_prompts=2",
            f"run.tls={str(tls).lower()}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    run_dir = tmp_path / "listen"
    try:
        deadline = time.monotonic() + 300
        while not ((run_dir / "metrics.jsonl").exists() and (run_dir / "metrics.jsonl").read_text()):
            assert launcher.poll() is None and time.monotonic() < deadline, launcher.stdout.read().decode()[-3000:]
            time.sleep(0.5)
        ours = set()
        for p in psutil.Process(launcher.pid).children(recursive=True):
            ours.add(p.pid)
        for p in psutil.process_iter(["pid", "cmdline"]):  # services start in sessions of their own
            if str(run_dir) in " ".join(p.info["cmdline"] or []):
                ours |= {p.pid, *(c.pid for c in p.children(recursive=True))}
        listening = [c for c in psutil.net_connections("inet") if c.status == psutil.CONN_LISTEN and c.pid in ours]
        assert len(listening) >= 8  # Redis, 4 gRPC servers, 2 stores, the HTTP status, vLLM's and gloo's own
        elsewhere = [(c.laddr, c.pid) for c in listening if c.laddr.ip not in ("127.0.0.1", "::ffff:127.0.0.1")]
        assert not elsewhere, [(a, psutil.Process(pid).cmdline()[:6]) for a, pid in elsewhere]

        import tomllib

        co = tomllib.loads((run_dir / "config.toml").read_text())["coordinator"]
        stranger = subprocess.run(
            [sys.executable, "-m", "services.coordinator.cli", f"127.0.0.1:{co['grpc_port']}", "stop"],
            capture_output=True,
            text=True,
            env={k: v for k, v in os.environ.items() if k != auth.ENV},
        )
        assert stranger.returncode != 0 and ("UNAVAILABLE" if tls else "UNAUTHENTICATED") in stranger.stderr
        if tls:
            _redis_takes_the_runs_certificate_alone(run_dir, tmp_path / "stranger")
            cli = [sys.executable, "-m", "services.coordinator.cli", f"127.0.0.1:{co['grpc_port']}", "stop"]
            secret = ["--secret-file", str(run_dir / auth.FILE_NAME)]
            stranger = subprocess.run([*cli, *secret], capture_output=True, text=True,
                                      env={k: v for k, v in os.environ.items() if k != auth.ENV})  # fmt: skip
            assert stranger.returncode != 0 and "UNAVAILABLE" in stranger.stderr
        assert launcher.poll() is None
        owner = subprocess.run(
            [sys.executable, "-m", "services.coordinator.cli", str(run_dir), "stop"], capture_output=True, text=True
        )
        assert owner.returncode == 0, owner.stderr
        launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.send_signal(2)
            launcher.communicate(timeout=60)


def _redis_takes_the_runs_certificate_alone(run_dir, elsewhere):
    """A run.tls run's Redis: plaintext with the right password, TLS without a client certificate, and TLS with a
    certificate of another run's CA are cut off before a command; the run's certificate and password get in."""
    import tomllib
    from urllib.parse import urlsplit

    import redis

    from services.common import tls
    from services.common.redis_server import USER, password, ssl_options

    url = urlsplit(tomllib.loads((run_dir / "config.toml").read_text())["redis"]["url"])
    assert url.scheme == "rediss"
    login = {"host": url.hostname, "port": url.port, "username": USER, "password": password(auth.run_secret(run_dir))}
    theirs = {**ssl_options(tls.ensure(elsewhere)), "ssl_cert_reqs": "none"}
    for strangers in ({}, {"ssl": True, "ssl_cert_reqs": "none"}, {"ssl": True, **theirs}):
        with pytest.raises(redis.ConnectionError):
            redis.Redis(**login, **strangers, socket_timeout=5).ping()
    assert redis.Redis(**login, ssl=True, **ssl_options(run_dir / tls.DIR_NAME), socket_timeout=5).ping()


def test_a_refit_to_a_weightsync_of_another_run_is_refused_at_once_not_retried(tmp_path, tiny_model):
    """Two runs on one host, one's trainer pointed at the other's weightsync: PERMISSION_DENIED naming the secret,
    in seconds, where FAILED_PRECONDITION had the coordinator try again for RETRY_FOR_S (5 minutes)."""
    import time

    from deploy.procs import spawn, stop_all
    from services.common.config import dump_toml, load_config

    ours, theirs = "a" * 64, "b" * 64
    ports = {name: free_port() for name in ("trainer", "weightsync", "store")}
    cfg = load_config(
        None,
        [
            f'model.path="{tiny_model}"',
            f'run.output_dir="{tmp_path}"',
            f"trainer.grpc_port={ports['trainer']}",
            "trainer.num_ranks=1",
            f"weightsync.grpc_port={ports['weightsync']}",
            f"weightsync.store_port={ports['store']}",
        ],
    )
    path = tmp_path / "config.toml"
    path.write_text(dump_toml(cfg))
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"]
    started = [
        spawn("weightsync", ["-m", "services.weightsync.main", "--config", str(path)], tmp_path / "logs",
              {auth.ENV: theirs}),
        spawn("trainer", [*torchrun, "-m", "services.trainer.main", "--config", str(path)], tmp_path / "logs",
              {auth.ENV: ours}),
    ]  # fmt: skip
    try:
        for name in ("weightsync", "trainer"):
            wait_healthy(f"127.0.0.1:{ports[name]}", 180)
        start = time.monotonic()
        with grpc.insecure_channel(f"127.0.0.1:{ports['trainer']}") as ch:
            with pytest.raises(grpc.RpcError) as refused:
                ch.unary_unary("/grpo.v1.Trainer/PublishWeights")(b"", metadata=[(auth.METADATA_KEY, ours)], timeout=60)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, refused.value.details()
        assert "refused this trainer's run secret" in refused.value.details()
        assert time.monotonic() - start < 30
    finally:
        stop_all(started)
