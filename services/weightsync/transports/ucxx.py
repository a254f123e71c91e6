"""ucxx transport: the sender serves packed buckets from host memory and every receiver pulls them.

Pulling is what makes elastic joins cheap: a rollout worker that registers mid-run fetches the
current version by itself while the others keep generating, and nobody re-forms a group. The sender
keeps the last two refits in host memory (one model's worth each). UCX picks tcp or shared memory
here, RDMA where the cluster's UCX has it.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Sequence

import numpy as np
import torch

from .base import Buckets, Offer, Transfer, Transport

_TAG_BYTES = 32  # a refit id: 32 hex characters
_SERVE_WAIT_S = 600.0  # a request for a bucket that never comes ends the connection after this
_CLOSE, _COMMIT = -1, -2  # header indices that are no bucket: end the connection, the refit's commit


class _Loop:
    """An asyncio event loop on its own thread, where every ucxx call of this transport runs."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="weightsync-ucxx", daemon=True).start()

    def run(self, coro, timeout_s: float):
        """Run a coroutine on the loop's thread, bounded by timeout_s."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout_s)
        except TimeoutError:
            future.cancel()
            raise TimeoutError(f"ucxx transfer took longer than {timeout_s:.0f}s") from None


def _header(tag: str, index: int) -> np.ndarray:
    raw = tag.encode().ljust(_TAG_BYTES, b"\0")[:_TAG_BYTES] + int(index).to_bytes(8, "little", signed=True)
    return np.frombuffer(raw, dtype=np.uint8).copy()


class BucketServer:
    """The sender's listener: answers (refit id, bucket index) with the bucket's bytes once packed."""

    def __init__(self, host: str, loop: _Loop):
        self.host, self._loop = host, loop
        self._versions: dict[str, dict[int, np.ndarray]] = {}
        self._retired: deque[str] = deque(maxlen=64)
        self._ready: asyncio.Condition | None = None
        self._listener = loop.run(self._start(), 30)
        self.address = f"{host}:{self._listener.port}"

    async def _start(self):
        import ucxx

        self._ready = asyncio.Condition()
        return ucxx.create_listener(self._serve, 0)

    def put(self, tag: str, index: int, data: np.ndarray) -> None:
        """Keep bytes the server owns under (tag, index), and wake the receivers waiting for them."""
        self._loop.run(self._put(tag, index, data), 30)

    async def _put(self, tag: str, index: int, data: np.ndarray) -> None:
        async with self._ready:
            if tag not in self._versions:
                for old in list(self._versions)[:-1]:  # keep the previous refit for late pullers
                    del self._versions[old]
                    self._retired.append(old)
                self._versions[tag] = {}
            self._versions[tag][index] = data
            self._ready.notify_all()

    async def _serve(self, ep) -> None:
        header = np.empty(_TAG_BYTES + 8, dtype=np.uint8)
        try:
            while True:
                await ep.recv(header)
                tag = header[:_TAG_BYTES].tobytes().rstrip(b"\0").decode()
                index = int.from_bytes(header[_TAG_BYTES:].tobytes(), "little", signed=True)
                if index == _CLOSE:
                    break
                data = await asyncio.wait_for(self._wait_for(tag, index), _SERVE_WAIT_S)
                await ep.send(np.array([-1 if data is None else data.nbytes], dtype=np.int64))
                if data is not None and data.nbytes:
                    await ep.send(data)
        except Exception:  # a receiver that went away, or waited too long, ends its own connection only
            pass
        finally:
            await ep.close()

    async def _wait_for(self, tag: str, index: int) -> np.ndarray | None:
        """The bucket once packed (receivers may ask before the sender got there), None if retired."""
        async with self._ready:
            await self._ready.wait_for(lambda: tag in self._retired or index in self._versions.get(tag, {}))
        return self._versions.get(tag, {}).get(index)


class UcxxTransport(Transport):
    """Sender: hand buckets to this process's bucket server. Receiver: pull them from the sender's address,
    over one connection per refit (a join and a regular refit may pull at the same time)."""

    name, device_type, joinable = "ucxx", "cpu", True

    def __init__(self) -> None:
        self._loop: _Loop | None = None
        self._server: BucketServer | None = None
        self._eps: dict[str, object] = {}
        self._lock = threading.Lock()

    def _event_loop(self) -> _Loop:
        with self._lock:
            if self._loop is None:
                self._loop = _Loop()
            return self._loop

    def _run(self, coro, timeout_s: float):
        return self._event_loop().run(coro, timeout_s)

    def offer(self, bucket_bytes: int, num_buffers: int, host: str) -> tuple[list[torch.Tensor], Offer]:
        """A host ring, and this process's bucket server, started on first use on an ephemeral port of host."""
        ring, _ = super().offer(bucket_bytes, num_buffers, host)
        loop = self._event_loop()
        with self._lock:
            if self._server is None or self._server.host != host:
                self._server = BucketServer(host, loop)
        return ring, Offer(ucxx_address=self._server.address)

    def send(self, transfer: Transfer, buckets: Buckets, sizes: Sequence[int], senders: Sequence[int]) -> None:
        if any(senders):
            raise ValueError(f"ucxx pulls from one sender's listener; buckets from sender ranks {sorted(set(senders))}")
        for i, buf in buckets:
            self._server.put(transfer.tag, i, buf.cpu().numpy().copy())

    def receive(self, transfer: Transfer, index: int, out: torch.Tensor, root: int = 0) -> None:
        if root != 0:
            raise ValueError(f"ucxx pulls from one sender's listener; bucket from sender rank {root}")
        got = self._run(self._pull_into(transfer, index, out.numpy()), transfer.group.timeout_s)
        if got != out.nbytes:
            raise ValueError(f"sender no longer holds bucket {index} of refit {transfer.tag} (got {got} bytes)")

    def send_commit(self, transfer: Transfer, data: bytes) -> None:
        self._server.put(transfer.tag, _COMMIT, np.frombuffer(data, dtype=np.uint8).copy())

    def receive_commit(self, transfer: Transfer) -> bytes:
        data = self._run(self._pull_new(transfer, _COMMIT), transfer.group.timeout_s)
        if data is None:
            raise ValueError(f"sender no longer holds the commit of refit {transfer.tag}")
        return data.tobytes()

    async def _ask(self, transfer: Transfer, index: int):
        """Ask the sender for (tag, index) over this refit's connection; returns it and the announced size
        (-1: the sender no longer holds it)."""
        import ucxx

        if transfer.tag not in self._eps:
            host, port = transfer.source.ucxx_address.rsplit(":", 1)
            self._eps[transfer.tag] = await ucxx.create_endpoint(host, int(port))
        ep = self._eps[transfer.tag]
        await ep.send(_header(transfer.tag, index))
        size = np.empty(1, dtype=np.int64)
        await ep.recv(size)
        return ep, int(size[0])

    async def _pull_into(self, transfer: Transfer, index: int, out: np.ndarray) -> int:
        """Bucket `index` into out, where the sender holds it at that size; returns the size it announced."""
        ep, size = await self._ask(transfer, index)
        if size == out.nbytes:
            await ep.recv(out)
        return size

    async def _pull_new(self, transfer: Transfer, index: int) -> np.ndarray | None:
        """What the sender holds under `index`, of whatever size, in a new array (None if it holds none)."""
        ep, size = await self._ask(transfer, index)
        if size < 0:
            return None
        out = np.empty(size, dtype=np.uint8)
        if size:
            await ep.recv(out)
        return out

    def end(self, transfer: Transfer, failed: bool) -> None:
        ep = self._eps.pop(transfer.tag, None)
        if ep is not None:
            self._run(_close(ep), 10)


async def _close(ep) -> None:
    try:
        await ep.send(_header("", _CLOSE))
    except Exception:  # the sender is gone already; closing our side is all that is left
        pass
    await ep.close()
