"""What a refit did: its result on the sender, the error where an endpoint did not apply it, and the check
of what the endpoints received and read back against what was sent."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels import checksum as cs
from .pack import expected_tensor, unpack
from .plan import TransferPlan


@dataclass(frozen=True, slots=True)
class RefitResult:
    policy_version: int
    payload_bytes: int
    checksum: str
    num_endpoints: int
    publish_s: float
    received_checksums: dict[str, str]
    """Endpoint id -> checksum it recomputed over what arrived (equal to `checksum`)."""
    num_readback_verified: int
    """Tensors read back from every engine and found equal to the sent ones (min over endpoints, summed
    over sending ranks)."""
    apply_s: dict[str, float]
    """Endpoint id -> seconds its LoadWeights took (receive, verify, load, read back)."""


class RefitError(RuntimeError):
    """Some endpoint did not apply the version; the previous version stays in service there."""


def verify(
    results,
    sent_checksum: str,
    plan: TransferPlan,
    named: dict[str, torch.Tensor],
    algo: str,
    ring: list[torch.Tensor] | None = None,
    packed: dict[str, str] | None = None,
) -> int:
    """Check what every endpoint received and read back against what was sent; return tensors verified
    (those read back whose sources this sender holds: its share, where several ranks send). `algo` is the
    manifest's checksum_algo, whose family the read-back checksums are in. `ring`, where the sender still
    holds the packed version (an in-place ring, bucket i in ring[i]), gives each slot's tensor as it went
    out, cast and fused: no cast is redone; `packed` holds the checksums the packing kernel already took of
    them (pack.PackedVersion), so those are not summed again."""
    slots = {s.name: s for s in plan.slots}
    read = {n for r in results for n in r.readback_checksums if n in slots}
    held = [n for n in sorted(read) if all(src in named for src in slots[n].sources)]
    want = {n: packed[n] for n in held if n in (packed or {})}
    rest = [slots[n] for n in held if n not in want]
    if ring is not None:
        expected = unpack(ring, plan, rest)
    else:
        expected = [(s.name, expected_tensor(s, named)) for s in rest]
    want.update(cs.tensor_digests(expected, algo))
    counts = []
    for r in results:
        if r.received_checksum != sent_checksum:
            raise RefitError(f"{r.endpoint_id} received checksum {r.received_checksum}, sent {sent_checksum}")
        mine = [n for n in held if n in r.readback_checksums]
        bad = [n for n in mine if r.readback_checksums[n] != want[n]]
        if bad:
            raise RefitError(f"{r.endpoint_id} holds different values than sent for {bad[:5]}")
        counts.append(len(mine))
    return min(counts, default=0)
