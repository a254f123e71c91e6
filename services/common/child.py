"""A long-lived, killable child process that runs user code (rewards, tools) for its parent over a pipe.

The parent starts it on first use and waits for its "ready"; each answer is awaited with a timeout, and a child that
times out or dies is killed and replaced on the next use, so user code that hangs, crashes the interpreter or leaks
memory costs the call, never the caller.
"""

from __future__ import annotations

import importlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any


class ChildLost(Exception):
    """The child timed out or died; the message says which."""


def child_setup(sys_path: list[str]) -> None:
    """First thing in a child's main: ignore Ctrl-C (the parent decides when it stops), end with the parent, and
    import from where the parent does."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    sys.path[:] = sys_path


def _watch_parent(parent_pid: int) -> None:
    # A parent killed with SIGKILL never stops its daemon children; a child stuck in user code would spin forever.
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(0)


def import_function(path: str, kind: str = "function") -> Callable[..., Any]:
    """The callable at import path ``pkg.module:function`` (a reward, a tool); ValueError naming what is wrong."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{kind} {path!r} is not an import path pkg.module:function")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except Exception as e:
        raise ValueError(f"cannot import {kind} {path!r}: {type(e).__name__}: {e}") from e
    if not callable(fn):
        raise ValueError(f"{kind} {path!r} is not callable (it is a {type(fn).__name__})")
    return fn


def serve(conn: multiprocessing.connection.Connection, handle: Callable[[Any], None]) -> None:
    """A child's loop after its "ready": handle each message (it sends its own answers) until None or EOF."""
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        handle(message)


class Child:
    """target(conn, sys_path, *args) in a spawned daemon process: it calls child_setup, sends "ready", then serves
    messages until it receives None."""

    def __init__(self, target: Callable[..., None], args: tuple, name: str, startup_timeout_s: float = 120.0):
        self._target, self._args, self.name = target, args, name
        self._startup_timeout_s = startup_timeout_s
        self._ctx = multiprocessing.get_context("spawn")
        self._proc: multiprocessing.process.BaseProcess | None = None
        self._conn: multiprocessing.connection.Connection | None = None

    @property
    def running(self) -> bool:
        return self._proc is not None

    def conn(self) -> multiprocessing.connection.Connection:
        """The pipe to a ready child, started if there is none. ChildLost where it is not ready in time."""
        if self._conn is not None:
            return self._conn
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        sys_path = [os.getcwd() if p == "" else p for p in sys.path]
        self._proc = self._ctx.Process(
            target=self._target, args=(child_conn, sys_path, *self._args), name=self.name, daemon=True
        )
        self._proc.start()
        # The child must hold the only copy of its end, so its death reads as EOF here.
        child_conn.close()
        self._conn = parent_conn
        ready = self.receive(self._startup_timeout_s, f"{self.name} process not ready after {self._startup_timeout_s}s")
        if ready != "ready":
            raise ChildLost(f"{self.name} process sent {ready!r} instead of ready")
        return parent_conn

    def receive(self, timeout_s: float, timeout_message: str) -> Any:
        assert self._conn is not None and self._proc is not None
        ready = multiprocessing.connection.wait([self._conn, self._proc.sentinel], timeout_s)
        if self._conn in ready:
            try:
                return self._conn.recv()
            except (EOFError, OSError):
                pass
        elif not ready:
            raise ChildLost(timeout_message)
        self._proc.join(1.0)
        raise ChildLost(f"{self.name} process died (exit code {self._proc.exitcode})")

    def stop(self) -> None:
        """Kill the child (a later conn() starts a fresh one)."""
        proc, conn, self._proc, self._conn = self._proc, self._conn, None, None
        if conn is not None:
            conn.close()
        if proc is not None and proc.is_alive():
            proc.terminate()
            proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join()

    def close(self) -> None:
        """Ask the child to end, then make sure it has."""
        if self._conn is not None and self._proc is not None and self._proc.is_alive():
            try:
                self._conn.send(None)
                self._proc.join(1.0)
            except OSError:
                pass
        self.stop()


def _functions_main(conn: multiprocessing.connection.Connection, sys_path: list[str], paths: dict[str, str]) -> None:
    """Child loop of Functions: receive (name, kwargs), call the function, send (value, error)."""
    child_setup(sys_path)
    fns: dict[str, Callable[..., Any] | str] = {}
    for name, path in paths.items():
        try:
            fns[name] = import_function(path)
        except BaseException as e:
            fns[name] = f"{type(e).__name__}: {e}"
    conn.send("ready")

    def handle(message: tuple) -> None:
        name, kwargs = message
        try:
            fn = fns[name]
            if isinstance(fn, str):
                raise RuntimeError(f"cannot load {name} in its process: {fn}")
            value = fn(**kwargs)
        except BaseException as e:
            conn.send((None, f"{type(e).__name__}: {e}"))
            return
        try:
            conn.send((value, ""))
        except Exception as e:  # pickling fails before anything is written: the pipe stays in step
            conn.send((None, f"{name} returned a value that cannot be sent back: {type(e).__name__}: {e}"))

    serve(conn, handle)


class Functions:
    """User functions by name (import paths), called one at a time in one long-lived child with a timeout: a call
    that raises, hangs or kills the child gives (None, why), never an exception to the caller; the child is replaced
    on the next call."""

    def __init__(self, paths: dict[str, str], timeout_s: float, kind: str, startup_timeout_s: float = 120.0):
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = timeout_s
        self._child = Child(_functions_main, (dict(paths),), kind, startup_timeout_s)
        self._lock = threading.Lock()

    def call(self, name: str, kwargs: dict[str, Any]) -> tuple[Any, str]:
        """(the function's value, "") or (None, why it gave none)."""
        with self._lock:
            try:
                self._child.conn().send((name, kwargs))
                return self._child.receive(self.timeout_s, f"{name} ran past {self.timeout_s}s")
            except (ChildLost, OSError, EOFError) as e:
                self._child.stop()
                return None, str(e)

    def close(self) -> None:
        with self._lock:
            self._child.close()
