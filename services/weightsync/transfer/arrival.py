"""A version's buckets arriving over a transport: into fresh buffers, each checksummed while the next one
arrives, or (in-place transports) read where they lie in the sender's memory. Imports no protos, so the
benchmark runs it on machines without our wire stack."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from ..kernels import checksum as cs
from ..transports.base import Transfer, Transport
from .timing import Marks


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


def view_buckets(
    transport: Transport, transfer: Transfer, sizes: list[int], marks: Marks
) -> tuple[list[torch.Tensor], list[str]]:
    """An in-place transport's buckets where they lie in the sender's memory, and their checksums (one
    launch and one host sync for all of them). Nothing is copied: the caller verifies the views against the
    sender's commit, copies them into its engine, then releases them (transport.release)."""
    views = [transport.view(transfer, i, n) for i, n in enumerate(sizes)]  # the first waits for the sender
    marks.mark("ready")
    digests = cs.tensor_digests([(str(i), v) for i, v in enumerate(views)], "sum64")
    marks.mark("summed")
    return views, [digests[str(i)] for i in range(len(views))]
