"""The storage of a study: open it (SQLite by default, any Optuna storage URL), record and check its
identity (stamp.py), its lock (lock.py), fail what dead workers left RUNNING (liveness.py), and say what went
wrong in one line. It does not decide what runs (queue.py).
"""

from __future__ import annotations

import time
import warnings
from contextlib import nullcontext
from functools import cached_property
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import optuna
import sqlalchemy
import sqlalchemy.exc

from explorer.errors import ExplorerError
from explorer.optuna_cache import owner_cache
from explorer.optuna_compat import storage_of
from explorer.study import stamp
from explorer.study.liveness import Observed, fail_dead, grpc_storage, journal_storage
from explorer.study.lock import StudyLock
from explorer.study.sqlite import SQLiteStorage

if TYPE_CHECKING:
    from explorer.study.spec import ResolvedStudy

# what a failing storage raises: SQLAlchemy (RDB), Optuna's wrapper of it, OS errors (journal file)
STORAGE_ERRORS = (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError, OSError)


class Store:
    """A study's Optuna storage: where it is, opening it to run or to read, its identity. `grid` queues a
    grid study's configurations (the queue's job), called under the lock as the identity is recorded."""

    def __init__(self, study: ResolvedStudy, grid: Callable[[optuna.Study], Any]):
        self.study = study
        self.grid = grid
        self._observed = Observed()  # this process's clock on trials that show no sign of life

    @cached_property
    def lock(self) -> StudyLock:
        """The study's lock across threads and processes (explorer.study.lock): queue decisions take it."""
        spec = self.study.spec
        return StudyLock(self.file() if not self.url.startswith("sqlite:///:memory:") else None, self.url, spec.name,
                         spec.storage_timeout_s, spec.heartbeat_s)

    @property
    def url(self) -> str:
        """The storage URL; a relative SQLite path is relative to the study's folder, like every path here."""
        spec, source = self.study.spec, self.study.source
        url = spec.storage
        if not url:
            return f"sqlite:///{(source.parent / f'{spec.name}.db').resolve()}"
        rest = url.removeprefix("sqlite:///")
        if url.startswith("sqlite:///") and rest and not rest.startswith(("/", ":memory:", "?", "file:")):
            return f"sqlite:///{(source.parent / rest).resolve()}"
        return url

    def file(self) -> Path | None:
        """The file the storage lives in (SQLite, journal), resolved; None for a database server."""
        url = self.url
        if url.startswith("journal:"):
            return self.study.path(url.removeprefix("journal:"), "storage", must_exist=False).resolve()
        if url.startswith("sqlite:///"):  # a path, or a URI filename (file:PATH?mode=ro&uri=true)
            return Path(url.removeprefix("sqlite:///").split("?")[0].removeprefix("file:"))
        return None

    def shown_location(self) -> str:
        """The storage's file, or its URL with any password masked: fit to print."""
        file = self.file()
        return str(file) if file else shown(self.url)

    def storage(self, *, create: bool = False) -> optuna.storages.BaseStorage:
        """The Optuna storage, with heartbeats: RDB (SQLite default), `journal:PATH` for a journal file, or
        `grpc://HOST:PORT` for Optuna's gRPC storage proxy.

        `create` takes the study's lock around Optuna's check-then-create of the tables, so workers
        opening a new database at once create them once (readers never take it: they write nothing).
        """
        url, spec = self.url, self.study.spec
        grace = 3 * spec.heartbeat_s
        file = self.file()
        if file is not None and not file.parent.is_dir():  # said before the lock beside it names a file of its own
            raise ExplorerError(f"cannot open storage {shown(url)!r}: its folder {file.parent} does not exist (create it, "
                                "or give storage: another path)", source=str(self.study.source), field="storage")
        try:
            if url.startswith("journal:"):
                return journal_storage(str(self.file()), spec.heartbeat_s, grace)
            if url.startswith("grpc://"):  # Optuna's gRPC storage proxy (pip install 'explorer[grpc]'), for very many workers
                return grpc_storage(url, spec.heartbeat_s, grace, min(spec.storage_timeout_s, 10.0))
            sqlite = url.startswith("sqlite")
            for attempt in range(5):
                try:  # heartbeats are "experimental" in Optuna since 2.8: say nothing about it on every open
                    with self.lock() if create else nullcontext(), \
                            warnings.catch_warnings(action="ignore", category=optuna.exceptions.ExperimentalWarning):
                        return (SQLiteStorage if sqlite else optuna.storages.RDBStorage)(
                            url,
                            engine_kwargs={"connect_args": {"timeout": spec.storage_timeout_s}} if sqlite else None,
                            heartbeat_interval=spec.heartbeat_s,
                            grace_period=grace,
                        )  # no stale-trial callback: the queue queues dead workers' trials again, under the lock
                except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError, sqlalchemy.exc.ProgrammingError) as err:
                    # a creator outside the lock (another tool, an older explorer) made the tables meanwhile
                    racing = isinstance(err, sqlalchemy.exc.IntegrityError) or "already exists" in str(err)
                    if not racing or attempt == 4:
                        raise
                    time.sleep(0.2 * (attempt + 1))
        except Exception as err:  # sqlalchemy/OS errors vary by backend; all mean "cannot open"
            raise self.error(err, "cannot open") from None

    def error(self, err: BaseException, what: str = "cannot use") -> ExplorerError:
        """A storage fault (locked, read-only, full, corrupt, unreachable) as one line naming the storage."""
        while err.__cause__ is not None:  # Optuna wraps the driver's error: report the driver's words
            err = err.__cause__
        text = str(getattr(err, "orig", None) or err).strip().splitlines()
        hint = ""  # the URL names a driver not installed
        if isinstance(err, ModuleNotFoundError):
            hint = ("; install grpcio: pip install 'explorer[grpc]'" if (err.name or "").startswith("grpc") else
                    "; install the driver (postgresql:// uses psycopg 3: pip install 'explorer[postgres]')")
        return ExplorerError(f"{what} storage {shown(self.url)!r}: {text[0] if text else type(err).__name__}{hint}",
                             source=str(self.study.source), field="storage")

    def open(self, *, create: bool = True, force: bool = False, own_cache: bool = False) -> optuna.Study:
        """Create the Optuna study or load the existing one, to run it; several workers may open it at once.

        `own_cache` reads it through a cache that holds the trials this process runs (optuna_cache.owner_cache:
        the Ray driver's, whose trials all run through its one process).

        An existing study whose space, task or objectives differ is refused unless `force`: its stored
        trials would silently mix two questions. A grid study queues every feasible configuration as a
        WAITING trial when it is created: workers pop queued trials atomically, so none is run twice.
        """
        study = self.study
        storage = self.existing() if not create else self.storage(create=True)
        storage = self._owned(owner_cache(storage)) if own_cache else storage
        directions = [o.direction for o in study.objectives]
        kwargs = dict(study_name=study.spec.name, storage=storage, sampler=study.sampler())
        try:
            with self.lock():  # one worker records a new study's identity and queue; the others then see them
                if create:
                    try:
                        ostudy = optuna.create_study(directions=directions, **kwargs)
                    except optuna.exceptions.DuplicatedStudyError:
                        ostudy = optuna.load_study(**kwargs)
                else:
                    ostudy = optuna.load_study(**kwargs)
                ostudy.sampler = study.sampler(ostudy)  # over the stored study's encoding
                stamp.record_or_check(self.study, ostudy, force, self.grid, self.shown_location())
        except KeyError:
            raise ExplorerError(f"no study {study.spec.name!r} in {self.url}", source=str(study.source)) from None
        except STORAGE_ERRORS as err:
            raise self.error(err, "cannot open") from None
        return ostudy

    def own(self, ostudy: optuna.Study) -> optuna.Study:
        """`ostudy` read and written through a cache of the trials this process runs (optuna_cache.owner_cache,
        RDB storages), which the study's lock keeps in step with the storage; `disown` stores what it kept."""
        storage = owner_cache(storage_of(ostudy))
        if storage is storage_of(ostudy):
            return ostudy
        return optuna.load_study(study_name=ostudy.study_name, storage=self._owned(storage), sampler=ostudy.sampler)

    def _owned(self, storage: optuna.storages.BaseStorage) -> optuna.storages.BaseStorage:
        if hasattr(storage, "flush"):
            self.lock.caches.append(storage)  # decisions under the lock read the storage anew and are stored at its release
        return storage

    def disown(self, ostudy: optuna.Study) -> None:
        """Store what `own`'s cache kept (running trials' curves), and let the lock forget it."""
        storage = storage_of(ostudy)
        if storage in self.lock.caches:
            self.lock.caches.remove(storage)
            storage.flush()

    def read(self) -> optuna.Study:
        """The stored study, to read: nothing is written (no identity, no queue, no file).

        `status`, `export`, `recommend` and `dashboard` use this; `changed` says whether the YAML
        still describes the stored study.
        """
        storage = self.existing()
        try:
            return optuna.load_study(study_name=self.study.spec.name, storage=storage)
        except KeyError:
            raise ExplorerError(f"no study {self.study.spec.name!r} in {shown(self.url)}", source=str(self.study.source)) from None
        except STORAGE_ERRORS as err:
            raise self.error(err, "cannot open") from None

    def existing(self) -> optuna.storages.BaseStorage:
        """The storage of a study that must exist already: loading must not create an empty file."""
        file = self.file()
        if file is not None and not file.exists():
            raise ExplorerError(f"no study {self.study.spec.name!r} yet: {file} does not exist (start it with `explorer run`)",
                                source=str(self.study.source), field="storage")
        return self.storage()

    def changed(self, ostudy: optuna.Study) -> str | None:
        """One line saying how this YAML differs from what the stored study was made with, or None (stamp.py)."""
        return stamp.changed(self.study, ostudy, self.shown_location())

    def repair(self, ostudy: optuna.Study) -> None:
        """Fail the RUNNING trials of dead workers (explorer.study.liveness); the queue queues them again."""
        fail_dead(ostudy, self._observed)


def shown(url: str) -> str:
    """A storage URL fit for messages and logs: a server's password is masked."""
    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:  # not an RDB URL (journal:PATH) or not parseable: nothing to hide in it
        return url
