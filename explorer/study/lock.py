"""One study's lock across threads, processes and hosts: what decides what runs next happens under it.

Optuna makes one step atomic: a queued trial's move to RUNNING. Everything else a worker decides
(is a trial left to start under `n_trials`; which seed a configuration lacks; was a dead worker's trial
queued again already) is a read followed by a write, and two workers reading at once both write. So
those decisions read and write under this lock, and each sees what the one before it queued.

The lock lives where the storage does, and dies with its holder, so a worker killed by SIGKILL never
leaves it held: an `flock` on a file beside a SQLite or journal file (the kernel drops it with the
process; NFSv4 supports it for journal files on a shared folder), a PostgreSQL session-level advisory
lock (the server drops it with the connection), and for Optuna's gRPC proxy a token in the storage itself
(`_TokenLock`: taken with the one atomic step, given up by a dead holder after three heartbeats). Other
servers get the threads of one process only.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import sqlalchemy

from explorer.errors import ExplorerError
from explorer.optuna_compat import trial_storage_id


class StudyLock:
    """Re-entrant within a thread (the outermost hold takes the process-wide part), exclusive across
    threads of a process and across processes: `with lock():`.

    `caches` are told when the outermost hold begins (`stale()`: what they read from now on must be read
    anew) and before it ends (`decided()`: what was written under the lock is stored before another worker
    decides): a cache of the storage (optuna_cache.owner_cache) decides with it as if there were none.
    """

    def __init__(self, file: Path | None, url: str, name: str, timeout_s: float, heartbeat_s: float = 5):
        self.caches: list[Any] = []
        self._threads = threading.RLock()
        self._depth = 0
        self._timeout_s = timeout_s
        self._across: _Across | None = None
        if file is not None:
            self._across = _FileLock(file.with_name(file.name + ".explorer.lock"))
        elif url.startswith("postgresql"):
            self._across = _AdvisoryLock(url, name)
        elif url.startswith("grpc://"):
            self._across = _TokenLock(url, name, heartbeat_s)

    @property
    def across_processes(self) -> bool:
        return self._across is not None

    @contextmanager
    def __call__(self) -> Iterator[None]:
        if not self._threads.acquire(timeout=self._timeout_s):
            raise ExplorerError(f"the study's lock was held by another thread past {self._timeout_s:g} s (storage_timeout_s)")
        try:
            outermost = self._depth == 0
            if outermost and self._across is not None:
                self._across.acquire(self._timeout_s)
            self._depth += 1
            try:
                if outermost:
                    for cache in self.caches:
                        cache.stale()
                yield
                if outermost:
                    for cache in self.caches:
                        cache.decided()
            finally:
                self._depth -= 1
                if self._depth == 0 and self._across is not None:
                    self._across.release()
        finally:
            self._threads.release()


class _Across(Protocol):
    def acquire(self, timeout_s: float) -> None: ...

    def release(self) -> None: ...


class _FileLock:
    """`flock` on a file beside the storage's, opened per hold so a forked child never shares it."""

    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = None

    def acquire(self, timeout_s: float) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._fd = fd
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise ExplorerError(f"{self.path} was locked by another worker past {timeout_s:g} s (storage_timeout_s)") from None
                time.sleep(0.005)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the last descriptor drops the flock


class _AdvisoryLock:
    """A PostgreSQL advisory lock on its own connection: the server releases it when the connection goes."""

    def __init__(self, url: str, name: str):
        self._engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
        self._key = int.from_bytes(hashlib.sha256(f"explorer:{name}".encode()).digest()[:8], "big", signed=True)
        self._connection: Any = None

    def acquire(self, timeout_s: float) -> None:
        connection = self._engine.connect()
        try:
            connection.execute(sqlalchemy.text(f"SET lock_timeout = {int(timeout_s * 1000)}"))
            connection.execute(sqlalchemy.select(sqlalchemy.func.pg_advisory_lock(self._key)))
            connection.commit()
        except BaseException:
            connection.close()
            raise
        self._connection = connection

    def release(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()  # ends the session, and with it the lock


class _TokenLock:
    """The lock kept in the study's own storage, for Optuna's gRPC proxy (no file or server lock to reach
    from every host): a study of its own (`NAME.explorer-lock`) whose lowest unfinished trial is the token.
    Taking it is Optuna's one atomic step, a queued trial's move to RUNNING; giving it back queues it again.
    Its holder beats on it (a system attr) while holding it; a waiter that sees the token held without a
    change of beat for three heartbeats (on its own clock) fails it and queues a new one, so a holder
    killed with SIGKILL never keeps it."""

    def __init__(self, url: str, name: str, heartbeat_s: float):
        self._url, self._name, self._interval = url, f"{name}.explorer-lock", heartbeat_s
        self._proxy: Any = None
        self._lock_study = 0
        self._held: int | None = None
        self._stop = threading.Event()
        self._seen: dict[int, tuple[Any, float]] = {}  # token id -> (its beat, when this process first saw it)

    def _open(self) -> Any:
        if self._proxy is None:
            import optuna

            from explorer.study.liveness import grpc_storage

            storage = grpc_storage(self._url, int(self._interval), 3 * self._interval, 10.0)
            try:
                self._lock_study = storage.create_new_study([optuna.study.StudyDirection.MINIMIZE], self._name)
            except optuna.exceptions.DuplicatedStudyError:
                self._lock_study = storage.get_study_id_from_name(self._name)
            self._proxy = storage
        return self._proxy

    def acquire(self, timeout_s: float) -> None:
        import optuna

        waiting, running = optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING
        storage, deadline, pause = self._open(), time.monotonic() + timeout_s, 0.002
        while True:
            live = storage.get_all_trials(self._lock_study, deepcopy=False, states=(waiting, running))
            if not live:  # the first token (two made at once: the lower counts, the other waits its turn)
                storage.create_new_trial(self._lock_study, optuna.trial.create_trial(state=waiting))
                continue
            token = min(live, key=lambda t: t.number)
            tid = trial_storage_id(token)
            if token.state == waiting and storage.set_trial_state_values(tid, running):
                self._held = tid
                self._stop = threading.Event()
                self._beat()  # at once: waiters that timed the previous holder see a new beat
                threading.Thread(target=self._beating, args=(self._stop, tid), daemon=True).start()
                return
            now, beat = time.monotonic(), token.system_attrs.get("beat")
            if self._seen.get(tid, (None,))[0] != beat or token.state == waiting:
                self._seen[tid] = (beat, now)
            elif now - self._seen[tid][1] > 3 * self._interval:  # its holder is gone
                with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                    storage.set_trial_state_values(tid, optuna.trial.TrialState.FAIL)
                continue
            if now > deadline:
                raise ExplorerError(f"the study's lock ({self._name} in {self._url}) was held by another worker past "
                                    f"{timeout_s:g} s (storage_timeout_s)")
            time.sleep(pause)
            pause = min(2 * pause, 0.05)

    def _beat(self, tid: int | None = None) -> None:
        self._proxy.set_trial_system_attr(tid or self._held, "beat", time.time())  # any value that changes

    def _beating(self, stop: threading.Event, tid: int) -> None:
        while not stop.wait(self._interval):
            with contextlib.suppress(Exception):  # the next beat retries
                self._beat(tid)

    def release(self) -> None:
        import optuna

        tid, self._held = self._held, None
        self._stop.set()
        if tid is not None:
            with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):  # failed as dead meanwhile: a new token is out
                self._proxy.set_trial_state_values(tid, optuna.trial.TrialState.WAITING)
