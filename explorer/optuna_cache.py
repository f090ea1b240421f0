"""A worker's cache of its Optuna storage (`owner_cache`: the Ray driver's, a local executor's), built on
Optuna's private cache and RDB models: with `optuna_compat.py`, the only module that uses Optuna's private
names (each looked up when used, a missing one saying what it breaks). Bottom floor: it imports nothing
of explorer's but that module.
"""

from __future__ import annotations

import bisect
import functools
import math
from typing import Any

import optuna

from explorer.optuna_compat import _private, backend_of, rdb_models, storage_of


def owner_cache(storage: optuna.storages.BaseStorage, fresh_for: float = 1.0) -> optuna.storages.BaseStorage:
    """`storage` read through a cache that holds the trials this process runs (RDB storages only; others
    are returned as they are: the journal replays its log in memory, the gRPC proxy caches itself).

    Optuna's own cache (`_CachedStorage`) keeps finished trials but reads every unfinished one again on
    each `get_trials`, and writes each attribute in a transaction of its own: a Ray driver with 64 trials
    running rebuilt all 64 several times per `suggest`, and committed some 45 times per trial. Here:

    - A trial this process set RUNNING (asked, or popped from the queue) is its own: every write to it
      goes through this process, so its cached copy takes each write and it is never read again until
      it ends (then once, as stored). Another worker's one write to it, failing it as dead when this
      process's heartbeat starved, shows at its next write (the storage refuses it) or through `refresh`.
    - Writes to an owned trial (parameters, attributes, intermediate values) are kept and written in one
      transaction by `flush`: when the study's lock is released (`decided`, explorer.study.lock: what was
      written under it is stored before another worker decides), with the trial's end (the same transaction),
      from the heartbeat thread, and at most a second after a running trial's epoch (`flush_due`: one
      write a second for every curve, not one per trial and epoch). A process that dies first loses only
      what its unfinished trials wrote since; those are failed and run again anyway.
    - Other trials are read again at most every `fresh_for` seconds, and at once after `stale()` (the
      study's lock calls it when taken: decisions read the storage as it is). `changes` counts changes.
    """
    rdb = backend_of(storage)
    if not isinstance(rdb, optuna.storages.RDBStorage):
        return storage
    return _owner_cache_class()(rdb, fresh_for)


def trial_view(ostudy: optuna.Study) -> Any:
    """The `owner_cache` `ostudy` reads through, synced, with its study's id (`cache.trials(study_id)`: number
    -> trial; `cache.changes`: which changed since a version), or None for any other storage."""
    storage = storage_of(ostudy)
    if getattr(storage, "changes", None) is None:
        return None
    study_id = _private(ostudy, "_study_id", "reading a study's trials")
    storage._read_trials_from_remote_storage(study_id)
    return storage, study_id


def read_again(storage: optuna.storages.BaseStorage, trial_id: int) -> optuna.trial.FrozenTrial:
    """A trial as stored now, past any cache of it (`owner_cache`)."""
    return getattr(storage, "refresh", storage.get_trial)(trial_id)


def stored_state(storage: optuna.storages.BaseStorage, trial_id: int) -> optuna.trial.TrialState:
    """A trial's state as stored now, past any cache of it: an `owner_cache` reads that one column only."""
    if getattr(storage, "refresh", None) is None:
        return storage.get_trial(trial_id).state
    models = rdb_models()
    with _rdb_session(backend_of(storage)) as session:
        state = session.query(models.TrialModel.state).filter(models.TrialModel.trial_id == trial_id).scalar()
    if state.is_finished() and trial_id in storage._owned:  # ended by another worker (failed as dead): not ours any more
        storage.refresh(trial_id)
    return state


def flush_due(storage: optuna.storages.BaseStorage, seconds: float = 1.0) -> None:
    """Store what an `owner_cache` kept if it last did so `seconds` ago (a running trial's curve); else nothing."""
    flush = getattr(storage, "flush", None)
    if flush is not None:
        flush(due=seconds)


def record_heartbeats(storage: optuna.storages.BaseStorage, trial_ids: list[int]) -> None:
    """A heartbeat for each trial, in one transaction on an RDB storage (one write per trial otherwise)."""
    rdb = backend_of(storage)
    if not isinstance(rdb, optuna.storages.RDBStorage) or len(trial_ids) < 2:
        for trial_id in trial_ids:
            storage.record_heartbeat(trial_id)
        return
    import sqlalchemy

    models = rdb_models()
    with _rdb_session(rdb) as session:
        now = session.execute(sqlalchemy.func.now()).scalar_one()
        for trial_id in trial_ids:
            beat = models.TrialHeartbeatModel.where_trial_id(trial_id, session, True)
            if beat is None:
                session.add(models.TrialHeartbeatModel(trial_id=trial_id))
            else:
                beat.heartbeat = now


def _rdb_session(rdb: optuna.storages.RDBStorage) -> Any:
    import optuna.storages._rdb.storage as rdb_storage

    return _private(rdb_storage, "_create_scoped_session", "writing a trial in one transaction")(rdb.scoped_session)


def _write_ops(rdb: Any, models: Any, session: Any, trial_id: int, ops: list[tuple[str, tuple[Any, ...]]]) -> None:
    """An owned trial's kept writes in `session`: its row is checked once, and its attributes are written
    with one upsert per kind (the last value of a key wins, as the writes one by one would leave it)."""
    import json

    row = models.TrialModel.find_or_raise_by_id(trial_id, session)
    rdb.check_trial_is_updatable(trial_id, row.state)
    attrs: dict[str, dict[str, Any]] = {"user": {}, "system": {}}
    for op, args in ops:
        if op == "param" and args[3] is not None:  # checked against the study's own distribution already
            session.add(models.TrialParamModel(trial_id=trial_id, param_name=args[0], param_value=args[1],
                                               distribution_json=optuna.distributions.distribution_to_json(args[2])))
        elif op == "param":
            rdb._set_trial_param_without_commit(session, trial_id, *args)
        elif op == "step":
            rdb._set_trial_intermediate_value_without_commit(session, trial_id, *args)
        else:
            attrs[op][args[0]] = args[1]
    for op, model in (("user", models.TrialUserAttributeModel), ("system", models.TrialSystemAttributeModel)):
        if not attrs[op]:
            continue
        if rdb.engine.name not in ("sqlite", "postgresql"):
            for key, value in attrs[op].items():
                rdb._set_trial_attr_without_commit(session, model, trial_id, key, value)
            continue
        dialect = __import__(f"sqlalchemy.dialects.{rdb.engine.name}", fromlist=["insert"])
        insert = dialect.insert(model).values([{"trial_id": trial_id, "key": key, "value_json": json.dumps(value)}
                                               for key, value in attrs[op].items()])
        session.execute(insert.on_conflict_do_update(index_elements=[model.trial_id, model.key],
                                                     set_={"value_json": insert.excluded.value_json}))


def _store(rdb: Any, work: dict[int, list[tuple[str, tuple[Any, ...]]]], end: tuple[Any, Any] | None) -> Any:
    """Kept writes of owned trials in one transaction, with the end (state, values) of the one trial when
    `end`: returns its end time."""
    import datetime

    models, ended = rdb_models(), None
    with _rdb_session(rdb) as session:
        for trial_id, ops in work.items():
            _write_ops(rdb, models, session, trial_id, ops)
        if end is not None:
            (trial_id,) = end[2]
            trial = models.TrialModel.find_or_raise_by_id(trial_id, session, for_update=True)
            rdb.check_trial_is_updatable(trial_id, trial.state)
            for objective, value in enumerate(end[1] or ()):
                rdb._set_trial_value_without_commit(session, trial, objective, value)
            ended = datetime.datetime.now()
            trial.state, trial.datetime_complete = end[0], ended
    return ended


def _ended(trial: optuna.trial.FrozenTrial, state: Any, values: Any, at: Any) -> optuna.trial.FrozenTrial:
    """A copy of a running trial as its end stored it: its state, values and end time."""
    import copy

    trial = copy.copy(trial)
    trial.state, trial.datetime_complete = state, at
    trial.values = None if values is None else [float(v) for v in values]
    return trial


class Changes:
    """A count of the cache's changes and the trials each changed (the last 10,000 or more), so that a
    reader can judge again only the trials changed since it last read (`since`)."""

    def __init__(self) -> None:
        self.version = 0
        self._log: list[tuple[int, int]] = []  # (version, trial number)

    def add(self, number: int) -> None:
        self.version += 1
        self._log.append((self.version, number))
        if len(self._log) > 20_000:
            del self._log[:10_000]

    def since(self, version: int) -> set[int] | None:
        """The numbers of the trials changed after `version`; None when that is too far back to say."""
        if version == self.version:
            return set()
        if not self._log or self._log[0][0] > version + 1:
            return None
        return {number for _, number in self._log[bisect.bisect_right(self._log, (version, math.inf)):]}


@functools.cache
def _owner_cache_class() -> type:
    import copy
    import threading
    import time

    import optuna.storages._cached_storage as cached_storage
    from optuna.trial import TrialState

    feature = "a worker's cache of its trials"
    base, info = _private(cached_storage, "_CachedStorage", feature), _private(cached_storage, "_StudyInfo", feature)

    class OwnerCache(base):
        def __init__(self, backend: optuna.storages.RDBStorage, fresh_for: float) -> None:
            super().__init__(backend)
            self.fresh_for, self.changes, self.memo = fresh_for, Changes(), {}  # memo: what readers derive (explorer.identity)
            self._owned: set[int] = set()
            self._pending: dict[int, list[tuple[str, tuple[Any, ...]]]] = {}  # owned trial id -> writes not yet stored
            self._seen: dict[int, int] = {}  # study id -> the largest trial id read: every smaller one is known
            self._synced: dict[int, float] = {}  # study id -> when its trials were last read
            self._attrs: dict[int, tuple[float, dict[str, Any]]] = {}  # study id -> (when read, its user attrs)
            self._writing = threading.RLock()  # one write at a time (the driver's thread, the heartbeat thread)
            self._flushed = -math.inf  # when all kept writes were last flushed
            self._decided: set[int] = set()  # trials written since the study's lock was taken

        def trials(self, study_id: int) -> dict[int, optuna.trial.FrozenTrial]:
            """The cached trials by number (as of the last sync): to read only."""
            return self._studies[study_id].trials

        def beat(self, trial_ids: list[int]) -> None:
            """Heartbeats for these trials, in one transaction, never beside another of this process's writes
            (two of its threads in SQLite's busy wait would sleep in steps of up to 100 ms)."""
            with self._writing:
                record_heartbeats(self, trial_ids)

        def stale(self) -> None:
            """The study's lock was taken: read anew, and note what is written under it (`decided`)."""
            self._synced, self._attrs, self._decided = {}, {}, set()

        def decided(self) -> None:
            """The study's lock is being released: store what was written under it (not every running trial's curve)."""
            self.flush(list(self._decided))

        # -- reading ---------------------------------------------------------------------------------
        def _read_trials_from_remote_storage(self, study_id: int) -> None:
            with self._lock:
                if time.monotonic() - self._synced.get(study_id, -math.inf) < self.fresh_for:
                    return
                study = self._studies.setdefault(study_id, info())
                self._synced[study_id] = time.monotonic()
                trials = self._backend._get_trials(study_id, states=None, included_trial_ids=study.unfinished_trial_ids - self._owned,
                                                   trial_id_greater_than=self._seen.get(study_id, -1))
                self._remember(study_id, trials)

        def _remember(self, study_id: int, trials: list[optuna.trial.FrozenTrial], seen: bool = True) -> None:
            """Keep trials read (`seen`: by a sync, which leaves owned trials as this process holds them)."""
            study = self._studies.setdefault(study_id, info())
            if seen and trials:
                self._seen[study_id] = max(self._seen.get(study_id, -1), max(t._trial_id for t in trials))
                trials = [t for t in trials if t._trial_id not in self._owned]
            for trial in trials:
                old, tid = study.trials.get(trial.number), trial._trial_id
                if not seen or old is None or old != trial:  # (a trial read again by `refresh` has changed)
                    self.changes.add(trial.number)
                if trial.state.is_finished():
                    study.unfinished_trial_ids.discard(tid)
                    self._owned.discard(tid)
                    study.last_finished_trial_id = max(study.last_finished_trial_id, tid)
                else:
                    study.unfinished_trial_ids.add(tid)
            self._add_trials_to_cache(study_id, trials)

        def get_study_user_attrs(self, study_id: int) -> dict[str, Any]:  # (this process never writes them through here)
            read = self._attrs.get(study_id)
            if read is None or time.monotonic() - read[0] >= self.fresh_for:
                read = self._attrs[study_id] = (time.monotonic(), self._backend.get_study_user_attrs(study_id))
            return read[1]

        def refresh(self, trial_id: int) -> optuna.trial.FrozenTrial:
            """The trial as stored now (read again, after this process's writes to it), kept in the cache."""
            try:
                self.flush([trial_id])
            except optuna.exceptions.UpdateFinishedTrialError:  # another worker ended it: what it kept is dropped
                pass
            trial = self._backend.get_trial(trial_id)
            with self._lock:
                if trial_id in self._trial_id_to_study_id_and_number:
                    self._remember(self._trial_id_to_study_id_and_number[trial_id][0], [trial], seen=False)
            return trial

        def _owned_trial(self, trial_id: int) -> optuna.trial.FrozenTrial | None:
            if trial_id not in self._owned:
                return None
            study_id, number = self._trial_id_to_study_id_and_number[trial_id]
            return self._studies[study_id].trials[number]

        def get_trial(self, trial_id: int) -> optuna.trial.FrozenTrial:
            with self._lock:
                trial = self._owned_trial(trial_id)
            return trial if trial is not None else super().get_trial(trial_id)

        # -- writing ---------------------------------------------------------------------------------
        def create_new_trial(self, study_id: int, template_trial: optuna.trial.FrozenTrial | None = None) -> int:
            with self._writing:
                trial_id = super().create_new_trial(study_id, template_trial)
            with self._lock:
                self.changes.add(self._trial_id_to_study_id_and_number[trial_id][1])
                if trial_id == self._seen.get(study_id, -2) + 1:
                    self._seen[study_id] = trial_id  # no trial between: the next sync need not read it back
                self._studies[study_id].unfinished_trial_ids.add(trial_id)
                if template_trial is None or template_trial.state == TrialState.RUNNING:
                    self._owned.add(trial_id)  # asked here: this process runs it
            return trial_id

        def _keep(self, trial_id: int, op: str, args: tuple[Any, ...], field: str, key: Any, value: Any) -> bool:
            """Keep a write to an owned trial for `flush`, applied to its cached copy (a new object: earlier
            readers keep what they read); False for a trial not owned here (written at once)."""
            with self._lock:
                trial = self._owned_trial(trial_id)
                if trial is None:
                    return False
                self._pending.setdefault(trial_id, []).append((op, args))
                self._decided.add(trial_id)
                trial = copy.copy(trial)
                setattr(trial, field, {**getattr(trial, field), key: value})
                if field == "params":
                    trial.distributions = {**trial.distributions, key: args[2]}
                study_id, number = self._trial_id_to_study_id_and_number[trial_id]
                self._studies[study_id].trials[number] = trial
                self.changes.add(number)
                return True

        def set_trial_param(self, trial_id: int, name: str, internal: float, distribution: Any) -> None:
            study_id = self._trial_id_to_study_id_and_number[trial_id][0]
            known = self._studies[study_id].param_distribution.get(name)
            if known is not None and getattr(known, "choices", None) is not getattr(distribution, "choices", ()):
                optuna.distributions.check_distribution_compatibility(known, distribution)  # (the same choices are compatible)
            if not self._keep(trial_id, "param", (name, internal, distribution, known), "params", name,
                              distribution.to_external_repr(internal)):
                super().set_trial_param(trial_id, name, internal, distribution)
            self._studies[study_id].param_distribution.setdefault(name, distribution)

        def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
            self._keep(trial_id, "user", (key, value), "user_attrs", key, value) or super().set_trial_user_attr(trial_id, key, value)

        def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
            self._keep(trial_id, "system", (key, value), "system_attrs", key, value) or super().set_trial_system_attr(trial_id, key, value)

        def set_trial_intermediate_value(self, trial_id: int, step: int, value: float) -> None:
            self._keep(trial_id, "step", (step, value), "intermediate_values", step, value) or super().set_trial_intermediate_value(
                trial_id, step, value)

        def set_trial_state_values(self, trial_id: int, state: TrialState, values: Any = None) -> bool:
            try:
                if trial_id in self._owned and state.is_finished():
                    ended = self.flush([trial_id], (state, values))  # its last writes and its end: one transaction
                    with self._lock:  # the cached copy ends as stored, without reading it back
                        self._remember(self._trial_id_to_study_id_and_number[trial_id][0],
                                       [_ended(self._owned_trial(trial_id), state, values, ended)], seen=False)
                    return True
                with self._writing:
                    done = super().set_trial_state_values(trial_id, state=state, values=values)
            except optuna.exceptions.UpdateFinishedTrialError:  # (what it kept was dropped by the flush that found it so)
                self.refresh(trial_id)  # another worker ended it (failed it as dead): no longer ours
                raise
            if done and state == TrialState.RUNNING:
                with self._lock:
                    self._owned.add(trial_id)  # popped from the queue: this process runs it
                self.refresh(trial_id)  # as stored: its start time
            elif done:
                self.refresh(trial_id)
            return done

        def flush(self, trial_ids: list[int] | None = None, end: tuple[TrialState, Any] | None = None, due: float = 0) -> Any:
            """Store the kept writes of `trial_ids` (all owned trials when None) in one transaction, with
            the end of the one trial given when `end` (its state and values; returns its end time); with
            `due`, only if the last flush of all was that many seconds ago (a running trial's epochs)."""
            if due and time.monotonic() - self._flushed < due:
                return None
            if trial_ids is None:
                self._flushed = time.monotonic()
            with self._writing:
                with self._lock:
                    ids = list(self._pending) if trial_ids is None else [i for i in trial_ids if i in self._pending]
                    work = {i: self._pending.pop(i) for i in ids}
                if not work and end is None:
                    return
                try:
                    ended = _store(self._backend, work, None if end is None else (*end, trial_ids))
                except optuna.exceptions.UpdateFinishedTrialError:
                    if end is not None or (trial_ids is not None and len(work) < 2):
                        raise  # the one trial was ended by another worker: its writes are dropped
                    refused = True  # (a flush of all never raises it: the lock's release, the heartbeat)
                except BaseException:
                    self._give_back(work)  # not stored: kept for the next flush
                    raise
                else:
                    refused = False
            if end is not None:
                return ended
            if refused:  # another worker ended one of them (failed it as dead): the others' writes go one by one
                for trial_id, ops in work.items():
                    self._give_back({trial_id: ops})
                    try:
                        self.flush([trial_id])
                    except optuna.exceptions.UpdateFinishedTrialError:
                        self.refresh(trial_id)

        def _give_back(self, work: dict[int, list[tuple[str, tuple[Any, ...]]]]) -> None:
            with self._lock:
                for trial_id, ops in work.items():
                    self._pending[trial_id] = ops + self._pending.get(trial_id, [])

    return OwnerCache
