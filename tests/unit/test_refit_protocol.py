"""One refit through the real weightsync service and rollout servicers, in one process over gloo: the RPCs
it costs (3 from the sender, 1 per endpoint, none back into the service) and its verification."""

from __future__ import annotations

import collections
import datetime
from concurrent import futures

import grpc
import pytest
import torch
import torch.distributed as dist

from protos.grpo.v1 import rollout_pb2_grpc, weightsync_pb2, weightsync_pb2_grpc
from services.common.config import WeightsyncSection
from services.common.grpcio import channel
from services.common.ports import free_port
from services.rollout.servicer import EngineState, RolloutServicer
from services.weightsync.service.servicer import WeightSyncServicer
from services.weightsync.transfer.sender import Sender


class Counting(grpc.ServerInterceptor):
    def __init__(self, calls: collections.Counter):
        self.calls = calls

    def intercept_service(self, continuation, handler_call_details):
        service, method = handler_call_details.method.rsplit("/", 2)[-2:]  # "/grpo.v1.Rollout/LoadWeights"
        self.calls[f"{service.rsplit('.', 1)[-1]}.{method}"] += 1
        return continuation(handler_call_details)


class DictEngine:
    """An engine that holds its weights in a dict, as the HF engine exposes them."""

    dtype = torch.float32

    def __init__(self):
        self.weights: dict[str, torch.Tensor] = {}

    def load_weights(self, named):
        self.weights.update((n, t.clone()) for n, t in named)

    def read_weights(self):
        return self.weights


def _server(calls, add) -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(8), interceptors=[Counting(calls)])
    add(server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
def refit_services():
    store = dist.TCPStore(
        "127.0.0.1", free_port(), is_master=True, wait_for_workers=False, timeout=datetime.timedelta(30)
    )
    cfg = WeightsyncSection(host="127.0.0.1", transport="gloo", timeout_s=30)
    calls: collections.Counter = collections.Counter()
    servicer = WeightSyncServicer(cfg, store.port)
    ws, ws_address = _server(calls, lambda s: weightsync_pb2_grpc.add_WeightSyncServicer_to_server(servicer, s))
    engines, servers = [DictEngine(), DictEngine()], [ws]
    for i, engine in enumerate(engines):
        rollout = RolloutServicer(EngineState(engine, f"worker-{i}", "dict"))
        server, address = _server(calls, lambda s, r=rollout: rollout_pb2_grpc.add_RolloutServicer_to_server(r, s))
        servers.append(server)
        with channel(ws_address) as ch:
            endpoint = weightsync_pb2.Endpoint(endpoint_id=f"rollout-{i}", grpc_address=address, dtype="float32")
            weightsync_pb2_grpc.WeightSyncStub(ch).RegisterEndpoint(endpoint, timeout=5)
    calls.clear()
    yield ws_address, engines, calls
    for server in servers:
        server.stop(0)


def test_a_refit_costs_three_rpcs_and_two_per_endpoint_and_none_back_into_the_service(refit_services):
    address, engines, calls = refit_services
    g = torch.Generator().manual_seed(0)
    named = [(f"layer{i}.weight", torch.randn(16, 8 + i, generator=g)) for i in range(6)]
    sender = Sender("test-sender")
    for version in (1, 2):
        result = sender.publish(named, version, address, bucket_bytes=1024, timeout_s=30)
        assert set(result.received_checksums.values()) == {result.checksum}
        assert result.num_readback_verified == len(named)
        for engine in engines:
            assert all(torch.equal(engine.weights[n], t) for n, t in named)
    per_refit = {"WeightSync.Layout": 1, "WeightSync.PublishVersion": 1, "WeightSync.AwaitVersion": 1}
    # Each endpoint is asked Info (is it alive, or hung?) before the group is formed, then its LoadWeights.
    per_refit["Rollout.Info"] = per_refit["Rollout.LoadWeights"] = len(engines)
    assert calls == collections.Counter({k: 2 * v for k, v in per_refit.items()})
