"""SQLite as Optuna's storage for several workers: the write lock taken at BEGIN, for writes only.

Python's sqlite3 driver begins a transaction only at the first write, so Optuna's check that a
queued (WAITING) trial is still waiting and its update to RUNNING are not atomic: two workers could
pop the same trial, and a read that turns into a write can fail with "database is locked". So every
transaction of a writing method begins with `BEGIN IMMEDIATE` (the write lock, waited for up to the
connect timeout, `storage_timeout_s`): the second worker then sees the trial RUNNING. Transactions of
the reading methods begin with a plain `BEGIN`, so `status` and `dashboard --watch` read while a
worker holds the write lock instead of queueing behind it (SQLAlchemy's documented recipe for
controlling BEGIN, with the driver's own transaction handling off).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import optuna
import sqlalchemy

from explorer.optuna_compat import rdb_private_readers

_READS = (  # RDBStorage's methods that only read; any other method's transaction takes the write lock
    "get_study_id_from_name", "get_study_name_from_id", "get_study_directions", "get_study_user_attrs",
    "get_study_system_attrs", "get_all_studies", "get_trial_user_attrs", "get_trial_system_attrs",
    "get_trial_param", "get_trial_id_from_study_id_trial_number", "get_trial", "get_all_trials",
    "get_best_trial",
)
_state = threading.local()  # Optuna's sessions are per thread, so is the flag


@contextmanager
def reading() -> Iterator[None]:
    """Transactions begun inside take no write lock (they must not write)."""
    previous = getattr(_state, "reading", False)
    _state.reading = True
    try:
        yield
    finally:
        _state.reading = previous


def _read_only(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        with reading():
            return method(self, *args, **kwargs)

    return wrapper


class SQLiteStorage(optuna.storages.RDBStorage):
    """RDBStorage whose SQLite transactions take the write lock at BEGIN unless they only read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)

        @sqlalchemy.event.listens_for(self.engine, "connect")
        def _autocommit_driver(dbapi_connection: Any, record: Any) -> None:
            dbapi_connection.isolation_level = None

        @sqlalchemy.event.listens_for(self.engine, "begin")
        def _begin(connection: sqlalchemy.Connection) -> None:
            connection.exec_driver_sql("BEGIN" if getattr(_state, "reading", False) else "BEGIN IMMEDIATE")

        self.engine.dispose()  # connections opened before the hooks (Optuna's schema check) are dropped


for _name in _READS + rdb_private_readers():
    setattr(SQLiteStorage, _name, _read_only(getattr(optuna.storages.RDBStorage, _name)))
