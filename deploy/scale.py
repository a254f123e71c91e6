"""The launcher's rollout workers kept at the count the coordinator wants (ScaleRollout): new ones are started, the
newest ones drained; never fewer than one."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from .procs import Service, drain, start, stop_group
from .restarts import Restarts

DRAIN_TIMEOUT_S = 300.0
"""How long a draining worker may take to finish its claimed items before its whole group is stopped (its leases
then run out and other workers take the items)."""


def worker_index(s: Service) -> int:
    return int(s.name.removeprefix("rollout-"))


class RolloutScaler:
    """`reconcile` after each status poll: compares the wanted count with the launcher's running (not draining)
    workers. An added worker runs the newest worker's command with its own index (the smallest free one) and
    `rollout.grpc_port=0`, a free port (the config's range holds only rollout.num_workers ports)."""

    def __init__(self, services: list[Service], restarts: Restarts, record: Callable[[], object]):
        self.services, self.restarts, self.record = services, restarts, record
        self.drain_started: dict[str, float] = {}

    def workers(self) -> list[Service]:
        return sorted((s for s in self.services if s.name.startswith("rollout-")), key=worker_index)

    def reconcile(self, num_wanted: int) -> None:
        self._stop_overdue()
        if num_wanted < 1:  # a coordinator that does not say (an older one)
            return
        serving = [s for s in self.workers() if s.name not in self.restarts.draining]
        if len(serving) < num_wanted:
            for _ in range(num_wanted - len(serving)):
                self._add()
        elif len(serving) > num_wanted:
            for s in serving[num_wanted:][::-1]:
                self._drain(s)
        else:
            return
        self.record()

    def _add(self) -> None:
        template = self.workers()[-1]
        used = {worker_index(s) for s in self.workers()}
        index = min(set(range(len(used) + 1)) - used)
        name = f"rollout-{index}"
        cmd = list(template.cmd)
        cmd[cmd.index("--worker-index") + 1] = str(index)
        if "rollout.grpc_port=0" not in cmd:
            cmd.append("rollout.grpc_port=0")
        self.services.append(start(name, cmd, template.log.with_name(f"{name}.log"), template.env, guard=True))
        self.restarts.added(name)
        print(f"{name} added: {len(self.workers()) - len(self.restarts.draining)} rollout workers", flush=True)

    def _drain(self, s: Service) -> None:
        drain(s)
        self.restarts.drain(s.name)
        self.drain_started[s.name] = time.monotonic()
        print(f"{s.name} draining: it finishes the items it claimed, then exits", flush=True)

    def _stop_overdue(self) -> None:
        for s in self.workers():
            started = self.drain_started.get(s.name)
            if s.name not in self.restarts.draining:
                self.drain_started.pop(s.name, None)
            elif started is not None and time.monotonic() - started > DRAIN_TIMEOUT_S:
                print(f"{s.name} still draining after {DRAIN_TIMEOUT_S:.0f}s: stopped", file=sys.stderr, flush=True)
                stop_group(s)
                del self.drain_started[s.name]
