"""Run a study's trials in this process: one after another, or `executor.n_jobs` at once in threads.

Each worker (a thread) loops with Optuna's ask-and-tell interface: claim a trial under the study's lock
(`Queue.claim`: the count of what is left and the start are one step for every worker of every
process), beat for it (explorer.study.liveness), train it, tell its result, queue what the result asks
for (replicate seeds). A worker with nothing to start stays while trials run anywhere: their results
may queue more, and their workers may die and leave them to retry. Several such processes (hosts) may
run one study on a shared storage, and every (configuration, seed) is trained once.

Ctrl-C interrupts training only: one that lands while a finished trial is recorded (or between trials)
lets that record complete and then stops the study, so no finished result is lost. The interrupted
trial is queued again and resumes from its checkpoint; `run` then raises KeyboardInterrupt for the
caller to say how to resume.

Each trial trains on the device a `DevicePool` lends it (explorer.executors.devices). A fault
(explorer.faults) fails the trial without measuring it and queues it again; one that broke the
process's CUDA context also stops the run, whose next `explorer resume` is the fresh worker.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

import optuna
import torch

from explorer.errors import ExplorerError, TrialFailed, TrialReclaimed
from explorer.executors import seedgroups
from explorer.executors.base import EpochCallback, Executor, TrialCallback
from explorer.executors.devices import DevicePool, Execution, local_execution
from explorer.faults import Fault
from explorer.optuna_cache import flush_due, stored_state
from explorer.optuna_compat import storage_of, trial_storage_id
from explorer.space import Config
from explorer.study import STORAGE_ERRORS, Study
from explorer.study.liveness import beating

_RUNNING, _FAIL, _PRUNED = optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.FAIL, optuna.trial.TrialState.PRUNED


class LocalExecutor(Executor):
    def prepare(self, study: Study) -> Execution:
        self.execution = local_execution(study)
        return self.execution

    def run(self, study: Study, ostudy: optuna.Study, on_trial: TrialCallback | None = None,
            on_epoch: EpochCallback | None = None) -> None:
        execution = self.settle(study, ostudy)
        interrupts = _Interrupts(in_threads=execution.slots > 1)
        torch.set_num_threads(max(1, int(study.spec.executor.cpu)))  # CPUs per trial, as Ray would allot
        own = study.store.own(ostudy)  # this worker's trials read and written through its cache: a transaction per trial's end
        worker = _Worker(study, own, on_trial, interrupts, DevicePool(execution), on_epoch)
        try:
            with interrupts.installed():
                if execution.slots == 1:
                    worker.loop()
                else:
                    worker.in_threads(execution.slots)
            study.store.disown(own)
        except STORAGE_ERRORS as err:  # locked past the timeout, read-only, full, corrupt: finished trials stay stored
            raise study.store.error(err) from None
        finally:
            with contextlib.suppress(*STORAGE_ERRORS):  # what a run stopped by an error kept (its curves), if it can
                study.store.disown(own)
        if worker.broken:  # no later trial may use this process's CUDA context: the next run is the fresh worker
            raise ExplorerError(f"{worker.broken[0]}; this process's CUDA context is unusable, so the run stops: the trial is "
                                f"queued again, continue with: explorer resume {study.source}")
        if interrupts.requested:
            raise KeyboardInterrupt
        if study.reads.too_many_failures(ostudy):
            raise ExplorerError(f"stopped after {study.reads.failures(ostudy)} failed trials (max_failures: {study.spec.max_failures}); "
                                "see `explorer status` for their reasons", source=str(study.source))


class _Worker:
    """The loop every thread of this process runs, and what stops them all."""

    def __init__(self, study: Study, ostudy: optuna.Study, on_trial: TrialCallback | None, interrupts: _Interrupts,
                 pool: DevicePool, on_epoch: EpochCallback | None = None):
        self.study, self.ostudy, self.on_trial, self.interrupts, self.pool = study, ostudy, on_trial, interrupts, pool
        self.on_epoch = on_epoch
        self.slots, self.busy = pool.execution.slots, 0  # this process's workers, and those training a trial now
        self._busy = threading.Lock()
        self.stop = interrupts.wake  # set by Ctrl-C, too many failures, a broken CUDA context, or a thread's study error
        self.broken: list[str] = []  # faults that broke this process's CUDA context

    def in_threads(self, n: int) -> None:
        errors: list[BaseException] = []

        def run() -> None:
            try:
                self.loop()
            except BaseException as err:  # noqa: BLE001  the first is raised in the main thread once all have stopped
                errors.append(err)
                self.stop.set()

        threads = [threading.Thread(target=run, name=f"explorer-trial-{i}") for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.2)  # a bounded join lets the main thread take Ctrl-C
        if errors:
            raise errors[0]

    def loop(self) -> None:
        study, ostudy = self.study, self.ostudy
        while not self.stop.is_set():
            claimed = study.queue.claim(ostudy)
            if claimed is None:  # fail dead workers' trials, queue them again, queue a round of replicates
                study.queue.waiting(ostudy)
                study.queue.replicates(ostudy, self.free())
                claimed = study.queue.claim(ostudy)
            if claimed is None:
                if not ostudy.get_trials(deepcopy=False, states=(_RUNNING,)):
                    return  # nothing to start, and nothing running anywhere that could give more
                self.stop.wait(study.spec.heartbeat_s)
                continue
            trial, cfg = claimed
            with self._busy:
                self.busy += 1
            with beating(ostudy, trial):
                try:
                    frozen = self.trial(trial, cfg)
                finally:
                    with self._busy:
                        self.busy -= 1
            if frozen is not None:
                self.after(frozen)

    def free(self) -> int:
        """This process's workers not training a trial now (the one asking among them): a round's size."""
        with self._busy:
            return max(1, self.slots - self.busy)

    def trial(self, trial: optuna.Trial, cfg: Config) -> optuna.trial.FrozenTrial | None:
        """Train one claimed trial (with its configuration's queued seeds, where training them as one model
        pays: explorer.executors.seedgroups) and tell its result; None when another worker reclaimed it."""
        study, ostudy, interrupts = self.study, self.ostudy, self.interrupts
        values = study.evaluator.answer_from_storage(ostudy, trial, cfg)
        if values is not None:  # a sampler may propose a configuration again: never train it twice
            return _tell(ostudy, trial, values=values)
        trial.set_user_attr("config", cfg.dims)
        trial.set_user_attr("params", cfg.params)
        stored = storage_of(ostudy).get_trial(trial_storage_id(trial))
        alone = bool(stored.user_attrs.get("alone"))  # out of memory beside others once: a device of its own
        try:
            with self.pool.lease(alone=alone) as lease:
                group = [] if alone else seedgroups.claim(study, ostudy, trial, cfg, lease.device)
                with interrupts.armed():
                    attrs = (seedgroups.train_together(study, ostudy, trial, cfg, group, self.reporter, self.ended, lease.device)
                             if group else None)
                    if attrs is None:
                        attrs = study.evaluator.evaluate(cfg, study.lineage(stored), self.reporter(trial), lease.device,
                                                         seed=study.seed_of(trial), shared=lambda: lease.shared,
                                                         epochs=study.length_of(trial))
        except Fault as err:  # not a measurement: queued again (past executor.max_failures it fails by itself)
            study.evaluator.fault(ostudy, trial, err)
            frozen = _tell(ostudy, trial, state=_FAIL)
            study.queue.requeue_dead(ostudy)
            if err.broken:
                self.broken.append(f"trial {trial.number} ({cfg.key}): {err}")
                self.stop.set()
            return frozen
        except optuna.TrialPruned:
            return _tell(ostudy, trial, state=_PRUNED)
        except (TrialFailed, ExplorerError) as err:  # ExplorerError: the study's data is bad; it stops the study
            trial.set_user_attr("fail_reason", str(err))
            frozen = _tell(ostudy, trial, state=_FAIL)
            if isinstance(err, ExplorerError):
                raise
            return frozen
        except TrialReclaimed:
            return None
        except KeyboardInterrupt:  # failed, and its configuration queued again for the resume
            trial.set_user_attr("interrupted", "interrupted (Ctrl-C) while it trained; its configuration is queued again")
            _tell(ostudy, trial, state=_FAIL)
            study.queue.requeue_dead(ostudy)
            self.stop.set()
            raise
        except BaseException:
            _tell(ostudy, trial, state=_FAIL)  # an error of explorer's own: the trial is retried, the study stops
            raise
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        return _tell(ostudy, trial, values=study.evaluator.values(attrs))

    def reporter(self, trial: optuna.Trial) -> Callable[[int, dict[str, float]], None]:
        """What `trial` does after each epoch: record its curve (and tell `on_epoch`), stop if reclaimed or
        interrupted, prune."""
        study, ostudy, interrupts, curve = self.study, self.ostudy, self.interrupts, []
        cfg = study.configs[trial.params["arch"]]
        trial_id = trial_storage_id(trial)

        def on_epoch(epoch: int, metrics: dict[str, float]) -> None:
            value = metrics[study.task.metric]
            curve.append(value)
            if stored_state(storage_of(ostudy), trial_id) != _RUNNING:
                raise TrialReclaimed  # failed as dead by another worker: its retry trains it, from the checkpoint
            trial.set_user_attr("curve", curve)
            flush_due(storage_of(ostudy))  # a curve kept by this worker's cache is stored a second later at most
            if self.on_epoch is not None:
                self.on_epoch(ostudy, trial_id, epoch + 1, metrics)
            if interrupts.requested:  # trials in threads stop here (signals reach the main thread only)
                raise KeyboardInterrupt
            if study.evaluator.should_prune(ostudy, trial.number, epoch + 1, value, cfg):
                raise optuna.TrialPruned(f"{study.task.metric} {value:.4g} at epoch {epoch + 1}: pruned ({study.spec.pruner.name})")

        return on_epoch

    def ended(self, frozen: optuna.trial.FrozenTrial | None) -> None:
        """After a trial of a seed group ended (None: it was reclaimed)."""
        if frozen is not None:
            self.after(frozen)

    def after(self, frozen: optuna.trial.FrozenTrial) -> None:
        study, ostudy = self.study, self.ostudy
        if not self.interrupts.requested:
            study.queue.replicates(ostudy, self.free())
        if self.on_trial is not None:
            self.on_trial(ostudy, frozen)
        if study.reads.too_many_failures(ostudy):
            self.stop.set()


def _tell(ostudy: optuna.Study, trial: optuna.Trial, **kwargs: object) -> optuna.trial.FrozenTrial | None:
    """Record a trial's end; None when another worker failed it as dead meanwhile (its retry records it)."""
    try:
        return ostudy.tell(trial, **kwargs)
    except optuna.exceptions.UpdateFinishedTrialError:
        return None


class _Interrupts:
    """SIGINT raises KeyboardInterrupt only while a trial trains (`armed`); elsewhere it is remembered.

    With trials in threads (`in_threads`) it is only remembered: each trial raises it at its next epoch.
    `wake` is set with it, so a worker waiting for others' trials stops at once.
    """

    def __init__(self, in_threads: bool = False) -> None:
        self.requested = False
        self.wake = threading.Event()
        self._armed = False
        self._in_threads = in_threads

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        self.wake.set()
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
