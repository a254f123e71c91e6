"""`python -m deploy.guard FD CMD...`: run a service's command, and end all of it once the launcher is gone, however
it went (SIGKILL included, which no handler of the launcher's own can promise), or once the launcher stops it.

FD is the read end of a pipe whose write end only the launcher holds (deploy/procs.py:lifeline): the kernel
closes it when the launcher exits, and the guard reads EOF.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
import sys
import time

GRACE_S = 5.0
"""From SIGTERM to SIGKILL: every service stops cleanly well within it, and nothing of it outlives the launcher by
more than ~GRACE_S + POLL_S (deploy/procs.py:STOP_GRACE_S waits longer, so the guard's SIGKILL comes first)."""
POLL_S = 0.2
PR_SET_CHILD_SUBREAPER = 36


def main() -> None:
    fd, cmd = int(sys.argv[1]), sys.argv[2:]
    # Processes that leave the group escape a group signal (torchrun starts each rank in a session of its own);
    # as a subreaper the guard inherits them when their parent dies, so they stay its descendants.
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    stopping = []
    # Caught, not ignored: the launcher's SIGTERM to the group reaches the service directly (a caught signal is
    # reset to its default at exec, an ignored one would stay ignored there), and the guard stays to finish it.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stopping.append(True))
    # Same process group as the guard: the launcher started the guard as the leader of a new session.
    child = subprocess.Popen(cmd)
    while True:
        # The launcher never writes: the read end turns readable only at EOF, when the launcher is gone.
        if select.select([fd], [], [], POLL_S)[0]:
            os.killpg(0, signal.SIGTERM)
            stopping.append(True)
        if stopping:
            finish(child)
        if child.poll() is not None:
            kill_descendants()  # what the service left behind
            exit_like(child.returncode)


def finish(child: subprocess.Popen) -> None:
    """The group has its SIGTERM: give the service GRACE_S to stop (torchrun stops its ranks), then SIGKILL every
    descendant and the group, the guard included."""
    deadline = time.monotonic() + GRACE_S
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    kill_descendants()
    os.killpg(0, signal.SIGKILL)


def kill_descendants() -> None:
    for pid in descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def exit_like(returncode: int) -> None:
    """Exit as the service did, so the launcher reads the same status it would without the guard."""
    if returncode >= 0:
        sys.exit(returncode)
    sig = -returncode
    if sig not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    sys.exit(128 + sig)  # a signal whose default is not to terminate


if __name__ == "__main__":
    main()
