"""Free TCP ports for local placement and tests."""

import random
import socket

# Below Linux's ephemeral range (32768-60999): a port picked here is not handed out again by the
# kernel to an outgoing connection or a bind(0) between the moment we pick it and the moment a
# service binds it.
_LOW, _HIGH = 20000, 32000
_handed_out: set[int] = set()
"""Ports this process already picked: nothing binds them until the services start, so a later pick could
otherwise name the same port twice (one plan gave the trainer and the coordinator the same one)."""


def is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_port() -> int:
    """A port free now and not picked before by this process."""
    rng = random.SystemRandom()
    for _ in range(1000):
        port = rng.randrange(_LOW, _HIGH)
        if port not in _handed_out and is_free(port):
            _handed_out.add(port)
            return port
    raise RuntimeError(f"no free port in [{_LOW}, {_HIGH})")


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on host:port only (0 = a free port), for servers that would otherwise listen on every
    interface: torch's TCPStore takes its descriptor as master_listen_fd."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    return socket.create_server((host, port), family=family, backlog=512)


def free_range(n: int) -> int:
    """The first of n consecutive ports free now (rollout workers listen on base + i)."""
    for _ in range(100):
        base = free_port()
        if all(is_free(base + i) for i in range(1, n)):
            return base
    raise RuntimeError(f"no {n} consecutive free ports")
