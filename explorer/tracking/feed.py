"""The feed: what the executors report (each epoch of a trial, each trial's end) and the study's answers,
sent to the study's trackers (`tracking:`, `--tracking`) from one thread of their own.

Training never waits for a tracker: the executors' callbacks only queue. The thread starts the trackers
(importing MLflow, creating its store), brings them up to date with the storage (a finished trial they
lack is written from what the storage holds, so turning tracking on mid-study, or a tracker that was down,
leaves no gap and no second run), then writes as trials report. On Ray the driver feeds it (Tune hands
the driver every result; the nodes need no access to the tracker, and the study's folder, where the
default stores live, is the driver's). A tracker that cannot start or fails to write is one warning line,
and the study goes on without it.
"""

from __future__ import annotations

import hashlib
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import optuna

from explorer.errors import one_line
from explorer.optuna_compat import storage_of
from explorer.tracking.base import End, Run, Tracker, TrackerDown, finite, warn
from explorer.tracking.summary import summary_of

if TYPE_CHECKING:
    from explorer.study import Study

TrialCallback = Callable[[optuna.Study, optuna.trial.FrozenTrial], None]
FLUSH_S = 60.0  # how long the end of a run waits for a slow tracker before leaving what is left unsent
_FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)
_TAGGED = ("fail_reason", "fault", "interrupted", "device", "device_name", "precision", "execution_class")


class Feed:
    """The study's trackers behind a queue; `epoch` and `trial` are the executors' callbacks."""

    def __init__(self, study: Study, ostudy: optuna.Study):
        self.study = study
        self.names = study.spec.tracking.names
        self.trackers: list[Tracker] = []
        self.opened: dict[int, int] = {}  # trial number -> its run's key (lineage), for runs this process opened
        self.ids: dict[int, tuple[int, int]] = {}  # storage trial id -> (number, key)
        self.ended: set[int] = set()  # run keys ended since they were last opened
        self._lock = threading.Lock()
        self._jobs: queue.Queue[tuple[str, tuple[Any, ...]] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        if self.names:
            trials = ostudy.get_trials(deepcopy=False)  # what the trackers are brought up to date with
            self._thread = threading.Thread(target=self._work, args=(trials,), name="explorer-tracking", daemon=True)
            self._thread.start()

    @property
    def line(self) -> str | None:
        """Where the trials go, said when the run starts."""
        spec, folder, name = self.study.spec.tracking, self.study.source.parent, self.study.spec.name
        where = {"mlflow": lambda: spec.mlflow.uri(folder, name), "tensorboard": lambda: str(spec.tensorboard.folder(folder, name))}
        return "tracking: " + "; ".join(f"{n} {where[n]()}" for n in self.names) if self.names else None

    # -- the executors' callbacks (any thread) ----------------------------------------------------------
    def epoch(self, ostudy: optuna.Study, trial_id: int, epoch: int, metrics: dict[str, float]) -> None:
        """Trial `trial_id` (its storage id) finished epoch `epoch` (from 1) with `metrics`."""
        with self._lock:
            if trial_id not in self.ids:
                frozen = storage_of(ostudy).get_trial(trial_id)  # once per trial: its configuration, seed, lineage
                self.ids[trial_id] = (frozen.number, self._open(frozen))
            _, key = self.ids[trial_id]
        self._jobs.put(("log", (key, finite(metrics), epoch)))

    def trial(self, ostudy: optuna.Study, frozen: optuna.trial.FrozenTrial | None) -> None:
        """A trial ended (None: another worker failed it as dead meanwhile; its retry ends it)."""
        if frozen is None or "duplicate_of" in frozen.user_attrs or frozen.state not in _FINISHED:
            return  # a proposal answered from storage trained nothing: no run
        with self._lock:
            key = self.opened.pop(frozen.number, None)
            if key is None:  # it ended before its first epoch (a failure at the start, a fault)
                key = self._open(frozen)
                del self.opened[frozen.number]
            self.ended.add(key)
        self._end(frozen, key)

    def chained(self, on_trial: TrialCallback | None) -> TrialCallback | None:
        """`on_trial`, then this feed: the callback the executor gets."""
        if not self.names:
            return on_trial

        def both(ostudy: optuna.Study, frozen: optuna.trial.FrozenTrial) -> None:
            if on_trial is not None:
                on_trial(ostudy, frozen)
            self.trial(ostudy, frozen)

        return both

    @property
    def on_epoch(self) -> Callable[[optuna.Study, int, int, dict[str, float]], None] | None:
        return self.epoch if self.names else None

    def summary(self, status: Callable[[], Any]) -> None:
        """The study's answers (`status()`: an `explorer.api.Status`, read only when there are trackers) as its summary run."""
        if not self.names:
            return
        try:
            self._jobs.put(("summary", (summary_of(status()),)))
        except Exception as err:  # noqa: BLE001  the trials are stored and tracked: a summary that fails is one line
            warn(f"the summary run is not written ({_said(err)})")

    def close(self) -> None:
        """End the runs still open as interrupted (Ctrl-C, an error: a resume continues them), send what is queued, stop."""
        if self._thread is None:
            return
        with self._lock:
            left = [key for key in dict.fromkeys(self.opened.values()) if key not in self.ended]
        for key in left:
            self._jobs.put(("end", (End(key, "INTERRUPTED", {"interrupted": "the run stopped while this trial trained"}),)))
        self._jobs.put(None)
        self._thread.join(FLUSH_S)
        if self._thread.is_alive():
            warn(f"{', '.join(t.name for t in self.trackers) or ', '.join(self.names)} did not take "
                 f"{self._jobs.qsize()} updates within {FLUSH_S:.0f} s; they are not sent (the storage holds them)")
        self._thread = None

    # -- building what a tracker receives -----------------------------------------------------------------
    def _open(self, frozen: optuna.trial.FrozenTrial) -> int:
        """Queue the opening of `frozen`'s run (its lineage's, continued); returns its key. Under the lock."""
        run = run_of(self.study, frozen)
        self.opened[frozen.number] = run.key
        self.ended.discard(run.key)
        self._jobs.put(("open", (run,)))
        return run.key

    def _end(self, frozen: optuna.trial.FrozenTrial, key: int) -> None:
        for epoch, metrics in stored_epochs(self.study, frozen):  # the epochs a tracker lacks (none, when it was fed live)
            self._jobs.put(("log", (key, metrics, epoch)))
        self._jobs.put(("end", (end_of(self.study, frozen, key),)))

    # -- the tracking thread --------------------------------------------------------------------------------
    def _work(self, trials: list[optuna.trial.FrozenTrial]) -> None:
        self.trackers = [t for t in map(self._start, self.names) if t is not None]
        self._catch_up(trials)
        while (job := self._jobs.get()) is not None:
            for tracker in list(self.trackers):
                self._call(tracker, job[0], *job[1])

    def _start(self, name: str) -> Tracker | None:
        study = self.study
        spec, folder, study_name = study.spec.tracking, study.source.parent, study.spec.name
        try:
            if name == "mlflow":
                from explorer.tracking.mlflow import MLflowTracker

                store = study.store.shown_location()
                return MLflowTracker(spec.mlflow.uri(folder, study_name), spec.mlflow.experiment or study_name,
                                     {"explorer.study": study_name, "explorer.storage": store, "explorer.study_key": study_key(store, study_name)},
                                     spec.mlflow.artifacts(folder, study_name))
            from explorer.tracking.tensorboard import TensorBoardTracker

            return TensorBoardTracker(spec.tensorboard.folder(folder, study_name))
        except ImportError as err:
            warn(f"{name} cannot be imported ({one_line(str(err))}; pip install 'explorer[{name}]'): the study goes on without it")
        except Exception as err:  # noqa: BLE001  a server down, a store or folder that cannot be written
            warn(f"{name} cannot start: {_said(err)}; the study goes on without it")
        return None

    def _catch_up(self, trials: list[optuna.trial.FrozenTrial]) -> None:
        """Write each finished trial a tracker lacks (or holds in another state) from the storage, once."""
        latest: dict[int, optuna.trial.FrozenTrial] = {}
        for t in trials:
            if "duplicate_of" not in t.user_attrs:
                latest[self.study.lineage(t)] = t  # trials come in number order: the last of each lineage stays
        for tracker in list(self.trackers):
            known = self._call(tracker, "known") or {}
            for key, t in latest.items():
                state = state_of(t)
                if t.state in _FINISHED and (key not in known or (known[key] is not None and known[key] != state)):
                    self._call(tracker, "open", run_of(self.study, t))
                    for epoch, metrics in stored_epochs(self.study, t):
                        self._call(tracker, "log", key, metrics, epoch)
                    self._call(tracker, "end", end_of(self.study, t, key))

    def _call(self, tracker: Tracker, method: str, *args: Any) -> Any:
        """One tracker call; a failure is one warning, and the tracker is left out from then on."""
        if tracker not in self.trackers:
            return None
        try:
            return getattr(tracker, method)(*args)
        except Exception as err:  # noqa: BLE001  whatever the tracker's client raises: the study goes on
            self.trackers.remove(tracker)
            warn(f"{tracker.name} at {tracker.where()} failed ({_said(err)}); the study goes on without it")
            return None


def run_of(study: Study, frozen: optuna.trial.FrozenTrial) -> Run:
    """A trial's run: its configuration, seed and budget as params; Optuna's tags and explorer's."""
    attrs = frozen.user_attrs
    arch = frozen.params.get("arch", attrs.get("arch"))
    dims = attrs.get("config") or (study.configs[arch].dims if arch in study.configs else {})
    budget = {f"budget.{k}": v for k, v in study.spec.budget.identity().items() if k != "seed" and v is not None}
    key = study.lineage(frozen)
    directions = [o.direction.upper() for o in study.objectives]  # Optuna's StudyDirection names, as its callback tags them
    tags = {"number": str(frozen.number), "state": "RUNNING", "direction": str(directions if len(directions) > 1 else directions[0]),
            "datetime_start": str(frozen.datetime_start), "explorer.lineage": str(key), "explorer.arch": str(arch),
            "explorer.identity": str(attrs.get("identity", study.identity_key))}
    start = int(frozen.datetime_start.timestamp() * 1000) if frozen.datetime_start else None
    return Run(key, {**dims, "arch": arch, "family": study.space.family.name, "seed": study.seed_of(frozen), **budget},
               tags, study.task.metric, start)


def stored_epochs(study: Study, frozen: optuna.trial.FrozenTrial) -> list[tuple[int, dict[str, float]]]:
    """The metric after each epoch as the storage holds it (`curve`): all of a completed trial's, and a first
    attempt's; a retry that ended otherwise stored only the epochs after its checkpoint, whose numbers it lost."""
    if frozen.state != optuna.trial.TrialState.COMPLETE and study.lineage(frozen) != frozen.number:
        return []
    return [(epoch, finite({study.task.metric: value})) for epoch, value in enumerate(frozen.user_attrs.get("curve") or [], start=1)]


def end_of(study: Study, frozen: optuna.trial.FrozenTrial, key: int) -> End:
    """How a trial's run ends: κ at step 0 (initialisation) and at its last epoch, its counts and time there."""
    attrs = frozen.user_attrs
    last = len(attrs.get("curve") or [])
    metrics = [(name, value, step) for name, value, step in (
        ("kappa", attrs.get("kappa_init_mean"), 0), ("kappa", attrs.get("kappa_final_mean"), last),
        ("kappa_init_mean", attrs.get("kappa_init_mean"), last), ("kappa_final_mean", attrs.get("kappa_final_mean"), last),
        *((name, attrs.get(name), last) for name in ("params", "flops", "train_time_s")))
        if finite({name: value})]
    values = finite(dict(zip([o.name for o in study.objectives], frozen.values or []))) if frozen.values else {}
    tags = {"number": str(frozen.number), "datetime_complete": str(frozen.datetime_complete),
            **{k: str(attrs[k]) for k in _TAGGED if k in attrs}}
    end = int(frozen.datetime_complete.timestamp() * 1000) if frozen.datetime_complete else None
    return End(key, state_of(frozen), tags, metrics, values, end)


def state_of(frozen: optuna.trial.FrozenTrial) -> str:
    """The run's state: Optuna's, with a trial stopped by Ctrl-C (its configuration queued again) apart."""
    return "INTERRUPTED" if "interrupted" in frozen.user_attrs else frozen.state.name


def study_key(storage: str, name: str) -> str:
    """A short key of a study in its storage: what a tracker's runs are found by (paths and URLs in tags are for people)."""
    return hashlib.sha1(f"{storage}\n{name}".encode()).hexdigest()[:16]


def _said(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return one_line(f"{type(err).__name__}: {text[0]}" if text and not isinstance(err, TrackerDown) else (text[0] if text else type(err).__name__))


@contextmanager
def tracked(study: Study, ostudy: optuna.Study, status: Callable[[], Any]) -> Iterator[Feed]:
    """A feed for a run of `study`: when the run ends the study's answers (`status()`, an `explorer.api.Status`) go to
    its summary run; runs left open end as interrupted (Ctrl-C, an error), and what is queued is sent."""
    feed = Feed(study, ostudy)
    try:
        yield feed
        feed.summary(status)
    finally:
        feed.close()
