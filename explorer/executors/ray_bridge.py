"""The driver's side of a Ray study: the link to the Optuna storage, the searcher and the scheduler.

- `_Link`: the resolved study as picklable data (Tune pickles its searcher and scheduler, and Optuna
  storages hold locks and connections that do not pickle), reconnecting lazily, with heartbeats for the
  Optuna trials this driver has open.
- `OptunaBridge`, a Ray `Searcher`: `suggest` asks Optuna (feasible configurations only, queued retries
  first, duplicates of finished configurations answered from storage), `on_trial_result` stores the
  per-epoch curve, `on_trial_complete` tells Optuna (values and the same user attributes as `local`; a
  fault is recorded, retried and never measured: explorer.faults).
- `FaultScheduler`, a Ray `TrialScheduler`: Tune's first-in-first-out order, recording in storage each run
  of a trial that failed on its worker, and why (Tune tells a scheduler of every failed run, a searcher of
  none); `BinnedScheduler` adds explorer's parameter-binned pruner (median or successive halving, i.e.
  ASHA's rule) against every trial in storage, whichever executor or run made it.

Tune calls all of them on its one driver thread between every trial's events, so their work per call
is kept independent of how many trials the study stores: what runs is kept in memory (`running`), and a
trial is read from storage by its id, never by copying the study's trials (bench/ray_suggest.py).
"""

from __future__ import annotations

import functools
import json
import pickle
import threading
import time
from typing import Any

import optuna
from ray import cloudpickle
from ray.exceptions import RayTaskError
from ray.tune.experiment import Trial
from ray.tune.schedulers import FIFOScheduler, TrialScheduler
from ray.tune.search import Searcher

from explorer.executors.base import EpochCallback, TrialCallback
from explorer.faults import Fault
from explorer.study import Study
from explorer.optuna_cache import flush_due, read_again, record_heartbeats, stored_state
from explorer.optuna_compat import storage_of, trial_storage_id
from explorer.result import EPOCH_METRICS

_FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)
_BUILT: dict[str, Study] = {}  # the study a worker process rebuilt from a link's data (`_Link.study`)


# -- the link to the study ---------------------------------------------------------------------------------
class _Link:
    """The resolved study as data (spec, space, folder), picklable; the Optuna study is (re)opened where
    it is used, and the study is rebuilt from the data without reading its files.

    It also keeps the Optuna trials this driver has open alive with heartbeats, so that if the driver
    dies they go stale and the next `explorer run/resume` fails and re-queues them (as for `local`), and
    reads the replicate policy beside Tune's loop while trials run (`replicate`).
    """

    def __init__(self, study: Study, ostudy: optuna.Study | None = None, on_trial: TrialCallback | None = None,
                 on_epoch: EpochCallback | None = None):
        self.data = study.to_data()
        self.metric = study.task.metric
        self.execution = study.evaluator.execution  # the run's class, stamped on each trial at ask (a restored driver too)
        self.open_trials: dict[int, int] = {}  # Optuna trial number -> storage trial id, while RUNNING here
        # of the runs Tune starts, while this driver lives: the trials whose run reported (`attempted`), the fault a run
        # reported before raising it, the cause of each trial's last failed run (`failed`)
        self.training, self.reported, self.causes = set(), {}, {}
        self._study: Study | None = study
        self._ostudy = None if ostudy is None else study.store.own(ostudy)
        self.on_trial, self.on_epoch = on_trial, on_epoch
        self._beating: threading.Event | None = None
        self._wake, self.queued = threading.Event(), threading.Event()  # the policy has new results / queued runs
        self.policy_error: BaseException | None = None
        self.free = 1  # the trials Tune may still start, as the searcher last saw

    def __getstate__(self) -> dict[str, Any]:
        return {"data": self.data, "metric": self.metric, "open_trials": dict(self.open_trials), "execution": self.execution}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.data, self.metric, self.open_trials = state["data"], state["metric"], state["open_trials"]
        self.execution = state.get("execution")
        self._study = self._ostudy = self.on_trial = self.on_epoch = self._beating = None
        self._wake, self.queued, self.policy_error, self.free = threading.Event(), threading.Event(), None, 1
        self.training, self.reported, self.causes = set(), {}, {}

    def study(self) -> Study:
        """The study, rebuilt from its data once per process: Tune hands each trial a copy of the link, and a
        worker that runs many trials (reused actors) builds the study (its space's every configuration) once."""
        if self._study is None:
            key = json.dumps(self.data, sort_keys=True)
            if key not in _BUILT:
                _BUILT.clear()  # one study per worker process at a time
                _BUILT[key] = Study.from_data(self.data)
            self._study = _BUILT[key]
            self._study.evaluator.execution = self.execution
        return self._study

    def open(self) -> tuple[Study, optuna.Study]:
        study = self.study()
        if self._ostudy is None:
            self._ostudy = study.open(create=False, force=True, own_cache=True)
        if self._beating is None:
            self._beating = threading.Event()
            threading.Thread(target=self._heartbeat, args=(self._ostudy, self._beating), daemon=True).start()
            threading.Thread(target=self._replicating, args=(study, self._ostudy, self._beating), daemon=True).start()
        return study, self._ostudy

    def replicate(self, free: int = 1) -> None:
        """Have the replicate policy read the latest results (`Queue.replicates`) on this driver's policy
        thread, not on Tune's loop: a posterior fit takes a good part of a second at a few hundred trials,
        and every trial's start and end waits on that loop. Results that end during a fit are read
        together by the next. `queued` is set when a reading queued runs (or failed): the searcher then
        claims (or raises) at once rather than after its half second of quiet. `free`: the trials Tune may
        still start (a round's size)."""
        self.free = free
        self._wake.set()

    def _replicating(self, study: Study, ostudy: optuna.Study, stop: threading.Event) -> None:
        while not stop.is_set():
            if not self._wake.wait(0.5):
                continue
            self._wake.clear()
            try:
                if study.queue.replicates(ostudy, self.free):
                    self.queued.set()
            except Exception as err:  # noqa: BLE001  raised by the searcher's next `suggest`, on Tune's loop
                self.policy_error = err
                self.queued.set()

    def _heartbeat(self, ostudy: optuna.Study, stop: threading.Event) -> None:
        """Beat for every open trial, in one write, and store what their epochs reported since the last beat
        (their curves: the driver's cache keeps a running trial's writes until then)."""
        storage = storage_of(ostudy)  # Optuna's own heartbeat thread records on the study's storage too
        interval = storage.get_heartbeat_interval() if hasattr(storage, "get_heartbeat_interval") else None
        while interval and not stop.is_set():
            try:
                getattr(storage, "beat", functools.partial(record_heartbeats, storage))(list(self.open_trials.values()))
                if hasattr(storage, "flush"):
                    storage.flush()
            except Exception:  # noqa: BLE001  locked, briefly unreachable, or a trial ended meanwhile: the next beat retries
                pass
            stop.wait(interval)

    def tell(self, number: int, **kwargs: Any) -> None:
        """`Study.tell`, minus GridSampler's `study.stop()` (meant for `optimize`) once the grid is covered."""
        _, ostudy = self.open()
        trial_id = self.open_trials.pop(number, None)
        try:
            ostudy.tell(number, **kwargs)
        except RuntimeError as err:
            if "Study.stop" not in str(err):
                raise
        if self.on_trial is not None:  # the one trial, by its id: not a copy of every stored trial
            frozen = storage_of(ostudy).get_trial(trial_id) if trial_id is not None else ostudy.get_trials(deepcopy=False)[number]
            self.on_trial(ostudy, frozen)

    def attempted(self, number: int) -> None:
        """A run of the open trial `number` trains on a Ray worker (its first report): counted in the trial's
        `attempts`, stored at once, so that a driver restored after this one's death counts on from there."""
        self.training.add(number)
        self._store(number, "attempts", lambda attempts: (attempts or 0) + 1)

    def failed(self, number: int, cause: str) -> None:
        """A run of the open trial `number` failed on its Ray worker. One that had trained is a failed attempt
        (what `executor.max_failures` bounds): its cause is added to the trial's `faults`, stored at once. One
        that failed before it trained (its worker lost at start, its Ray checkpoint not restored) is no attempt.
        The run's own report of its fault (`reported`: a broken CUDA context, its node and process) says it best."""
        self.causes[number] = cause = self.reported.pop(number, None) or cause
        if number in self.training:
            self.training.discard(number)
            self._store(number, "faults", lambda faults: [*(faults or []), cause])

    def _store(self, number: int, key: str, change: Any) -> None:
        """Change a user attribute of the open trial `number` and store it now (one transaction)."""
        if number not in self.open_trials:
            return
        storage, trial_id = storage_of(self.open()[1]), self.open_trials[number]
        try:
            storage.set_trial_user_attr(trial_id, key, change(storage.get_trial(trial_id).user_attrs.get(key)))
            if hasattr(storage, "flush"):
                storage.flush([trial_id])
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # ended meanwhile by another worker (failed as dead): nothing of it is this driver's to record

    def release(self) -> bool:
        """After the Tuner stops: fail the trials still open, saying why, and queue their configurations.

        Trials are still open only when Tune stopped before they ended (Ctrl-C): returns whether any was.
        """
        stopped = False
        if self._ostudy is not None:
            for number, trial_id in list(self.open_trials.items()):
                trial = read_again(storage_of(self._ostudy), trial_id)
                if trial.state not in _FINISHED:
                    stopped = True
                    storage_of(self._ostudy).set_trial_user_attr(
                        trial_id, "interrupted", "the Ray run was interrupted (Ctrl-C) while it ran; its configuration is queued again")
                    self.tell(number, state=optuna.trial.TrialState.FAIL)
            self.study().queue.requeue_dead(self._ostudy)
            self.study().store.disown(self._ostudy)
        self.open_trials.clear()
        if self._beating is not None:
            self._beating.set()
        return stopped


# -- Optuna <-> Ray Tune ------------------------------------------------------------------------------------
class OptunaBridge(Searcher):
    """A Ray searcher that asks and tells the study's Optuna storage.

    The last report of a trial carries its attributes (or its failure reason, with a NaN metric, which
    Tune's best-result ignores), and the searcher, not Ray, decides when the study is done (`num_samples=-1`; `FINISHED` once finished plus open trials reach `n_trials`). A sampled
    configuration that an open trial is training is held back until that one ends, then answered
    from storage if it completed: no configuration is trained twice.
    """

    def __init__(self, link: _Link, slots: int = 1):
        super().__init__()
        self.link = link
        self.slots = slots  # trials at once (Tune's max_concurrent_trials): a round hands out what is free of them
        self.ray_ids: dict[str, int] = {}  # Ray trial id -> Optuna trial number
        self.held: dict[int, tuple[str, int]] = {}  # Optuna trial number -> (configuration key, seed), waiting for its twin
        self.running: dict[str, tuple[str, int]] = {}  # Ray trial id -> (configuration key, seed) it trains
        self.curves: dict[int, list[float]] = {}

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec: Any) -> bool:
        return True  # the space is the study's; nothing to take from Tune

    slots = 1  # a searcher pickled before it kept its slots (a Tuner restored from then)
    quiet_until = 0.0  # no claim is tried again before then, unless a trial ends or the policy queued runs: Tune asks on every turn of its loop

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if time.monotonic() < self.quiet_until and not self.link.queued.is_set():
            return None
        self.link.queued.clear()
        if self.link.policy_error is not None:
            raise self.link.policy_error
        study, ostudy = self.link.open()
        for number, run in list(self.held.items()):
            if run not in self.running.values():
                del self.held[number]
                if not self._answer_from_storage(number, run[0]):
                    return self._launch(trial_id, number, run[0])
        read = False  # whether the replicate policy was read here since the last claim
        while True:
            with study.store.lock():  # one hold: one read of the storage, one write of what the claim and launch wrote
                study.queue.requeue_dead(ostudy)  # a fault's retry, or a dead worker's run, goes before new proposals
                claimed = None if study.reads.too_many_failures(ostudy) else study.queue.claim(ostudy)
                if claimed is not None:
                    trial, cfg = claimed
                    self.link.open_trials[trial.number] = trial_storage_id(trial)
                    key = cfg.key
                    if (key, study.seed_of(trial)) in self.running.values():
                        self.held[trial.number] = (key, study.seed_of(trial))
                    elif not self._answer_from_storage(trial.number, key):
                        return self._launch(trial_id, trial.number, key)
                    read = False
                    continue
            if self.held or self.link.open_trials:
                # their results may queue replicates or retries (read on the policy thread, which wakes this
                # searcher); another worker's queued trials are seen within half a second
                self.link.replicate(self.free())
                self.quiet_until = time.monotonic() + 0.5
                return None
            if read or study.reads.too_many_failures(ostudy):
                return Searcher.FINISHED
            study.queue.replicates(ostudy, self.free())  # nothing runs: the last results are read here, then one more claim
            read = True

    def free(self) -> int:
        """Trials Tune may start besides those running and held (it asks `suggest` only below the limit)."""
        return max(1, self.slots - len(self.running) - len(self.held))

    def _answer_from_storage(self, number: int, key: str) -> bool:
        """A configuration that already completed is not trained again (`Study.answer_from_storage`, as `local`)."""
        study, ostudy = self.link.open()
        values = study.evaluator.answer_from_storage(ostudy, optuna.Trial(ostudy, self.link.open_trials[number]), study.configs[key])
        if values is None:
            return False
        self.link.tell(number, values=values)
        return True

    def _launch(self, trial_id: str, number: int, key: str) -> dict[str, Any]:
        study, ostudy = self.link.open()
        cfg = study.configs[key]
        trial = optuna.Trial(ostudy, self.link.open_trials[number])
        trial.set_user_attr("config", cfg.dims)
        trial.set_user_attr("params", cfg.params)
        self.ray_ids[trial_id] = number
        self.running[trial_id] = (key, study.seed_of(trial))
        self.curves[number] = []
        frozen = storage_of(ostudy).get_trial(self.link.open_trials[number])
        return {"arch": key, "optuna_number": number, "lineage": study.lineage(frozen),  # a retry resumes its checkpoint
                "seed": study.seed_of(trial), "epochs": study.length_of(trial), "alone": bool(frozen.user_attrs.get("alone"))}  # alone: a GPU of its own

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        number = self.ray_ids.get(trial_id)
        if result.get("iterations_since_restore") == 1:  # a run's first report (Tune counts iterations from each start)
            self.link.attempted(number)
        if result.get("broken") and number in self.link.open_trials:  # the worker's CUDA context broke: it raises, Ray retries it
            self.link.reported[number] = result["fault"]
        self._record_epoch(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        self.quiet_until = 0.0  # its end may let a trial start: a held twin; the policy reads its result (`link.replicate`)
        number = self.ray_ids.pop(trial_id, None)
        self.running.pop(trial_id, None)
        if number is None:
            return
        study, ostudy = self.link.open()
        storage_id = self.link.open_trials.get(number)
        if storage_id is None or stored_state(storage_of(ostudy), storage_id) in _FINISHED:  # reclaimed meanwhile
            self.link.open_trials.pop(number, None)
            return
        trial = optuna.Trial(ostudy, storage_id)
        result = result or {}
        if error:  # Tune gave up after max_failures retries by its count: by the stored one, it may be a fault
            self._gave_up(study, ostudy, trial, number, storage_id)
            self.link.tell(number, state=optuna.trial.TrialState.FAIL)
        elif "fault" in result:  # out of memory beside other trials on its GPU: queued again, alone
            study.evaluator.fault(ostudy, trial, Fault(result["fault"], alone=bool(result.get("alone"))))
            self.link.tell(number, state=optuna.trial.TrialState.FAIL)
        elif "fail_reason" in result:
            trial.set_user_attr("fail_reason", result["fail_reason"])
            self.link.tell(number, state=optuna.trial.TrialState.FAIL)
        elif "attrs" in result:
            attrs = json.loads(result["attrs"])
            for key, value in attrs.items():
                trial.set_user_attr(key, value)
            self.link.tell(number, values=study.evaluator.values(attrs))
        else:  # stopped by the scheduler after this result
            self._record_epoch(number, result)
            self.link.tell(number, state=optuna.trial.TrialState.PRUNED)
        self.curves.pop(number, None)

    def _gave_up(self, study: Study, ostudy: optuna.Study, trial: optuna.Trial, number: int, storage_id: int) -> None:
        """Tune ended the trial with an error: by its count, its runs failed `executor.max_failures` + 1 times.
        By the storage's (`faults`: the failed attempts, kept across a driver's death and `Tuner.restore`), a
        trial that failed fewer times in training is a fault and is queued again: a restored Tuner's runs of
        it can all fail before training (its snapshot named a Ray checkpoint that Ray deleted before the next
        snapshot was written, and each retry fails to restore it). Otherwise it failed, saying so."""
        faults = storage_of(ostudy).get_trial(storage_id).user_attrs.get("faults", [])
        last = self.link.causes.pop(number, None) or (faults or ["its worker or node was lost"])[-1]
        retries = study.spec.executor.max_failures
        if len(faults) <= retries:
            study.evaluator.fault(ostudy, trial, Fault(last))
            return
        trial.set_user_attr("fault", last)
        trial.set_user_attr("fail_reason", f"gave up after {len(faults)} failed attempts on fresh Ray workers "
                                           f"(executor.max_failures: {retries}); the last: {last}")

    def _record_epoch(self, trial: str | int, result: dict) -> None:
        number = self.ray_ids.get(trial) if isinstance(trial, str) else trial
        study, ostudy = self.link.open()
        metric = study.task.metric
        if number not in self.link.open_trials or "epoch" not in result or metric not in result or "attrs" in result or "fault" in result:
            return
        curve = self.curves.setdefault(number, [])
        del curve[result["epoch"] - 1:]  # a trial resumed from an older checkpoint repeats epochs
        curve.append(float(result[metric]))
        optuna.Trial(ostudy, self.link.open_trials[number]).set_user_attr("curve", curve)
        flush_due(storage_of(ostudy))  # the driver's cache keeps it: `status` and dashboards see curves a second behind at most
        if self.link.on_epoch is not None:
            metrics = {k: float(result[k]) for k in EPOCH_METRICS if isinstance(result.get(k), (int, float))}
            self.link.on_epoch(ostudy, self.link.open_trials[number], int(result["epoch"]), metrics)

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump({"link": self.link, "ray_ids": self.ray_ids, "held": self.held, "curves": self.curves,
                         "running": self.running}, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            state = pickle.load(f)
        # the snapshot's open trials, on this driver's link: the one Tune's scheduler holds too (both come from tuner.pkl)
        self.link.open_trials = state["link"].open_trials
        self.ray_ids, self.held, self.curves = state["ray_ids"], state["held"], state["curves"]
        study, ostudy = self.link.open()  # a restored Tuner: beat for the resumed trials at once, before they go stale
        self.running = state.get("running") or {  # a searcher saved before `running` was kept: from storage, once
            rid: (t.params["arch"], study.seed_of(t)) for rid, n in self.ray_ids.items()
            for t in [storage_of(ostudy).get_trial(self.link.open_trials[n])] if n in self.link.open_trials}
        # A trial that ended after this snapshot was taken (the driver died before the next) is no longer this
        # driver's: Tune resumes it from its checkpoint, and what that run reports is not written over its result.
        for number, trial_id in list(self.link.open_trials.items()):
            if stored_state(storage_of(ostudy), trial_id) in _FINISHED:
                del self.link.open_trials[number]
                self.held.pop(number, None)
                self.curves.pop(number, None)


class FaultScheduler(FIFOScheduler):
    """Tune's first-in-first-out order, and each run of a trial that failed on its Ray worker recorded with its
    cause (`_Link.failed`): Tune tells its scheduler of every failed run, before it retries the trial or ends
    it with an error (telling the searcher only then, and without a cause)."""

    def __init__(self, link: _Link):
        super().__init__()
        self.link = link

    def on_trial_error(self, tune_controller: Any, trial: Trial) -> None:
        self.link.failed(trial.config["optuna_number"], _cause(trial))


def _cause(trial: Trial) -> str:
    """Why a trial's last run failed, in one line, from the error Tune saved for it on this driver: the trial
    function's exception (its type and first line), or what Ray says of a lost worker."""
    try:
        with open(trial.pickled_error_file, "rb") as f:
            err = cloudpickle.load(f)
    except Exception:  # noqa: BLE001  none saved (an error of Tune's own), or unreadable here
        return "its worker or node was lost"
    if isinstance(err, RayTaskError):
        return f"{type(err.cause).__name__}: {(str(err.cause).strip().splitlines() or [''])[0]}"
    said = [line.strip() for line in str(err).splitlines() if line.strip() and not line.startswith("\t")] or [""]
    return f"its worker was lost ({type(err).__name__}: {'. '.join(said[-1].split('. ')[:3]).rstrip('.')}.)"  # why, not its advice


class BinnedScheduler(FaultScheduler):
    """Stops a trial explorer's pruner stops (explorer.pruning.BinnedPruner, through Study.should_prune).

    The peers come from the Optuna storage, so the rungs hold every trial of the study, whichever
    executor or run trained it, and survive a restarted driver.
    """

    def on_trial_result(self, tune_controller: Any, trial: Trial, result: dict) -> str:
        study, ostudy = self.link.open()
        metric = study.task.metric
        if "epoch" not in result or metric not in result or "attrs" in result:
            return TrialScheduler.CONTINUE
        cfg = study.configs[trial.config["arch"]]
        prune = study.evaluator.should_prune(ostudy, trial.config["optuna_number"], result["epoch"], float(result[metric]), cfg)
        return TrialScheduler.STOP if prune else TrialScheduler.CONTINUE
