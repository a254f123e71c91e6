"""Process lifecycle shared by the services: serve until SIGTERM/SIGINT, then stop cleanly."""

from __future__ import annotations

import atexit
import gc
import signal
import threading

import grpc


def stop_event() -> threading.Event:
    """An event set by SIGTERM or SIGINT (main thread only)."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def freeze_startup_heap() -> None:
    """Take every object alive once a service has started (modules, model, engine) out of the garbage
    collector's scans, as vLLM's engine core does.

    A rollout worker tracks ~390k objects after startup; each full collection scanned them all: 0.21 s on
    the CPU machine, 0.08-0.29 s on the H200 machine's rollout worker, several per step, one of them
    inside a refit (0.25 s of a 0.27 s LoadWeights). Frozen objects are still freed by reference counting;
    only cycles among them live until exit, when they are unfrozen for the last collection.
    """
    gc.collect()
    gc.freeze()
    atexit.register(gc.unfreeze)


def serve_until_signal(server: grpc.Server, grace_s: float = 2.0) -> None:
    stop = stop_event()
    server.start()
    stop.wait()
    server.stop(grace_s).wait()
