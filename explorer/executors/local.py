"""Run a study's trials in this process (Optuna's `study.optimize`): one after another, or
`executor.n_jobs` at once in threads.

Several such workers (processes, hosts) may run one study on a shared storage: a grid study's
configurations are popped from its queue, each by one worker; a sampled configuration that an
earlier trial of another worker is still training is waited for and answered from storage.

Ctrl-C interrupts training only: one that lands while Optuna records a finished trial (or between
trials) lets that record complete and then stops the study, so no finished result is lost. The
interrupted trial is queued again and resumes from its checkpoint; `run` then raises
KeyboardInterrupt for the caller to say how to resume.

Each trial trains on the device a `DevicePool` lends it (explorer.executors.devices). A fault
(explorer.faults) fails the trial without measuring it and queues it again; one that broke the
process's CUDA context also stops the run, whose next `explorer resume` is the fresh worker.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

import optuna
import torch

from explorer.errors import ExplorerError, TrialFailed
from explorer.executors import Executor, TrialCallback
from explorer.executors.devices import DevicePool, Execution, local_execution
from explorer.faults import Fault
from explorer.study import STORAGE_ERRORS, Study
from explorer.study.storage import storage_of


class LocalExecutor(Executor):
    def prepare(self, study: Study) -> Execution:
        self.execution = local_execution(study)
        return self.execution

    def run(self, study: Study, ostudy: optuna.Study, on_trial: TrialCallback | None = None) -> None:
        execution = self.settle(study, ostudy)
        interrupts = _Interrupts(in_threads=execution.slots > 1)
        try:
            with interrupts.installed(), _quiet_heartbeat_faults():
                self._run(study, ostudy, on_trial, interrupts, execution)
        except STORAGE_ERRORS as err:  # locked past the timeout, read-only, full, corrupt: finished trials stay stored
            raise study.store.error(err) from None
        except UnboundLocalError as err:  # Optuna's tell lost the storage, then its cleanup read an unset state
            cause = _storage_fault(err)
            if cause is None:
                raise
            raise study.store.error(cause) from None
        if interrupts.requested:
            raise KeyboardInterrupt

    def _run(self, study: Study, ostudy: optuna.Study, on_trial: TrialCallback | None, interrupts: _Interrupts,
             execution: Execution) -> None:
        study.queue.replicates(ostudy)  # a resumed study queues the replicates it still lacks
        if _done(study, ostudy):
            return
        metric = study.task.metric
        pool, broken = DevicePool(execution), []
        torch.set_num_threads(max(1, int(study.spec.executor.cpu)))  # CPUs per trial, as Ray would allot

        def objective(trial: optuna.Trial) -> list[float]:
            slots.taken()
            cfg = study.evaluator.suggest(trial)
            _await_earlier(study, ostudy, trial, cfg.key, interrupts)
            values = study.evaluator.answer_from_storage(ostudy, trial, cfg)
            if values is not None:  # a sampler may propose a configuration again: never train it twice
                return values
            trial.set_user_attr("config", cfg.dims)
            trial.set_user_attr("params", cfg.params)
            frozen = ostudy.get_trials(deepcopy=False)[trial.number]
            curve: list[float] = []

            def on_epoch(epoch: int, metrics: dict[str, float]) -> None:
                value = metrics[metric]
                curve.append(value)
                trial.set_user_attr("curve", curve)
                if interrupts.requested:  # trials in threads stop here (signals reach the main thread only)
                    raise KeyboardInterrupt
                if study.evaluator.should_prune(ostudy, trial.number, epoch + 1, value, cfg):
                    raise optuna.TrialPruned(f"{metric} {value:.4g} at epoch {epoch + 1}: pruned ({study.spec.pruner.name})")

            try:
                with interrupts.armed(), pool.lease(alone=bool(frozen.user_attrs.get("alone"))) as lease:
                    attrs = study.evaluator.evaluate(cfg, study.lineage(frozen), on_epoch, lease.device, seed=study.seed_of(trial),
                                                     shared=lambda: lease.shared)
            except Fault as err:  # not a measurement: queued again (past executor.max_failures it fails by itself)
                study.evaluator.fault(ostudy, trial, err)
                broken.extend([f"trial {trial.number} ({cfg.key}): {err}"] if err.broken else [])
                raise
            except (TrialFailed, ExplorerError) as err:  # ExplorerError: the study's data is bad; it stops the study
                trial.set_user_attr("fail_reason", str(err))
                raise
            except KeyboardInterrupt:  # Optuna marks it failed; queue its configuration for the resume
                trial.set_user_attr("interrupted", "interrupted (Ctrl-C) while it trained; its configuration is queued again")
                study.queue.requeue(ostudy, frozen)
                raise
            for key, value in attrs.items():
                trial.set_user_attr(key, value)
            return study.evaluator.values(attrs)

        def after(s: optuna.Study, t: optuna.trial.FrozenTrial) -> None:
            if not interrupts.requested:
                study.queue.replicates(s)
            if on_trial is not None:
                on_trial(s, t)
            if (interrupts.requested or broken or _done(study, s) or study.reads.too_many_failures(s)
                    or not slots.reserve(study.queue.unstarted(s))):
                s.stop()

        while True:  # a round of replicates may be queued after the last trial stopped the study
            slots = _Slots()
            jobs = min(execution.slots, max(1, study.queue.unstarted(ostudy)))
            ostudy.optimize(objective, callbacks=[after], catch=(TrialFailed, Fault), gc_after_trial=False, n_jobs=jobs)
            if broken:  # no later trial may use this process's CUDA context: the next run is the fresh worker
                raise ExplorerError(f"{broken[0]}; this process's CUDA context is unusable, so the run stops: the trial is "
                                    f"queued again, continue with: explorer resume {study.source}")
            if interrupts.requested or study.reads.too_many_failures(ostudy):
                break
            study.queue.replicates(ostudy)
            if _done(study, ostudy):
                break
        if study.reads.too_many_failures(ostudy):
            raise ExplorerError(f"stopped after {study.reads.failures(ostudy)} failed trials (max_failures: {study.spec.max_failures}); "
                                "see `explorer status` for their reasons", source=str(study.source))


class _Slots:
    """Trials this process's threads decided to start but have not asked for yet.

    With `n_jobs` threads, two trials ending together would each see the last unstarted trial and
    both start one: the second would ask an empty grid queue (a duplicate) or sample a configuration
    past `n_trials`. A thread starts another trial only if one is left beyond those already reserved.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reserved = 0

    def reserve(self, unstarted: int) -> bool:
        with self._lock:
            if unstarted - self._reserved <= 0:
                return False
            self._reserved += 1
            return True

    def taken(self) -> None:
        with self._lock:
            self._reserved = max(0, self._reserved - 1)


class _Interrupts:
    """SIGINT raises KeyboardInterrupt only while a trial trains (`armed`); elsewhere it is remembered.

    With trials in threads (`in_threads`) it is only remembered: each trial raises it at its next epoch.
    """

    def __init__(self, in_threads: bool = False) -> None:
        self.requested = False
        self._armed = False
        self._in_threads = in_threads

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        if self._armed and not self._in_threads:
            raise KeyboardInterrupt

    @contextmanager
    def installed(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
            yield
            return
        previous = signal.signal(signal.SIGINT, self._handle)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    @contextmanager
    def armed(self) -> Iterator[None]:
        if self.requested:
            raise KeyboardInterrupt
        self._armed = True
        try:
            yield
        finally:
            self._armed = False


def _done(study: Study, ostudy: optuna.Study) -> bool:
    """n_trials reached, or (grid) nothing left in the queue: what runs elsewhere finishes there."""
    return study.queue.remaining(ostudy) == 0 or (study.spec.sampler.name == "grid" and study.queue.waiting(ostudy) == 0)


def _await_earlier(study: Study, ostudy: optuna.Study, trial: optuna.Trial, key: str, interrupts: _Interrupts) -> None:
    """Wait while an earlier trial (another worker's) trains the same configuration at the same seed.

    Only earlier trials are waited for, so two workers never wait for each other; a stale one (its
    worker died) is failed by `waiting` after the heartbeat grace period, and then this trial trains.
    Without heartbeats (journal files) a dead worker's trial stays RUNNING, so there is no waiting.
    """
    if getattr(storage_of(ostudy), "get_heartbeat_interval", lambda: None)() is None:
        return
    running, seed = (optuna.trial.TrialState.RUNNING,), study.seed_of(trial)
    while any(t.number < trial.number and t.params.get("arch") == key and study.seed_of(t) == seed
              for t in ostudy.get_trials(deepcopy=False, states=running)):
        if interrupts.requested:
            raise KeyboardInterrupt
        time.sleep(study.spec.heartbeat_s)
        study.queue.waiting(ostudy)


@contextmanager
def _quiet_heartbeat_faults() -> Iterator[None]:
    """Optuna's heartbeat thread dies with a traceback when the storage goes away; the main thread
    reports the same fault as one line on its next write, so the thread's traceback is left out."""
    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        if not isinstance(args.exc_value, STORAGE_ERRORS):
            previous(args)

    threading.excepthook = hook
    try:
        yield
    finally:
        threading.excepthook = previous


def _storage_fault(err: BaseException) -> BaseException | None:
    """The storage error behind `err`, if any: when the storage fails inside Optuna's tell, its
    `finally` reads a state its `except` never set, and the UnboundLocalError hides the real fault."""
    seen = err.__context__
    while seen is not None:
        if isinstance(seen, STORAGE_ERRORS):
            return seen
        seen = seen.__context__
    return None
