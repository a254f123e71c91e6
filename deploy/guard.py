"""`python -m deploy.guard FD CMD...`: run a service's command, and end its whole process group once the launcher
is gone, however it went (SIGKILL included, which no handler of the launcher's own can promise).

FD is the read end of a pipe whose write end only the launcher holds (deploy/procs.py:lifeline): the kernel
closes it when the launcher exits, and the guard reads EOF.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

GRACE_S = 5.0
"""From SIGTERM to SIGKILL of the group once the launcher is gone: every service stops cleanly well within it,
and nothing of the group outlives the launcher by more than ~GRACE_S + POLL_S."""
POLL_S = 0.2


def main() -> None:
    fd, cmd = int(sys.argv[1]), sys.argv[2:]
    # Caught, not ignored: the launcher's SIGTERM to the group reaches the service directly (a caught signal is
    # reset to its default at exec, an ignored one would stay ignored there), and the guard stays to report its
    # exit status.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    # Same process group as the guard: the launcher started the guard as the leader of a new session.
    child = subprocess.Popen(cmd)
    while True:
        # The launcher never writes: the read end turns readable only at EOF, when the launcher is gone.
        if select.select([fd], [], [], POLL_S)[0]:
            end_group(child)
        if child.poll() is not None:
            exit_like(child.returncode)


def end_group(child: subprocess.Popen) -> None:
    """SIGTERM the group (torchrun's ranks and vLLM's helpers included), SIGKILL what is left after GRACE_S."""
    os.killpg(0, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(0, signal.SIGKILL)  # the guard goes with it


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
