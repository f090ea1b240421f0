"""Many workers on one study: each race reproduced deterministically, not by hoping for a timing.

Two workers are two `Study` objects on one storage (each its own connections and its own hold on the
study's lock, as two processes have) or two threads of one. A `Rendezvous` injected after the read
that a decision rests on makes both workers read before either writes; with the study's lock the
second cannot read until the first has written, so the first waits out its patience and goes on alone.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from conftest import TINY_SPACE, write_study

import explorer.study.queue as queue_module
from explorer.executors.local import LocalExecutor
from explorer.optuna_compat import pop_waiting, storage_of, trial_storage_id
from explorer.study import load_study_spec
from explorer.study.liveness import beating

COMPLETE, FAIL, RUNNING, WAITING = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL,
                                    optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING)
WIDE_SPACE = {**TINY_SPACE, "free": {"layers": [1, 2, 3, 4], "heads": "divisors"}}
QUICK = {"epochs": 1, "max_steps": 2, "batch_size": 64, "lr": 0.003, "seed": 0}


class Rendezvous:
    """Each of two threads, at its first pass, waits (at most `patience` s) for the other to pass too.
    `met` says whether they did meet: whether one passed while the other still waited."""

    def __init__(self, patience: float = 2.0):
        self.patience = patience
        self.arrived: set[int] = set()
        self.waiting = 0
        self.met = False
        self._cond = threading.Condition()

    def __call__(self) -> None:
        me = threading.get_ident()
        with self._cond:
            if me in self.arrived:
                return
            self.arrived.add(me)
            if self.waiting:
                self.met = True
                self._cond.notify_all()
                return
            self.waiting += 1
            self._cond.wait_for(lambda: self.met, self.patience)
            self.waiting -= 1


def after_reads(monkeypatch: pytest.MonkeyPatch, meet: Rendezvous) -> None:
    """The queue's reads of the trials each end at the rendezvous."""
    real = queue_module.current_trials

    def read(*args, **kwargs):
        trials = real(*args, **kwargs)
        meet()
        return trials

    monkeypatch.setattr(queue_module, "current_trials", read)


def at_once(*calls: Callable[[], object]) -> list[object]:
    """Run the calls in threads started together; their results, in order (an exception is re-raised)."""
    results: list[object] = [None] * len(calls)
    start = threading.Barrier(len(calls))

    def run(i: int) -> None:
        start.wait()
        try:
            results[i] = calls[i]()
        except BaseException as err:  # noqa: BLE001
            results[i] = err

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def workers(path: Path, n: int = 2, shared: bool = False) -> list[tuple]:
    """`n` (study, optuna study) pairs on one storage: one `Study` shared by threads, or one each (processes)."""
    first = load_study_spec(path)
    pairs = [(first, first.open())]
    for _ in range(n - 1):
        study = first if shared else load_study_spec(path)
        pairs.append((study, pairs[0][1] if shared else study.open()))
    return pairs


@pytest.mark.parametrize("shared", [True, False], ids=["threads", "processes"])
def test_two_workers_asking_for_the_last_trial_at_once_start_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared: bool) -> None:
    """Issue 28, item 1: the count of what is left and the start are one step, for threads and processes."""
    path = write_study(tmp_path, space_doc=WIDE_SPACE, budget=QUICK, n_trials=1, sampler={"name": "random", "seed": 0})
    pairs = workers(path, shared=shared)
    meet = Rendezvous()
    after_reads(monkeypatch, meet)
    claimed = at_once(*(lambda s=s, o=o: s.queue.claim(o) for s, o in pairs))
    assert sum(c is not None for c in claimed) == 1
    assert len(pairs[0][1].get_trials(states=(RUNNING,))) == 1 and not meet.met


def test_replicates_queued_by_two_workers_at_once_are_queued_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 28, item 3: the replicate decision of one process is seen by the next, not made twice."""
    path = write_study(tmp_path, budget=QUICK, n_trials=2, replicates={"policy": "fixed"})
    study = load_study_spec(path)
    LocalExecutor().run(study, study.open())  # two configurations measured at seed 0
    path = write_study(tmp_path, budget={**QUICK, "seeds": 3}, n_trials=2, replicates={"policy": "fixed"})
    pairs = workers(path)
    meet = Rendezvous()
    after_reads(monkeypatch, meet)
    at_once(*(lambda s=s, o=o: s.queue.replicates(o) for s, o in pairs))
    queued = Counter((t.system_attrs["fixed_params"]["arch"], t.user_attrs["seed"]) for t in pairs[0][1].get_trials(states=(WAITING,))
                     if t.user_attrs.get("replicate"))
    assert len(queued) == 4 and set(queued.values()) == {1} and not meet.met


def test_a_dead_workers_trial_is_queued_again_once_by_two_workers_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 28, item 3: two workers that find the same dead trial queue one retry between them."""
    path = write_study(tmp_path, budget=QUICK)
    pairs = workers(path)
    study, ostudy = pairs[0]
    trial, _ = study.queue.claim(ostudy)
    ostudy.tell(trial, state=FAIL)  # what failing a stale heartbeat leaves
    meet = Rendezvous()
    after_reads(monkeypatch, meet)
    at_once(*(lambda s=s, o=o: s.queue.requeue_dead(o) for s, o in pairs))
    retries = [t for t in ostudy.get_trials(states=(WAITING,)) if t.user_attrs.get("retry_of") == trial.number]
    assert len(retries) == 1 and not meet.met


@pytest.mark.parametrize("storage", [None, "journal:tiny.log"], ids=["sqlite", "journal"])
def test_the_study_lock_excludes_two_processes(tmp_path: Path, storage: str | None) -> None:
    """The lock's holds by two Stores (two processes' views) never overlap: a real flock, not a thread lock."""
    path = write_study(tmp_path, storage=storage)
    locks = [load_study_spec(path).store.lock for _ in range(2)]
    inside, most = [0], [0]

    def hold(lock) -> None:
        for _ in range(20):
            with lock():
                inside[0] += 1
                most[0] = max(most[0], inside[0])
                time.sleep(0.002)
                inside[0] -= 1

    at_once(*(lambda lock=lock: hold(lock) for lock in locks))
    assert most[0] == 1 and locks[0].across_processes


def creating_at_once(monkeypatch: pytest.MonkeyPatch, *calls: Callable[[], object]) -> tuple[int, bool]:
    """Run `calls` at once with a rendezvous inside Optuna's table creation: (how many created at once, met)."""
    inside, most, meet = [0], [0], Rendezvous()
    real = optuna.storages.RDBStorage.__init__

    def creating(self, *args, **kwargs):
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        meet()
        try:
            real(self, *args, **kwargs)
        finally:
            inside[0] -= 1

    monkeypatch.setattr(optuna.storages.RDBStorage, "__init__", creating)
    at_once(*calls)
    return most[0], meet.met


def test_workers_opening_a_new_database_at_once_create_its_tables_one_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 28, item 2: Optuna creates its schema by check-then-create; under the lock, one worker at a time."""
    path = write_study(tmp_path)
    stores = [load_study_spec(path).store for _ in range(2)]
    assert creating_at_once(monkeypatch, *(lambda s=s: s.storage(create=True) for s in stores)) == (1, False)


def test_a_schema_another_creator_made_meanwhile_is_retried_not_fatal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 28, item 2: what PostgreSQL raises when a creator outside the lock won the race."""
    path = write_study(tmp_path)
    real, calls = optuna.storages.RDBStorage.__init__, []

    def lost_race(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise sqlalchemy.exc.ProgrammingError("CREATE TYPE studydirection", {}, Exception('type "studydirection" already exists'))
        real(self, *args, **kwargs)

    monkeypatch.setattr(optuna.storages.RDBStorage, "__init__", lost_race)
    load_study_spec(path).open()
    assert len(calls) == 2


def test_a_trial_without_a_heartbeat_is_judged_on_this_workers_clock_not_on_its_start_time(tmp_path: Path) -> None:
    """Issue 28, item 4: a start time stamped by another host's clock (an hour behind here) does not make
    a trial look dead; only this worker's own watch of it for the grace period does."""
    path = write_study(tmp_path, budget=QUICK)
    study = load_study_spec(path)
    ostudy = study.open()
    orphan = pop_waiting(ostudy)
    with sqlite3.connect(tmp_path / "tiny.db") as con:
        con.execute("UPDATE trials SET datetime_start = datetime('now', '-1 hour') WHERE trial_id = ?", (orphan,))
    study.store.repair(ostudy)
    assert storage_of(ostudy).get_trial(orphan).state == RUNNING
    deadline = time.monotonic() + 30
    while storage_of(ostudy).get_trial(orphan).state == RUNNING and time.monotonic() < deadline:
        time.sleep(0.2)
        study.store.repair(ostudy)
    assert storage_of(ostudy).get_trial(orphan).state == FAIL  # after 3 heartbeats of silence, watched here


def test_a_live_trial_failed_by_another_worker_stops_unrecorded_and_its_retry_resumes_it(tmp_path: Path) -> None:
    """Issue 28, item 4: a worker whose trial another worker failed as dead (its heartbeat was starved)
    stops training it without a record; the retry it then takes resumes from the checkpoint."""
    path = write_study(tmp_path, budget={"epochs": 4, "batch_size": 64, "lr": 0.003, "seed": 0}, n_trials=1,
                       sampler={"name": "random", "seed": 0})
    study = load_study_spec(path)
    ostudy = study.open()
    other = load_study_spec(path)  # the other worker, on its own connections
    other_ostudy = other.open()
    epochs_seen: list[int] = []
    evaluate = study.evaluator.evaluate

    def watched(cfg, lineage, on_epoch=None, *args, **kwargs):
        def seen(epoch, metrics):
            epochs_seen.append(epoch)
            if len(epochs_seen) == 1:  # the other worker fails this trial as dead, and queues its retry
                running = other_ostudy.get_trials(states=(RUNNING,))[0]
                storage_of(other_ostudy).set_trial_state_values(trial_storage_id(running), FAIL)
                other.queue.requeue_dead(other_ostudy)
            on_epoch(epoch, metrics)
        return evaluate(cfg, lineage, seen, *args, **kwargs)

    study.evaluator.evaluate = watched
    LocalExecutor().run(study, ostudy)
    trials = ostudy.get_trials()
    assert [t.state for t in trials] == [FAIL, COMPLETE] and trials[1].user_attrs["retry_of"] == 0
    assert "curve" not in trials[0].user_attrs  # nothing recorded after it was failed
    assert epochs_seen == [0, 1, 2, 3]  # the retry went on from the first epoch's checkpoint


def test_a_journal_trial_whose_worker_died_is_failed_and_run_again(tmp_path: Path) -> None:
    """Journal files have no heartbeats in Optuna: explorer's own find a dead worker's trial there too."""
    path = write_study(tmp_path, budget=QUICK, storage="journal:tiny.log")
    study = load_study_spec(path)
    ostudy = study.open()
    orphan = pop_waiting(ostudy)  # a worker killed right after taking a trial
    LocalExecutor().run(study, ostudy)
    assert storage_of(ostudy).get_trial(orphan).state == FAIL
    done = Counter(t.params["arch"] for t in ostudy.get_trials(states=(COMPLETE,)))
    assert sorted(done) == sorted(study.keys) and set(done.values()) == {1}
    assert not ostudy.get_trials(states=(RUNNING, WAITING))


def test_a_heartbeat_outlives_a_beat_that_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A storage locked at one beat must not end the beats: the live trial would be reclaimed."""
    path = write_study(tmp_path, budget=QUICK)
    study = load_study_spec(path)
    ostudy = study.open()
    trial, _ = study.queue.claim(ostudy)
    storage, beats = storage_of(ostudy), []
    real = storage.record_heartbeat

    def flaky(trial_id: int) -> None:
        beats.append(trial_id)
        if len(beats) == 2:
            raise sqlalchemy.exc.OperationalError("UPDATE trial_heartbeats", {}, Exception("database is locked"))
        real(trial_id)

    monkeypatch.setattr(storage, "record_heartbeat", flaky)
    with beating(ostudy, trial):
        deadline = time.monotonic() + 30
        while len(beats) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
    assert len(beats) >= 4


def test_trials_stored_without_an_identity_are_set_aside_by_run_force(tmp_path: Path) -> None:
    """Trials of a study run before trials recorded their identity belong to the question asked then."""
    path = write_study(tmp_path, budget=QUICK, n_trials=2)
    study = load_study_spec(path)
    LocalExecutor().run(study, study.open())
    with sqlite3.connect(tmp_path / "tiny.db") as con:  # as an older explorer stored them
        con.execute("DELETE FROM trial_user_attributes WHERE key = 'identity'")
    forced = load_study_spec(write_study(tmp_path, budget={**QUICK, "max_steps": 3}, n_trials=2))
    ostudy = forced.open(force=True)
    assert forced.reads.set_aside(ostudy) == 2 and forced.reads.finished(ostudy) == 0
    LocalExecutor().run(forced, ostudy)
    assert forced.reads.finished(ostudy) == 2 and forced.reads.set_aside(ostudy) == 2


def test_retry_failed_runs_the_failed_configurations_not_the_grids_unrun_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A grid with n_trials below its size keeps its unrun configurations queued; `--retry-failed` must
    run the failed configurations it asked for, not those."""
    path = write_study(tmp_path, space_doc=WIDE_SPACE, budget=QUICK, n_trials=3)
    study = load_study_spec(path)
    ostudy = study.open()
    first = ostudy.get_trials(states=(WAITING,))[0].system_attrs["fixed_params"]["arch"]
    evaluate = study.evaluator.evaluate

    def nan_for_first(cfg, *args, **kwargs):
        if cfg.key == first:
            from explorer.errors import TrialFailed

            raise TrialFailed("loss is nan")
        return evaluate(cfg, *args, **kwargs)

    monkeypatch.setattr(study.evaluator, "evaluate", nan_for_first)
    LocalExecutor().run(study, ostudy)
    monkeypatch.undo()
    assert study.queue.retry_failed(ostudy) == [first]
    LocalExecutor().run(study, ostudy)
    done = [t.params["arch"] for t in ostudy.get_trials(states=(COMPLETE,))]
    assert len(done) == 3 and first in done
    assert len(ostudy.get_trials(states=(WAITING,))) == len(study.keys) - 3  # the rest of the grid still queued


def test_a_stray_queued_copy_of_a_complete_configuration_is_answered_from_storage_not_left_queued(tmp_path: Path) -> None:
    """A queued trial whose (configuration, seed) is complete already (a copy queued twice, as one CI run of
    the stress test left 27) is taken and answered from storage once `n_trials` admits nothing more,
    instead of staying WAITING for ever; nothing is trained twice."""
    path = write_study(tmp_path, space_doc=WIDE_SPACE, budget=QUICK, n_trials=100)  # the whole grid
    study = load_study_spec(path)
    ostudy = study.open()
    LocalExecutor().run(study, ostudy)
    measured = ostudy.get_trials(states=(COMPLETE,))
    queue_module.enqueue(study, ostudy, {"arch": measured[0].params["arch"]})  # the stray copy
    LocalExecutor().run(study, ostudy)
    assert not ostudy.get_trials(states=(WAITING,))
    copies = [t for t in ostudy.get_trials(states=(COMPLETE,)) if "duplicate_of" in t.user_attrs]
    assert [t.user_attrs["duplicate_of"] for t in copies] == [measured[0].number]


def test_a_round_runs_beside_the_last_ones_trials_and_skips_only_configurations_still_in_flight(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 34: with several workers, an `adaptive` (or `decide`) round does not wait for every trial of
    the last one: a result queues the runs the policy then wants, except for configurations whose own run
    is still in flight (asked again when it ends). The policy reads each set of results once."""
    path = write_study(tmp_path, budget=QUICK, n_trials=3, sampler={"name": "random", "seed": 0})
    study = load_study_spec(path)
    LocalExecutor().run(study, study.open())  # three configurations measured at seed 0
    path = write_study(tmp_path, budget={**QUICK, "seeds": 3}, n_trials=3, sampler={"name": "random", "seed": 0},
                       replicates={"policy": "adaptive"})
    study = load_study_spec(path)
    ostudy = study.open()
    asked: list[set[str]] = []

    def every_measured(summary, *args, **kwargs) -> list[str]:  # the policy wants one more seed everywhere
        asked.append({k for k, n in zip(summary["arch"], summary["n"]) if n > 0})
        return sorted(asked[-1])

    monkeypatch.setattr(queue_module, "wanted", every_measured)
    first = study.queue.replicates(ostudy)
    assert sorted(seed for _, seed in first) == [1, 1, 1] and len(asked) == 1
    running = [study.queue.claim(ostudy) for _ in first]
    assert study.queue.replicates(ostudy) == [] and len(asked) == 1  # the same results: not read again

    trial, cfg = running[0]  # one of them ends; the other two are still in flight
    attrs = study.evaluator.evaluate(cfg, trial.number, seed=study.seed_of(trial))
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    ostudy.tell(trial, study.evaluator.values(attrs))
    assert study.queue.replicates(ostudy) == [(cfg.key, 2)] and len(asked) == 2  # at once, not after the other two
    study.queue.claim(ostudy)
    assert study.queue.replicates(ostudy) == [] and len(asked) == 2


def test_fixed_replicates_want_the_summarys_rows_without_fitting_its_posterior(tmp_path: Path) -> None:
    """`fixed` reads the completed runs, not a posterior fit: the same configurations, in the same order, as
    the summary-based policy (those measured and short of the seeds; one at every seed is left out)."""
    path = write_study(tmp_path, budget={**QUICK, "seeds": 2}, n_trials=3, sampler={"name": "random", "seed": 0},
                       replicates={"policy": "fixed"})
    study = load_study_spec(path)
    ostudy = study.open()
    LocalExecutor().run(study, ostudy)  # three configurations at both seeds
    ostudy.enqueue_trial({"arch": next(k for k in study.configs if k not in study.reads.summary(ostudy, draws=0)["arch"].tolist())})
    path = write_study(tmp_path, budget={**QUICK, "seeds": 3}, n_trials=4, sampler={"name": "random", "seed": 0},
                       replicates={"policy": "fixed"})
    study = load_study_spec(path)
    ostudy = study.open()
    assert study.queue.claim(ostudy) is not None
    trial = ostudy.get_trials(states=(RUNNING,))[0]
    attrs = study.evaluator.evaluate(study.configs[trial.params["arch"]], trial.number, seed=0)
    for key, value in attrs.items():
        storage_of(ostudy).set_trial_user_attr(trial_storage_id(trial), key, value)
    ostudy.tell(trial.number, study.evaluator.values(attrs))  # a fourth configuration at one seed
    summary = study.reads.summary(ostudy, draws=0)
    expected = queue_module.wanted(summary, 3, study.spec.replicates)
    assert queue_module._wanted_rows(study.queue, ostudy) == expected and len(expected) == 4
    path = write_study(tmp_path, budget={**QUICK, "seeds": 2}, n_trials=4, sampler={"name": "random", "seed": 0},
                       replicates={"policy": "fixed"})
    study = load_study_spec(path)  # now three are at every seed
    ostudy = study.open()
    expected = queue_module.wanted(study.reads.summary(ostudy, draws=0), 2, study.spec.replicates)
    assert queue_module._wanted_rows(study.queue, ostudy) == expected == [trial.params["arch"]]
