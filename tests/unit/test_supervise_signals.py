"""The launcher's signals: Ctrl-C, SIGTERM and SIGHUP stop a run also after the launcher resumed it once (the
cleanup of the attempt before ignores them while it stops the services)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from deploy.supervise import shield_cleanup, stop_on_sigterm


@pytest.fixture
def handlers():
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["ctrl-c", "sigterm", "sighup"])
def test_a_stop_signal_interrupts_the_second_attempt_too(handlers, sig):
    stop_on_sigterm()
    shield_cleanup()  # the first attempt's cleanup: a second Ctrl-C must not cut it short
    os.kill(os.getpid(), sig)
    time.sleep(0.05)  # ignored: nothing raised
    stop_on_sigterm()  # the resumed attempt
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), sig)
        time.sleep(1)
