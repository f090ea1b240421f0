"""A wall-clock limit for one trial, so a hung trial fails with its reason and the study goes on.

In the main thread (the local executor), `signal.setitimer(ITIMER_REAL)` raises `TrialTimeout`
inside the trial when the limit passes. Python delivers signals to the main thread only, so in any
other thread (Ray Tune runs a function trainable in a thread of its worker) a timer thread raises
the exception in the trial's thread instead, with CPython's `PyThreadState_SetAsyncExc` (the one
way to interrupt another thread; it is wrapped here and nowhere else). Either way a Python-level
hang (a stuck data loader, a sleep, an endless loop) is cut at the next bytecode, a long single
native call (one huge matmul) when it returns.
"""

from __future__ import annotations

import ctypes
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from explorer.errors import TrialFailed


class TrialTimeout(TrialFailed):
    """The trial ran past its wall-clock limit."""


class _Expired(BaseException):
    """Raised asynchronously in a trial's thread at its limit (a BaseException: the trial's own
    `except Exception` must not swallow it); `time_limit` turns it into `TrialTimeout`."""


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise `TrialTimeout` in the body once `seconds` of wall-clock time have passed (None: no limit)."""
    if seconds is None:
        yield
        return
    message = f"ran past its time limit of {seconds:g} s (trial_timeout_s)"
    if hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread():
        with _signal_limit(seconds, message):
            yield
    else:
        with _thread_limit(seconds, message):
            yield


@contextmanager
def _signal_limit(seconds: float, message: str) -> Iterator[None]:
    def expire(signum: int, frame: object) -> None:
        raise TrialTimeout(message)

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextmanager
def _thread_limit(seconds: float, message: str) -> Iterator[None]:
    target = threading.get_ident()
    lock = threading.Lock()
    live = [True]  # cleared under the lock when the body ends: no exception is raised after that

    def expire() -> None:
        with lock:
            if live[0]:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(target), ctypes.py_object(_Expired))

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        try:
            yield
        finally:
            with lock:
                live[0] = False
            timer.cancel()
    except _Expired:
        raise TrialTimeout(message) from None
