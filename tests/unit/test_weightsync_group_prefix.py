"""The rendezvous keys of a transfer group cannot be named by whoever reaches the weightsync store's port (torch's
TCPStore has no authentication): the prefix carries 128 random bits, new with every group, and travels only on the
run's authenticated gRPC calls."""

from __future__ import annotations

import re

from protos.grpo.v1 import weights_pb2, weightsync_pb2
from services.common.config import WeightsyncSection
from services.weightsync.service.servicer import WeightSyncServicer


def _prefix(servicer: WeightSyncServicer, sender: str, members: tuple[str, ...]) -> str:
    request = weightsync_pb2.PublishRequest(source=weights_pb2.DataSource(sender_id=sender), timeout_s=5)
    return servicer._group(request, 1, members).prefix


def test_a_groups_store_keys_carry_a_fresh_secret_no_stranger_can_guess():
    cfg = WeightsyncSection(transport="gloo")
    first, twin = WeightSyncServicer(cfg, 1234), WeightSyncServicer(cfg, 1234)
    a = _prefix(first, "trainer", ("rollout-0",))
    assert re.fullmatch(r"refit/1/[0-9a-f]{32}", a), a
    assert _prefix(first, "trainer", ("rollout-0",)) == a  # the same group is reused while it works
    b = _prefix(first, "trainer", ("rollout-0", "rollout-1"))
    assert b.startswith("refit/2/") and b[8:] != a[8:]  # a new membership, a new secret
    # Two services started alike (a restarted weightsync) do not repeat each other's keys.
    assert _prefix(twin, "trainer", ("rollout-0",)) != a
