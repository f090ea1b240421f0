"""The storage of a study: open it (SQLite by default, any Optuna storage URL), record and check its
identity, repair what dead workers left (heartbeats), and say what went wrong in one line.

This is the only module of explorer (and its benches) that touches Optuna's private names; each use is
named in the section at the end and guarded, so that an Optuna release that renames one breaks the
feature that needs it with one line, not `import explorer`. It does not decide what runs (queue.py).
"""

from __future__ import annotations

import functools
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
import sqlalchemy
import sqlalchemy.exc

from explorer.errors import ExplorerError

if TYPE_CHECKING:
    from explorer.study.spec import Study

# what a failing storage raises: SQLAlchemy (RDB), Optuna's wrapper of it, OS errors (journal file)
STORAGE_ERRORS = (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError, OSError)


class Store:
    """A study's Optuna storage: where it is, opening it to run or to read, its identity."""

    def __init__(self, study: Study):
        self.study = study

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
        if url.startswith("sqlite:///"):
            return Path(url.removeprefix("sqlite:///").split("?")[0])
        return None

    def shown_location(self) -> str:
        """The storage's file, or its URL with any password masked: fit to print."""
        file = self.file()
        return str(file) if file else shown(self.url)

    def storage(self) -> optuna.storages.BaseStorage:
        """The Optuna storage: RDB (SQLite default) with heartbeats, or `journal:PATH` for a journal file."""
        url, spec = self.url, self.study.spec
        try:
            if url.startswith("journal:"):
                backend = optuna.storages.journal.JournalFileBackend(str(self.file()))
                return optuna.storages.JournalStorage(backend)
            sqlite = url.startswith("sqlite")
            for attempt in range(5):
                try:  # heartbeats are "experimental" in Optuna since 2.8: say nothing about it on every open
                    with warnings.catch_warnings(action="ignore", category=optuna.exceptions.ExperimentalWarning):
                        storage = (SQLiteStorage if sqlite else optuna.storages.RDBStorage)(
                            url,
                            engine_kwargs={"connect_args": {"timeout": spec.storage_timeout_s}} if sqlite else None,
                            heartbeat_interval=spec.heartbeat_s,
                            grace_period=3 * spec.heartbeat_s,
                            heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=3),
                        )
                    break
                except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError) as err:
                    # processes creating a new storage's schema at once: one wins, the others see its rows or tables
                    racing = isinstance(err, sqlalchemy.exc.IntegrityError) or "already exists" in str(err)
                    if not racing or attempt == 4:
                        raise
                    time.sleep(0.2 * (attempt + 1))
            return storage
        except Exception as err:  # sqlalchemy/OS errors vary by backend; all mean "cannot open"
            raise self.error(err, "cannot open") from None

    def error(self, err: BaseException, what: str = "cannot use") -> ExplorerError:
        """A storage fault (locked, read-only, full, corrupt, unreachable) as one line naming the storage."""
        while err.__cause__ is not None:  # Optuna wraps the driver's error: report the driver's words
            err = err.__cause__
        text = str(getattr(err, "orig", None) or err).strip().splitlines()
        hint = ("; install the driver (postgresql:// uses psycopg 3: pip install 'explorer[postgres]')"
                if isinstance(err, ModuleNotFoundError) else "")  # the URL names a database driver not installed
        return ExplorerError(f"{what} storage {shown(self.url)!r}: {text[0] if text else type(err).__name__}{hint}",
                             source=str(self.study.source), field="storage")

    def open(self, *, create: bool = True, force: bool = False) -> optuna.Study:
        """Create the Optuna study or load the existing one, to run it; several workers may open it at once.

        An existing study whose space, task or objectives differ is refused unless `force`: its stored
        trials would silently mix two questions. A grid study queues every feasible configuration as a
        WAITING trial when it is created: workers pop queued trials atomically, so none is run twice.
        """
        study = self.study
        storage = self.existing() if not create else self.storage()
        directions = [o.direction for o in study.objectives]
        kwargs = dict(study_name=study.spec.name, storage=storage, sampler=study.sampler())
        try:
            created = False
            if create:
                try:
                    ostudy = optuna.create_study(directions=directions, **kwargs)
                    created = True
                except optuna.exceptions.DuplicatedStudyError:
                    ostudy = optuna.load_study(**kwargs)
            else:
                ostudy = optuna.load_study(**kwargs)
            ostudy.sampler = study.sampler(ostudy)  # over the stored study's encoding
            self._check_identity(ostudy, created, force)
        except KeyError:
            raise ExplorerError(f"no study {study.spec.name!r} in {self.url}", source=str(study.source)) from None
        except STORAGE_ERRORS as err:
            raise self.error(err, "cannot open") from None
        return ostudy

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
        """One line saying how this YAML differs from what the stored study was made with, or None."""
        stored = ostudy.user_attrs.get("identity")
        identity = self.study.identity()
        if stored is None or stored == identity:
            return None
        fields = sorted(k for k in identity if identity[k] != stored.get(k))
        return f"the stored study was made with another {', '.join(fields)}; rerun with --force to continue it anyway"

    def _check_identity(self, ostudy: optuna.Study, created: bool, force: bool) -> None:
        """Record what the study answers (its creator does, after queueing a grid) or check it matches."""
        study = self.study
        identity = study.identity()
        stored = ostudy.user_attrs.get("identity")
        deadline = time.monotonic() + 10
        while stored is None and not created and time.monotonic() < deadline:  # its creator is still writing
            time.sleep(0.2)
            stored = ostudy.user_attrs.get("identity")
        if stored is None:  # new (or its creator died before recording it)
            if [d.name.lower() for d in ostudy.directions] != [o.direction for o in study.objectives]:
                raise ExplorerError("the stored study has other objectives", source=str(study.source), field="objectives")
            study.queue.grid(ostudy)
            ostudy.set_metric_names([o.name for o in study.objectives])  # optuna-dashboard and optuna.visualization label them
            for key, value in {**identity, "encoding": study.encoding().name, "spec": study.spec.model_dump(mode="json"),
                               "space": study.space.to_dict(),
                               "baseline": study.space.baseline.key if study.space.baseline else None,
                               "metric": study.task.metric, "higher_is_better": study.task.higher_is_better,
                               "objectives": [o.model_dump() for o in study.objectives]}.items():
                ostudy.set_user_attr(key, value)
            ostudy.set_user_attr("identity", identity)  # last: other workers wait for it
            return
        changed = self.changed(ostudy)
        if changed:
            if not force:
                raise ExplorerError(changed, source=str(study.source))
            ostudy.set_user_attr("identity", identity)
            ostudy.set_metric_names([o.name for o in study.objectives])
            study.queue.grid(ostudy)  # a forced new space: queue its configurations no trial has taken

    def repair(self, ostudy: optuna.Study) -> None:
        """Fail the RUNNING trials of dead workers (stale heartbeats, or none past the grace period) and
        let Optuna's callback queue their retries. A no-op without heartbeats (journal files)."""
        with warnings.catch_warnings(action="ignore", category=optuna.exceptions.ExperimentalWarning):
            optuna.storages.fail_stale_trials(ostudy)
            _fail_unbeaten(ostudy)


def _fail_unbeaten(ostudy: optuna.Study) -> None:
    """Fail and retry RUNNING trials that never recorded a heartbeat, past the grace period.

    A worker killed between taking a trial and its first heartbeat (milliseconds) leaves such a
    trial; Optuna only fails trials whose heartbeat went stale, so it would stay RUNNING forever.
    """
    storage = storage_of(ostudy)
    rdb = backend_of(storage)
    if not isinstance(rdb, optuna.storages.RDBStorage) or rdb.heartbeat_interval is None:
        return
    grace = rdb.grace_period or 2 * rdb.heartbeat_interval
    with reading(), rdb.engine.connect() as connection:
        beating = {row[0] for row in connection.execute(sqlalchemy.text("SELECT trial_id FROM trial_heartbeats"))}
    now = datetime.now()  # Optuna stamps datetime_start with the worker's local clock, as here
    callback = storage.get_heartbeat_stale_trial_callback()
    for t in ostudy.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        tid = trial_storage_id(t)
        if tid in beating or t.datetime_start is None or (now - t.datetime_start).total_seconds() < grace:
            continue
        try:
            if storage.set_trial_state_values(tid, optuna.trial.TrialState.FAIL) and callback is not None:
                callback(ostudy, storage.get_trial(tid))
        except optuna.exceptions.UpdateFinishedTrialError:  # another worker got there first
            continue


def shown(url: str) -> str:
    """A storage URL fit for messages and logs: a server's password is masked."""
    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:  # not an RDB URL (journal:PATH) or not parseable: nothing to hide in it
        return url


# -- SQLite: the write lock taken for writes only ------------------------------------------------
# Python's sqlite3 driver begins a transaction only at the first write, so Optuna's check that a
# queued (WAITING) trial is still waiting and its update to RUNNING are not atomic: two workers could
# pop the same trial, and a read that turns into a write can fail with "database is locked". So every
# transaction of a writing method begins with `BEGIN IMMEDIATE` (the write lock, waited for up to the
# connect timeout, `storage_timeout_s`): the second worker then sees the trial RUNNING. Transactions of
# the reading methods begin with a plain `BEGIN`, so `status` and `dashboard --watch` read while a
# worker holds the write lock instead of queueing behind it (SQLAlchemy's documented recipe for
# controlling BEGIN, with the driver's own transaction handling off).

_READS = (  # RDBStorage's methods that only read; any other method's transaction takes the write lock
    "get_study_id_from_name", "get_study_name_from_id", "get_study_directions", "get_study_user_attrs",
    "get_study_system_attrs", "get_all_studies", "get_trial_user_attrs", "get_trial_system_attrs",
    "get_trial_param", "get_trial_id_from_study_id_trial_number", "get_trial", "get_all_trials",
    "get_best_trial",
)
_PRIVATE_READS = ("_get_stale_trial_ids", "_get_trials", "_get_best_trial_id")  # what Optuna's cache calls
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


for _name in _READS + _PRIVATE_READS:
    # a private reader Optuna renamed is left to take the write lock: slower reads, never a broken import
    if hasattr(optuna.storages.RDBStorage, _name):
        setattr(SQLiteStorage, _name, _read_only(getattr(optuna.storages.RDBStorage, _name)))


# -- Optuna's private names: every use in explorer and its benches -------------------------------
# Each is looked up when a feature needs it, never at import, and a missing one says which feature
# it breaks and which Optuna versions explorer is tested with.

def _private(owner: Any, name: str, feature: str) -> Any:
    try:
        return getattr(owner, name)
    except AttributeError:
        raise ExplorerError(f"{feature} needs Optuna's private {name!r}, which Optuna {optuna.__version__} "
                            "does not have (explorer is tested with Optuna 4 and 5)") from None


def storage_of(ostudy: optuna.Study) -> optuna.storages.BaseStorage:
    """The storage an Optuna study writes to (no public accessor): heartbeats and trial records by id."""
    return _private(ostudy, "_storage", "reaching a study's storage")


def backend_of(storage: optuna.storages.BaseStorage) -> optuna.storages.BaseStorage:
    """The RDB storage behind Optuna's cache in front of it (the storage itself when there is none)."""
    return getattr(storage, "_backend", storage)


def trial_storage_id(trial: optuna.Trial | optuna.trial.FrozenTrial) -> int:
    """A trial's id in its storage (Optuna's public API numbers trials per study; the storage's calls take ids)."""
    return _private(trial, "_trial_id", "recording a trial by its storage id")


def hypervolume(loss_points: Any, reference: Any) -> float:
    """Optuna's exact hypervolume (WFG) of points to minimise, against a reference point."""
    import optuna._hypervolume as hv

    return float(_private(hv, "compute_hypervolume", "the hypervolume")(loss_points, reference))


def pareto_mask(loss_points: Any) -> Any:
    """Optuna's own non-dominated mask of points to minimise (bench/pareto.py compares explorer's with it)."""
    import optuna.study._multi_objective as mo

    return _private(mo, "_is_pareto_front", "Optuna's Pareto mask")(loss_points, assume_unique_lexsorted=False)


def rdb_models() -> Any:
    """Optuna's SQLAlchemy table models (bench/dashboard.py writes large synthetic studies with them)."""
    import optuna.storages._rdb as rdb

    return _private(rdb, "models", "writing trial rows directly")


def pop_waiting(ostudy: optuna.Study) -> int | None:
    """Claim a queued trial atomically, as `ask()` does first; its storage id, or None when none waits
    (tests use it to play a worker that dies right after its claim)."""
    return _private(ostudy, "_pop_waiting_trial_id", "claiming a queued trial")()
