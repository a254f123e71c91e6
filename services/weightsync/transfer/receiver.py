"""Receiver side of a refit, used by rollout workers: a manifest signed by the run's trainer, bytes in, then the
sender's signed commit behind them over the same data plane, every bucket verified against it, and only then
tensors out."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from protos.grpo.v1 import weights_pb2

from ..kernels import checksum as cs
from ..transports import Transports
from ..transports.base import Transfer, first_line
from .arrival import receive_buckets, view_buckets
from .commit import Commit
from .manifest import plan_of
from .pack import unpack
from .signing import check_commit, check_manifest
from .timing import Marks, gc_held

log = logging.getLogger(__name__)


class PeerError(RuntimeError):
    """The sender died, stalled or aborted; the message names it. Nothing was applied."""


class Receiver:
    """One process's receiving side of refits: its transports, made on first use and kept across refits."""

    def __init__(self) -> None:
        self._transports = Transports()

    @contextmanager
    def receive(
        self, m: weights_pb2.WeightManifest, group, source, refit_id: str
    ) -> Iterator[tuple[list[tuple[str, torch.Tensor]], str]]:
        """Receive every bucket and the commit, verify each bucket against it; yield tensors and checksum.
        A manifest or commit the run's trainer did not sign raises SignatureError: the first before any byte
        moves, the second before any tensor is yielded.

        Over an in-place transport (cuda_ipc) the tensors are views of the sender's memory: they are valid
        inside the block only, and leaving it (or a failure before) releases them to the sender. The garbage
        collector waits until then (timing.gc_held)."""
        check_manifest(m)
        with gc_held():
            marks, sender = Marks(), source.sender_id or "the sender"
            plan = plan_of(m)
            sizes = list(plan.bucket_nbytes)
            transport, transfer = self._transports.get(group.backend), Transfer(group, source, refit_id)
            failed = True
            try:
                if transport.in_place:
                    buckets, sums = view_buckets(transport, transfer, sizes, marks)
                else:
                    buckets, sums = receive_buckets(
                        transport, transfer, sizes, m.checksum_algo, [b.sender for b in m.buckets]
                    )
                    marks.mark("received and summed")
                commit = Commit.decode(transport.receive_commit(transfer))
                marks.mark("commit")
                failed = False
            except Exception as e:
                _release_quietly(transport, transfer)
                raise PeerError(f"transfer of version {m.policy_version} from {sender} failed: {first_line(e)}") from e
            finally:
                transport.end(transfer, failed)
            try:
                if commit.error:
                    raise PeerError(f"{sender} aborted version {m.policy_version}: {commit.error}")
                check_commit(m, commit)  # the checksums the buckets must match are the trainer's own
                bad = [i for i, (got, want) in enumerate(zip(sums, commit.bucket_checksums)) if got != want]
                if bad or len(sums) != len(commit.bucket_checksums):
                    raise ValueError(
                        f"version {m.policy_version}: buckets {bad[:5]} arrived different from what {sender} sent"
                    )
                named = unpack(buckets, plan)
                marks.mark("verified and unpacked")
                yield named, cs.combine(sums)
                marks.mark("applied")
            finally:
                _release_quietly(transport, transfer)
            marks.mark("released")
            log.info("version %d: %s", m.policy_version, marks)


def _release_quietly(transport, transfer: Transfer) -> None:
    """Release an in-place transport's views; where the sender is gone there is nobody to tell."""
    try:
        transport.release(transfer)
    except Exception:  # the refit's own error (or success) is what the caller needs to hear
        pass
