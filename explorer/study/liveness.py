"""Which RUNNING trials still have a live worker: judged from what the storage records, on one clock.

- RDB storages (SQLite, PostgreSQL): Optuna's heartbeats. A worker stamps its trial's heartbeat row
  with the database's own `now()`, and `fail_stale_trials` compares it with the database's `now()`:
  one clock, so skew between two hosts' clocks never reclaims a live trial.
- A trial whose worker died before its first heartbeat has no row, and Optuna never fails it. An
  observer fails it once it has seen it RUNNING without a heartbeat for the whole grace period, on its
  own monotonic clock (no start time written by another machine's clock is read).
- Journal files and Optuna's gRPC storage proxy: Optuna keeps no heartbeats there. explorer records one
  as a trial system attr whose value changes at every beat, and an observer fails a trial whose beat it
  has seen unchanged for the grace period, again on its own monotonic clock (values are compared only
  for equality).

A worker beats from a thread of its own (`Heartbeat`) that outlives a busy storage: a beat that fails
is retried at the next, since a heartbeat thread that died would get its live trial reclaimed.
"""

from __future__ import annotations

import functools
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import optuna
import sqlalchemy

from explorer.optuna_compat import backend_of, heartbeat_base, storage_of, trial_storage_id
from explorer.study.sqlite import reading

BEAT = "explorer:heartbeat"  # the journal's heartbeat: a trial system attr
_RUNNING = optuna.trial.TrialState.RUNNING


class Observed:
    """When this process first saw each trial in its current state (a beat value, or no beat): its
    monotonic clock is the only one that measures how long a trial has gone without a sign of life."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[Any, float]] = {}
        self._lock = threading.Lock()

    def silent_for(self, trial_id: int, value: Any) -> float:
        """Seconds this process has seen `trial_id` with this same `value` (0 the first time)."""
        now = time.monotonic()
        with self._lock:
            seen = self._seen.get(trial_id)
            if seen is None or seen[0] != value:
                self._seen[trial_id] = (value, now)
                return 0.0
            return now - seen[1]


def heartbeats_of(storage: optuna.storages.BaseStorage) -> bool:
    """Whether `storage` records heartbeats (explorer opens every RDB and journal storage with them)."""
    interval = getattr(storage, "get_heartbeat_interval", None)
    return interval is not None and interval() is not None


@contextmanager
def beating(ostudy: optuna.Study, trial: optuna.Trial) -> Iterator[None]:
    """Beat for `trial` now and every heartbeat interval until the block ends."""
    storage = storage_of(ostudy)
    if not heartbeats_of(storage):
        yield
        return
    tid, interval, stop = trial_storage_id(trial), storage.get_heartbeat_interval(), threading.Event()
    _beat(storage, tid)  # the first beat before training: a trial never looks unbeaten for long

    def loop() -> None:
        while not stop.wait(interval):
            _beat(storage, tid)

    thread = threading.Thread(target=loop, name=f"heartbeat-{tid}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _beat(storage: Any, trial_id: int) -> None:
    try:  # a cache of this process's trials beats in turn with its other writes (optuna_cache.owner_cache)
        getattr(storage, "beat", lambda ids: storage.record_heartbeat(ids[0]))([trial_id])
    except Exception:  # noqa: BLE001  locked, briefly unreachable, or the trial finished meanwhile: the next beat retries
        pass


def fail_dead(ostudy: optuna.Study, observed: Observed) -> None:
    """Fail the RUNNING trials whose worker is gone (stale heartbeat, or none past the grace period).
    Queueing them again is the queue's job, under the study's lock."""
    if not heartbeats_of(storage_of(ostudy)):
        return
    with warnings.catch_warnings(action="ignore", category=optuna.exceptions.ExperimentalWarning):
        optuna.storages.fail_stale_trials(ostudy)  # the journal's staleness: `_JournalBeats._get_stale_trial_ids`
    _fail_unbeaten(ostudy, observed)


def _fail_unbeaten(ostudy: optuna.Study, observed: Observed) -> None:
    """Fail RDB trials RUNNING without a heartbeat row that this process has seen so for the grace period."""
    storage = storage_of(ostudy)
    rdb = backend_of(storage)
    if not isinstance(rdb, optuna.storages.RDBStorage):
        return
    grace = rdb.grace_period or 2 * rdb.heartbeat_interval
    with reading(), rdb.engine.connect() as connection:
        beating_ids = {row[0] for row in connection.execute(sqlalchemy.text("SELECT trial_id FROM trial_heartbeats"))}
    for t in ostudy.get_trials(deepcopy=False, states=(_RUNNING,)):
        tid = trial_storage_id(t)
        if tid in beating_ids or observed.silent_for(tid, None) < grace:
            continue
        try:
            storage.set_trial_state_values(tid, optuna.trial.TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:  # it finished, or another worker failed it first
            continue


def journal_storage(path: str, interval: int, grace: float) -> optuna.storages.BaseStorage:
    """Optuna's journal file storage, with heartbeats (`fail_stale_trials` and `beating` use them)."""
    backend = optuna.storages.journal.JournalFileBackend(path)
    return _beats_class(optuna.storages.JournalStorage)(interval, grace, backend)


def grpc_storage(url: str, interval: int, grace: float, timeout_s: float) -> optuna.storages.BaseStorage:
    """A client of Optuna's gRPC storage proxy at `grpc://host:port`, with heartbeats (as the journal's: the
    proxy forwards none), its errors as Optuna's StorageInternalError; ready within `timeout_s` or an error."""
    host, _, port = url.removeprefix("grpc://").rstrip("/").rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{url}: write grpc://HOST:PORT")
    storage = _grpc_class()(interval, grace, host=host, port=int(port))
    try:
        storage.wait_server_ready(timeout=timeout_s)
    except Exception:  # grpc.FutureTimeoutError: nothing answers there
        raise ConnectionError(f"no gRPC storage proxy answered at {host}:{port} within {timeout_s:g} s") from None
    return storage


@functools.cache
def _beats_class(base: type) -> type:
    class _Beats(base, heartbeat_base()):
        """A storage that implements Optuna's heartbeat interface through a trial system attr (the journal's
        and the gRPC proxy's have none)."""

        def __init__(self, interval: int, grace: float, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._interval, self._grace, self._observed = interval, grace, Observed()

        def record_heartbeat(self, trial_id: int) -> None:
            self.set_trial_system_attr(trial_id, BEAT, time.time())  # any value that changes; never compared across hosts

        def _get_stale_trial_ids(self, study_id: int) -> list[int]:
            running = self.get_all_trials(study_id, deepcopy=False, states=(_RUNNING,))
            return [trial_storage_id(t) for t in running
                    if self._observed.silent_for(trial_storage_id(t), t.system_attrs.get(BEAT)) > self._grace]

        def get_heartbeat_interval(self) -> int:
            return self._interval

        def get_heartbeat_stale_trial_callback(self) -> None:
            return None  # the queue queues dead workers' trials again, under the study's lock

    _Beats.__name__ = _Beats.__qualname__ = f"{base.__name__}WithBeats"
    return _Beats


@functools.cache
def _grpc_class() -> type:
    import grpc

    def translated(method: Any) -> Any:
        @functools.wraps(method)
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except grpc.RpcError as err:  # the proxy's answer: a status code and its details (unreachable, its storage's error)
                raise optuna.exceptions.StorageInternalError(f"gRPC {err.code().name}: {err.details()}") from err
        return call

    base = _beats_class(optuna.storages.GrpcStorageProxy)
    names = [n for n, v in vars(optuna.storages.BaseStorage).items() if callable(v) and not n.startswith("__")]
    return type("GrpcStorage", (base,), {n: translated(getattr(base, n)) for n in names if hasattr(base, n)})
