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
from collections.abc import Iterable

import numpy as np
import torch

_TAG_BYTES = 32  # a refit id: 32 hex characters
_SERVE_WAIT_S = 600.0  # a request for a bucket that never comes ends the connection after this
_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def _run(coro, timeout_s: float):
    """Run a coroutine on this process's ucxx event loop thread, bounded by timeout_s."""
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="weightsync-ucxx", daemon=True).start()
    future = asyncio.run_coroutine_threadsafe(coro, _loop)
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

    def __init__(self, host: str):
        self.host = host
        self._versions: dict[str, dict[int, np.ndarray]] = {}
        self._retired: deque[str] = deque(maxlen=64)
        self._ready: asyncio.Condition | None = None
        self._listener = _run(self._start(), 30)
        self.address = f"{host}:{self._listener.port}"

    async def _start(self):
        import ucxx

        self._ready = asyncio.Condition()
        return ucxx.create_listener(self._serve, 0)

    def put(self, tag: str, index: int, buf: torch.Tensor) -> None:
        """Copy a packed bucket into host memory the server owns, and wake the receivers waiting for it."""
        data = buf.cpu().numpy().copy()
        _run(self._put(tag, index, data), 30)

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
                if index < 0:
                    break
                data = await asyncio.wait_for(self._wait_for(tag, index), _SERVE_WAIT_S)
                await ep.send(np.array([-1 if data is None else data.nbytes], dtype=np.int64))
                if data is not None:
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


_server: BucketServer | None = None


def bucket_server(host: str) -> BucketServer:
    """This process's bucket server, started on first use on an ephemeral port of host."""
    global _server
    if _server is None or _server.host != host:
        _server = BucketServer(host)
    return _server


class UcxxTransport:
    """Sender: hand buckets to the bucket server. Receiver: pull them from the sender's address."""

    def __init__(self, group, source):
        self.timeout_s, self.source = group.timeout_s, source
        self.device = torch.device("cpu")
        self._ep = None

    def send(self, buckets: Iterable[tuple[int, torch.Tensor]], tag: str) -> None:
        host = self.source.ucxx_address.rsplit(":", 1)[0]
        for i, buf in buckets:
            bucket_server(host).put(tag, i, buf)

    def receive(self, index: int, out: torch.Tensor, tag: str, root: int = 0) -> None:
        if root != 0:
            raise ValueError(f"ucxx pulls from one sender's listener; bucket from sender rank {root}")
        _run(self._pull(tag, index, out.numpy()), self.timeout_s)

    async def _pull(self, tag: str, index: int, out: np.ndarray) -> None:
        import ucxx

        if self._ep is None:
            host, port = self.source.ucxx_address.rsplit(":", 1)
            self._ep = await ucxx.create_endpoint(host, int(port))
        await self._ep.send(_header(tag, index))
        size = np.empty(1, dtype=np.int64)
        await self._ep.recv(size)
        if size[0] != out.nbytes:
            raise ValueError(f"sender no longer holds bucket {index} of refit {tag} (got {size[0]} bytes)")
        await self._ep.recv(out)

    def close(self) -> None:
        if self._ep is not None:
            _run(self._close(), 10)

    async def _close(self) -> None:
        try:
            await self._ep.send(_header("", -1))
        except Exception:  # the sender is gone already; closing our side is all that is left
            pass
        await self._ep.close()
