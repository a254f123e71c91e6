"""Receiver side of a refit, used by rollout workers: bytes in, then the sender's commit behind them over the
same data plane, every bucket verified against it, and only then tensors out."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from protos.grpo.v1 import weights_pb2

from ..kernels import checksum as cs
from ..transports import Transports
from ..transports.base import Transfer, Transport, first_line
from .manifest import Commit, plan_of
from .pack import unpack


class PeerError(RuntimeError):
    """The sender died, stalled or aborted; the message names it. Nothing was applied."""


class Receiver:
    """One process's receiving side of refits: its transports, made on first use and kept across refits."""

    def __init__(self) -> None:
        self._transports = Transports()

    def receive(
        self, m: weights_pb2.WeightManifest, group, source, refit_id: str
    ) -> tuple[list[tuple[str, torch.Tensor]], str]:
        """Receive every bucket and the commit, verify each bucket against it; return tensors and checksum."""
        plan, sender = plan_of(m), source.sender_id or "the sender"
        transport, transfer = self._transports.get(group.backend), Transfer(group, source, refit_id)
        failed = True
        try:
            senders = [b.sender for b in m.buckets]
            buckets, sums = receive_buckets(transport, transfer, list(plan.bucket_nbytes), m.checksum_algo, senders)
            commit = Commit.decode(transport.receive_commit(transfer))
            failed = False
        except Exception as e:
            raise PeerError(f"transfer of version {m.policy_version} from {sender} failed: {first_line(e)}") from e
        finally:
            transport.end(transfer, failed)
        if commit.error:
            raise PeerError(f"{sender} aborted version {m.policy_version}: {commit.error}")
        bad = [i for i, (got, want) in enumerate(zip(sums, commit.bucket_checksums)) if got != want]
        if bad or len(sums) != len(commit.bucket_checksums):
            raise ValueError(f"version {m.policy_version}: buckets {bad[:5]} arrived different from what {sender} sent")
        return unpack(buckets, plan), cs.combine(sums)


def receive_buckets(
    transport: Transport, transfer: Transfer, sizes: list[int], algo: str, senders: list[int] | None = None
) -> tuple[list[torch.Tensor], list[str]]:
    """Receive every bucket into fresh buffers, checksumming each while the next one arrives.

    The buffers hold the whole version until the caller verified it against the sender's commit:
    only then may an engine see any of it (a failed refit leaves the previous version in service).
    `senders` names each bucket's sending rank where several trainer ranks send (collective transports).
    """
    device = transport.device()
    out = [torch.empty(n, dtype=torch.uint8, device=device) for n in sizes]

    def receive(i: int, buf: torch.Tensor):
        return transport.receive(transfer, i, buf, root=senders[i] if senders else 0)

    if device.type == "cuda":
        main, side, sums = torch.cuda.current_stream(), torch.cuda.Stream(), []
        for i, buf in enumerate(out):
            summed = receive(i, buf)  # cuda_ipc: summed inside its copy, on main
            if summed is None:
                side.wait_stream(main)
                with torch.cuda.stream(side):
                    summed = cs.sum64(buf)
            sums.append(summed)
        main.wait_stream(side)
        return out, cs.digests(sums)
    with ThreadPoolExecutor(1, thread_name_prefix="weightsync-sum") as pool:
        futures = []
        for i, buf in enumerate(out):
            receive(i, buf)
            futures.append(pool.submit(cs.bucket_checksum, buf, algo))
        return out, [f.result() for f in futures]
