"""Process lifecycle shared by the services: serve until SIGTERM/SIGINT, then stop cleanly."""

from __future__ import annotations

import signal
import threading

import grpc


def stop_event() -> threading.Event:
    """An event set by SIGTERM or SIGINT (main thread only)."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def serve_until_signal(server: grpc.Server, grace_s: float = 2.0) -> None:
    stop = stop_event()
    server.start()
    stop.wait()
    server.stop(grace_s).wait()
