"""A dead rollout worker is started again with exponential backoff, up to a limit; any other dead service ends the run.

A restarted worker registers with weightsync again (which hands a joiner the current version where the transport
lets it pull), and the prompts its dead predecessor held are claimed again by any worker once their lease
(`rollout.lease_timeout_s`) runs out.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from .procs import Service, ServiceDied, restart

BACKOFF_S = 2.0
"""Wait before the first restart; doubled for each further one, up to MAX_BACKOFF_S: a worker that dies at start
(a bad engine setting, no memory) is not restarted in a tight loop."""
MAX_BACKOFF_S = 60.0


def restartable(name: str) -> bool:
    """Rollout workers hold nothing the run cannot redo: their leased prompts go back to the queue, and their
    weights come from the trainer. Redis holds the queue, but in its append-only file, fsynced on every write: it
    comes back with every acknowledged write while its clients retry their calls. Trainer, weightsync and the
    coordinator hold the run's state in memory: their death makes the launcher resume the run (deploy/local.py)."""
    return name.startswith("rollout-") or name == "redis"


def backoff_s(num_restarts: int) -> float:
    return min(BACKOFF_S * 2**num_restarts, MAX_BACKOFF_S)


class Restarts:
    """check_alive for the launcher's loop: restarts a dead rollout worker in place in `services` once its backoff
    has passed (never blocking the loop), and raises for any other dead service or a worker past its limit."""

    def __init__(self, services: list[Service], on_restart: Callable[[], None], max_restarts: Callable[[str], int]):
        self.services, self.on_restart, self.max_restarts = services, on_restart, max_restarts
        """Restarts a service may have, by its name."""
        self.num_restarts: dict[str, int] = {}
        self.due_at: dict[str, float] = {}
        self.draining: set[str] = set()
        """Workers told to drain (deploy/scale.py): their exit is their end, never a death to restart."""

    def drain(self, name: str) -> None:
        self.draining.add(name)
        self.due_at.pop(name, None)

    def added(self, name: str) -> None:
        """A new worker under a name an earlier one may have had: its own restarts."""
        self.num_restarts.pop(name, None)
        self.due_at.pop(name, None)

    def check_alive(self) -> None:
        for s in [s for s in self.services if s.name in self.draining and s.proc.poll() is not None]:
            print(f"{s.name} drained: exited with {s.proc.returncode}", file=sys.stderr, flush=True)
            self.services.remove(s)
            self.draining.discard(s.name)
            self.on_restart()
        for i, s in enumerate(self.services):
            if s.proc.poll() is None or s.name in self.draining:
                continue
            n = self.num_restarts.get(s.name, 0)
            if not restartable(s.name):
                raise ServiceDied.of(s)
            if n >= self.max_restarts(s.name):
                raise ServiceDied.of(s, f"{s.name} died after {n} restarts: ")
            if s.name not in self.due_at:
                self.due_at[s.name] = time.monotonic() + backoff_s(n)
                print(
                    f"{s.name} exited with {s.proc.returncode}; restart {n + 1} of {self.max_restarts(s.name)} "
                    f"in {backoff_s(n):.0f}s",
                    file=sys.stderr,
                    flush=True,
                )
            elif time.monotonic() >= self.due_at[s.name]:
                del self.due_at[s.name]
                self.services[i] = restart(s)
                self.num_restarts[s.name] = n + 1
                self.on_restart()
