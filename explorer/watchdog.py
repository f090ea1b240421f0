"""A wall-clock limit for one trial, so a hung trial fails with its reason and the study goes on.

On Unix, in the main thread, `signal.setitimer(ITIMER_REAL)` raises `TrialTimeout` inside the trial
when the limit passes: a Python-level hang (a stuck data loader, a sleep, an endless loop) is cut at
the next bytecode, a long single native call (one huge matmul) when it returns. Python delivers
signals to the main thread only, so a trial running in another thread (Ray Tune's function
trainables) cannot be interrupted this way: there the limit is not enforced (`enforced()` says so),
and a hung trial is caught by the worker's heartbeat only when its process dies.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from explorer.errors import TrialFailed


class TrialTimeout(TrialFailed):
    """The trial ran past its wall-clock limit."""


def enforced() -> bool:
    """Whether a limit set here can interrupt the calling thread."""
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise `TrialTimeout` in the body once `seconds` of wall-clock time have passed (None: no limit)."""
    if seconds is None or not enforced():
        yield
        return

    def expire(signum: int, frame: object) -> None:
        raise TrialTimeout(f"ran past its time limit of {seconds:g} s (trial_timeout_s)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
