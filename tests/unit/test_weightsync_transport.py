"""The transport contract: every registered transport implements all of it, and a gloo refit carries the
buckets and the commit behind them."""

import datetime
import inspect
import threading
import types

import pytest
import torch
import torch.distributed as dist

from services.common.ports import free_port
from services.weightsync.transfer.arrival import receive_buckets
from services.weightsync.transfer.commit import Commit
from services.weightsync.transfer.pack import new_ring, packed_buckets
from services.weightsync.transfer.plan import ReceiverLayout, layout_of, make_plan
from services.weightsync.transports import NAMES, REGISTRY, Transports, choose, kind
from services.weightsync.transports.base import Transfer, Transport

CONTRACT = [n for n, f in inspect.getmembers(Transport, inspect.isfunction) if not n.startswith("_")]


def _gloo_transfer(port: int, prefix: str, rank: int, timeout_s: float = 30) -> Transfer:
    """A transfer in the two-rank gloo group `prefix` of the store at `port`."""
    group = types.SimpleNamespace(
        store_host="127.0.0.1", store_port=port, prefix=prefix, world_size=2, rank=rank, backend="gloo",
        timeout_s=timeout_s,
    )  # fmt: skip
    return Transfer(group, None, prefix)


@pytest.mark.parametrize("name", NAMES)
def test_every_registered_transport_implements_the_whole_contract(name):
    cls = REGISTRY[name]
    assert issubclass(cls, Transport) and not inspect.isabstract(cls), cls.__abstractmethods__
    assert cls.name == name and cls.device_type in ("cpu", "cuda") and cls.max_senders >= 1
    transport = cls()  # cheap: nothing is opened before a refit needs it
    for method in CONTRACT:
        ours, theirs = inspect.signature(getattr(Transport, method)), inspect.signature(getattr(cls, method))
        assert list(theirs.parameters) == list(ours.parameters), (name, method)
        assert callable(getattr(transport, method))


def test_the_registry_names_the_choices():
    with pytest.raises(ValueError) as e:
        kind("smoke-signals")
    assert all(t in str(e.value) for t in NAMES)


def test_auto_is_gloo_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert choose("auto") == "gloo"
    assert choose("ucxx") == "ucxx"


def test_a_gloo_refit_carries_every_bucket_and_then_the_commit():
    port = free_port()
    master = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(30))
    g = torch.Generator().manual_seed(0)
    named = [(f"t{i}", torch.randn(40 + i, generator=g)) for i in range(5)]
    plan = make_plan(layout_of(named), ReceiverLayout(), 256)
    commit = Commit(("a", "b"))

    def transfer(rank: int) -> Transfer:
        return _gloo_transfer(port, "t", rank)

    got = {}

    def receive() -> None:
        transport = Transports().get("gloo")
        got["buckets"], got["sums"] = receive_buckets(transport, transfer(1), list(plan.bucket_nbytes), "xxh3")
        got["commit"] = Commit.decode(transport.receive_commit(transfer(1)))

    thread = threading.Thread(target=receive)
    thread.start()
    sender, sums = Transports().get("gloo"), []
    ring = new_ring(plan, torch.device("cpu"), 2)
    sent = [b.clone() for _, b in packed_buckets(plan, dict(named), ring, [])]
    buckets = packed_buckets(plan, dict(named), ring, sums)
    sender.send(transfer(0), buckets, plan.bucket_nbytes, (0,) * plan.num_buckets)
    sender.send_commit(transfer(0), commit.encode())
    thread.join(30)
    assert got["sums"] == sums and all(torch.equal(a, b) for a, b in zip(got["buckets"], sent, strict=True))
    assert got["commit"] == commit
    del master


def test_a_group_whose_peers_never_come_does_not_hold_up_another_groups_refit():
    """A receiver stuck in one group's rendezvous (its sender never joins: a dead trainer, or a hostile LoadWeights
    with a long timeout) must not block the next refit's group, which has peers and a deadline of its own."""
    port = free_port()
    master = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(30))
    receiver, sender = Transports().get("gloo"), Transports().get("gloo")
    stuck_error = []

    def wait_for_nobody() -> None:  # nobody ever sends on this group: it waits out its 6 s and fails
        try:
            receiver.receive(_gloo_transfer(port, "nobody", 1, 6), 0, torch.empty(8))
        except Exception as e:
            stuck_error.append(e)

    stuck = threading.Thread(target=wait_for_nobody)
    stuck.start()
    got = torch.zeros(8)
    honest = threading.Thread(target=lambda: receiver.receive(_gloo_transfer(port, "honest", 1, 10), 0, got))
    honest.start()
    sender.send(_gloo_transfer(port, "honest", 0, 10), iter([(0, torch.arange(8.0))]), [32], (0,))
    honest.join(5)
    assert not honest.is_alive() and torch.equal(got, torch.arange(8.0))
    assert stuck.is_alive()  # the refit went through while the other group was still waiting
    stuck.join(30)
    assert len(stuck_error) == 1
    del master


def test_the_config_offers_exactly_the_registered_transports():
    import typing

    from services.common.config import WeightsyncSection

    assert typing.get_args(WeightsyncSection.model_fields["transport"].annotation) == ("auto", *NAMES)


def test_a_cuda_ipc_sender_whose_packing_fails_still_lets_the_receivers_reach_its_commit():
    """Without "ready" the receivers would wait for bytes until the group's deadline (600 s in the GPU bench) before
    reading the commit that says the version was aborted."""
    from services.weightsync.transports.cuda_ipc import CudaIpcTransport

    transport, store = CudaIpcTransport(), dist.HashStore()
    transport.store = lambda group: store
    group = types.SimpleNamespace(timeout_s=1, rank=0, world_size=2)
    transfer = Transfer(group, types.SimpleNamespace(ipc_buffers=[object()]), "refit-1")

    def buckets():
        raise RuntimeError("packing kernel failed")
        yield

    with pytest.raises(RuntimeError, match="packing kernel failed"):
        transport.send(transfer, buckets(), [16], [0])
    store.wait([f"{transfer.tag}/ready"], datetime.timedelta(seconds=1))  # set, so a receiver's view goes on
