"""Run a study's trials through Ray Tune: a local Ray by default, or a cluster (`address`), GPUs per trial.

The Optuna storage stays the single source of truth, exactly as with the local executor: Ray Tune only
schedules. Three pieces meet Ray's interfaces:

- `OptunaBridge`, a Ray `Searcher`: `suggest` asks Optuna (feasible configurations only, queued retries
  first, duplicates of finished configurations answered from storage), `on_trial_result` stores the
  per-epoch curve, `on_trial_complete` tells Optuna (values and the same user attributes as `local`).
- `BinnedScheduler`, a Ray `TrialScheduler`: explorer's parameter-binned pruner (median or successive
  halving, i.e. ASHA's rule) against every trial in storage, whichever executor or run made it.
- `train_trial`, the function trainable: `Evaluator.evaluate` (explorer.study.evaluate) on the GPU (or CPUs) Ray assigns, reporting
  each epoch with a Ray checkpoint of the trial's checkpoint folder, resuming from it after a failure.

Tune pickles its searcher and scheduler, and Optuna storages hold locks and connections that do not
pickle, so both keep a `_Link` (the resolved study as data) and reconnect lazily after unpickling.

Trials are self-contained: a worker rebuilds the study from that data (`Study.from_data`), never
from the driver's YAML files, so nodes need no shared disk; only the task's data must exist on every
node, and a trial that cannot find it fails with that reason. Tune's checkpoints go to
`executor.storage_path` (a shared folder or a URI); a cluster of several nodes refuses the default
local folder. Ray's driver-side log lines go to `<study>.ray.log` beside the study, not the terminal.
"""

from __future__ import annotations

import json
import logging
import math
import os
import pickle
import shutil
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
import ray
import torch
from ray import tune
from ray.tune.experiment import Trial
from ray.tune.schedulers import FIFOScheduler, TrialScheduler
from ray.tune.search import Searcher

from explorer.errors import ExplorerError, TrialFailed
from explorer.executors.base import Executor, TrialCallback
from explorer.study import ExecutorSpec, Study
from explorer.optuna_compat import storage_of, trial_storage_id
from explorer.train import CHECKPOINT

_FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)


class RayExecutor(Executor):
    def run(self, study: Study, ostudy: optuna.Study, on_trial: TrialCallback | None = None) -> None:
        study.queue.replicates(ostudy)  # a resumed study queues the replicates it still lacks
        if study.queue.remaining(ostudy) == 0:
            return
        log_to_file(ray_log(study))
        connect(study.spec.executor)
        check_storage_path(study)
        study.queue.waiting(ostudy)  # trials a dead driver left: failed, queued again
        link = _Link(study, ostudy, on_trial)
        name = f"{study.spec.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        try:
            make_tuner(study, link, name).fit()
        finally:
            interrupted = link.release()
        if interrupted:  # Tune caught Ctrl-C and stopped its trials: their configurations are queued again
            raise KeyboardInterrupt
        if study.reads.too_many_failures(ostudy):
            raise ExplorerError(f"stopped after {study.reads.failures(ostudy)} failed trials (max_failures: {study.spec.max_failures}); "
                                "see `explorer status` for their reasons", source=str(study.source))


def connect(spec: ExecutorSpec) -> None:
    """Join the cluster at `spec.address` (or RAY_ADDRESS), else start a Ray on this machine.

    Workers' output stays in Ray's session logs on each node (`<temp dir>/session_latest/logs`, by
    default /tmp/ray): `log_to_driver=False` keeps it off the user's terminal.
    """
    if ray.is_initialized():
        return
    address = spec.address or os.environ.get("RAY_ADDRESS")
    local = {} if address else {"include_dashboard": False}
    try:
        ray.init(address=address, ignore_reinit_error=True, logging_level=logging.INFO, log_to_driver=False, **local)
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise ExplorerError(f"cannot join Ray at {address!r}: {str(err).splitlines()[0]}", field="executor.address") from None


def ray_log(study: Study) -> Path:
    """Where Ray's driver-side messages go (Tune's status, warnings, its advice on Ctrl-C)."""
    return study.source.parent.resolve() / f"{study.spec.name}.ray.log"


def log_to_file(path: Path) -> None:
    """Send the `ray` loggers to `path` instead of the terminal, and Tune's experiment box nowhere."""
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's new output engine print()s its box at any verbosity
    logger = logging.getLogger("ray")
    for handler in list(logger.handlers):  # Ray's own stderr handler, and the file of an earlier study
        if handler.get_name() == "explorer" or not isinstance(handler, logging.FileHandler):
            logger.removeHandler(handler)
            handler.close()
    handler = logging.FileHandler(path)
    handler.set_name("explorer")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def experiment_root(study: Study) -> str | Path:
    """Ray Tune's experiment folders (trial logs, Ray checkpoints): `executor.storage_path` (a folder,
    relative to the study's, or a URI such as s3://bucket/path), by default `<name>.ray` beside the study."""
    where = study.spec.executor.storage_path
    if where and "://" in where:
        return where
    folder = Path(where).expanduser() if where else Path(f"{study.spec.name}.ray")
    return folder if folder.is_absolute() else study.source.parent.resolve() / folder


def check_storage_path(study: Study) -> None:
    """A cluster of several nodes needs a storage_path every node reaches: Ray's checkpoints of a trial
    retried on another node are read from there (Ray's docs: a local path fails at checkpointing)."""
    nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
    if nodes > 1 and not study.spec.executor.storage_path:
        raise ExplorerError(f"the Ray cluster has {nodes} nodes: set executor.storage_path to a folder every node shares "
                            f"or a URI such as s3://bucket/path (the default {experiment_root(study)} is on this machine only)",
                            source=str(study.source), field="executor.storage_path")


def make_tuner(study: Study, link: _Link, name: str) -> tune.Tuner:
    """A Tuner whose searcher decides how many trials run: until the storage holds `n_trials`.

    The task's metric is declared, so `ResultGrid.get_best_result()` works on what `fit` returns.
    """
    ex = study.spec.executor
    # Keeping 2 Ray checkpoints per trial forces an experiment snapshot every 2 epochs: cheap (the state
    # is small), but Ray warns about it on every snapshot when epochs are short.
    logging.getLogger("ray.tune.execution.experiment_state").setLevel(logging.ERROR)
    mode = "max" if study.task.higher_is_better else "min"
    return tune.Tuner(
        trainable(link, ex),
        tune_config=tune.TuneConfig(search_alg=OptunaBridge(link), scheduler=scheduler(link), num_samples=-1,
                                    metric=study.task.metric, mode=mode,
                                    max_concurrent_trials=ex.max_concurrent, reuse_actors=True),
        run_config=tune.RunConfig(name=name, storage_path=str(experiment_root(study)), verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=ex.max_failures),
                                  checkpoint_config=tune.CheckpointConfig(num_to_keep=2)),
    )


def restore_tuner(path: str | Path, study: Study) -> tune.Tuner:
    """Continue a Ray experiment whose driver died: its searcher reconnects to the study's storage.

    Trials are resumed as the Tuner's last snapshot left them (it is taken every few seconds); an
    Optuna trial asked after that snapshot stays RUNNING until its heartbeat goes stale, and then the
    next `explorer run/resume` fails and re-queues it (or at once with `explorer resume --reclaim`).
    """
    log_to_file(ray_log(study))
    connect(study.spec.executor)
    return tune.Tuner.restore(str(path), trainable(_Link(study), study.spec.executor), resume_unfinished=True, resume_errored=True)


def trainable(link: _Link, ex: ExecutorSpec) -> Any:
    return tune.with_resources(tune.with_parameters(train_trial, link=link), {"cpu": ex.cpu, "gpu": ex.gpu})


def scheduler(link: _Link) -> TrialScheduler:
    return FIFOScheduler() if link.study().spec.pruner.name == "none" else BinnedScheduler(link)


def trial_device(gpu_ids: Sequence[Any]) -> str:
    """Ray sets CUDA_VISIBLE_DEVICES to the GPUs it assigned: the first visible one is ours."""
    return "cuda" if gpu_ids else "cpu"


# -- the link to the study ---------------------------------------------------------------------------------
class _Link:
    """The resolved study as data (spec, space, folder), picklable; the Optuna study is (re)opened where
    it is used, and the study is rebuilt from the data without reading its files.

    It also keeps the Optuna trials this driver has open alive with heartbeats, so that if the driver
    dies they go stale and the next `explorer run/resume` fails and re-queues them (as for `local`).
    """

    def __init__(self, study: Study, ostudy: optuna.Study | None = None, on_trial: TrialCallback | None = None):
        self.data = study.to_data()
        self.metric = study.task.metric
        self.open_trials: dict[int, int] = {}  # Optuna trial number -> storage trial id, while RUNNING here
        self._study: Study | None = study
        self._ostudy = ostudy
        self.on_trial = on_trial
        self._beating: threading.Event | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"data": self.data, "metric": self.metric, "open_trials": dict(self.open_trials)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.data, self.metric, self.open_trials = state["data"], state["metric"], state["open_trials"]
        self._study = self._ostudy = self.on_trial = self._beating = None

    def study(self) -> Study:
        if self._study is None:
            self._study = Study.from_data(self.data)
        return self._study

    def open(self) -> tuple[Study, optuna.Study]:
        study = self.study()
        if self._ostudy is None:
            self._ostudy = study.open(create=False, force=True)
        if self._beating is None:
            self._beating = threading.Event()
            threading.Thread(target=self._heartbeat, args=(self._ostudy, self._beating), daemon=True).start()
        return study, self._ostudy

    def _heartbeat(self, ostudy: optuna.Study, stop: threading.Event) -> None:
        storage = storage_of(ostudy)  # Optuna's own heartbeat thread records on the study's storage too
        interval = storage.get_heartbeat_interval() if hasattr(storage, "get_heartbeat_interval") else None
        while interval and not stop.is_set():
            for trial_id in list(self.open_trials.values()):
                storage.record_heartbeat(trial_id)
            stop.wait(interval)

    def tell(self, number: int, **kwargs: Any) -> None:
        """`Study.tell`, minus GridSampler's `study.stop()` (meant for `optimize`) once the grid is covered."""
        _, ostudy = self.open()
        self.open_trials.pop(number, None)
        try:
            ostudy.tell(number, **kwargs)
        except RuntimeError as err:
            if "Study.stop" not in str(err):
                raise
        if self.on_trial is not None:
            self.on_trial(ostudy, ostudy.trials[number])

    def release(self) -> bool:
        """After the Tuner stops: fail the trials still open, saying why, and queue their configurations.

        Trials are still open only when Tune stopped before they ended (Ctrl-C): returns whether any was.
        """
        stopped = False
        if self._ostudy is not None:
            for number, trial_id in list(self.open_trials.items()):
                trial = storage_of(self._ostudy).get_trial(trial_id)
                if trial.state not in _FINISHED:
                    stopped = True
                    storage_of(self._ostudy).set_trial_user_attr(
                        trial_id, "interrupted", "the Ray run was interrupted (Ctrl-C) while it ran; its configuration is queued again")
                    self.tell(number, state=optuna.trial.TrialState.FAIL)
            self.study().queue.requeue_dead(self._ostudy)
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

    def __init__(self, link: _Link):
        super().__init__()
        self.link = link
        self.ray_ids: dict[str, int] = {}  # Ray trial id -> Optuna trial number
        self.held: dict[int, tuple[str, int]] = {}  # Optuna trial number -> (configuration key, seed), waiting for its twin
        self.curves: dict[int, list[float]] = {}

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec: Any) -> bool:
        return True  # the space is the study's; nothing to take from Tune

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        study, ostudy = self.link.open()
        for number, run in list(self.held.items()):
            if run not in self._training():
                del self.held[number]
                if not self._answer_from_storage(number, run[0]):
                    return self._launch(trial_id, number, run[0])
        while True:
            study.queue.replicates(ostudy)
            claimed = None if study.reads.too_many_failures(ostudy) else study.queue.claim(ostudy)  # under the study's lock
            if claimed is None:
                # open trials may still lead to replicates (an adaptive round starts when they end) or retries
                return None if self.held or self.link.open_trials else Searcher.FINISHED
            trial, cfg = claimed
            self.link.open_trials[trial.number] = trial_storage_id(trial)
            key = cfg.key
            if (key, study.seed_of(trial)) in self._training():
                self.held[trial.number] = (key, study.seed_of(trial))
            elif not self._answer_from_storage(trial.number, key):
                return self._launch(trial_id, trial.number, key)

    def _training(self) -> set[tuple[str, int]]:
        """(configuration, seed) of each trial Ray is training."""
        study, ostudy = self.link.open()
        return {(ostudy.trials[n].params["arch"], study.seed_of(ostudy.trials[n])) for n in self.ray_ids.values()}

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
        self.curves[number] = []
        lineage = study.lineage(storage_of(ostudy).get_trial(self.link.open_trials[number]))  # a retry resumes its checkpoint
        return {"arch": key, "optuna_number": number, "lineage": lineage, "seed": study.seed_of(trial)}

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self._record_epoch(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        number = self.ray_ids.pop(trial_id, None)
        if number is None:
            return
        study, ostudy = self.link.open()
        storage_id = self.link.open_trials.get(number)
        if storage_id is None or storage_of(ostudy).get_trial(storage_id).state in _FINISHED:  # reclaimed meanwhile
            self.link.open_trials.pop(number, None)
            return
        trial = optuna.Trial(ostudy, storage_id)
        result = result or {}
        if error:
            trial.set_user_attr("fail_reason", f"Ray: the trial's worker failed {study.spec.executor.max_failures + 1} times")
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

    def _record_epoch(self, trial: str | int, result: dict) -> None:
        number = self.ray_ids.get(trial) if isinstance(trial, str) else trial
        study, ostudy = self.link.open()
        metric = study.task.metric
        if number not in self.link.open_trials or "epoch" not in result or metric not in result or "attrs" in result:
            return
        curve = self.curves.setdefault(number, [])
        del curve[result["epoch"] - 1:]  # a trial resumed from an older checkpoint repeats epochs
        curve.append(float(result[metric]))
        optuna.Trial(ostudy, self.link.open_trials[number]).set_user_attr("curve", curve)

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump({"link": self.link, "ray_ids": self.ray_ids, "held": self.held, "curves": self.curves}, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            state = pickle.load(f)
        self.link, self.ray_ids, self.held, self.curves = state["link"], state["ray_ids"], state["held"], state["curves"]
        self.link.open()  # a restored Tuner: beat for the resumed trials at once, before they go stale


class BinnedScheduler(FIFOScheduler):
    """Stops a trial explorer's pruner stops (explorer.pruning.BinnedPruner, through Study.should_prune).

    The peers come from the Optuna storage, so the rungs hold every trial of the study, whichever
    executor or run trained it, and survive a restarted driver.
    """

    def __init__(self, link: _Link):
        super().__init__()
        self.link = link

    def on_trial_result(self, tune_controller: Any, trial: Trial, result: dict) -> str:
        study, ostudy = self.link.open()
        metric = study.task.metric
        if "epoch" not in result or metric not in result or "attrs" in result:
            return TrialScheduler.CONTINUE
        cfg = study.configs[trial.config["arch"]]
        prune = study.evaluator.should_prune(ostudy, trial.config["optuna_number"], result["epoch"], float(result[metric]), cfg)
        return TrialScheduler.STOP if prune else TrialScheduler.CONTINUE


# -- the trainable ---------------------------------------------------------------------------------------
def train_trial(config: dict[str, Any], link: _Link) -> None:
    """One trial on a Ray worker: resume from Ray's checkpoint if this is a retry, train, report.

    The study is rebuilt from the link's data; a node without the task's data fails the trial with
    that reason (a result: retrying it elsewhere would not help). The trial's checkpoint folder is
    its own, inside Ray's trial folder on this node, and is removed however the trial ends.
    """
    logging.getLogger("ray.train._internal.storage").setLevel(logging.WARNING)  # a line per checkpoint otherwise
    node = ray.get_runtime_context().get_node_id()
    metric = link.metric
    try:
        study = link.study()
    except ExplorerError as err:
        tune.report({"fail_reason": f"on Ray node {ray.util.get_node_ip_address()} ({node[:8]}): {err}", "node": node, metric: math.nan})
        return
    cfg = study.configs[config["arch"]]
    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1)
    torch.set_num_threads(max(1, int(cpus)))  # Ray sets OMP_NUM_THREADS=1; use what the trial was given
    lineage = config.get("lineage", config["optuna_number"])
    scratch = Path(tune.get_context().get_trial_dir()) / "explorer-trial"  # not the trial dir itself: it is the cwd
    folder = scratch / "checkpoint"
    shutil.rmtree(scratch, ignore_errors=True)
    previous = tune.get_checkpoint()
    if previous is not None:  # a retry after a dead worker or node: continue where Ray last saved
        previous.to_directory(str(folder))

    def on_epoch(epoch: int, metrics: dict[str, float]) -> None:
        saved = (folder / CHECKPOINT).exists()
        tune.report({**metrics, "epoch": epoch + 1, "node": node},
                    checkpoint=tune.Checkpoint.from_directory(str(folder)) if saved else None)

    try:
        attrs = study.evaluator.evaluate(cfg, lineage, on_epoch, trial_device(ray.get_gpu_ids()), checkpoint_dir=folder,
                               seed=config.get("seed"))
    except TrialFailed as err:  # a result, not a Ray error: Ray would retry it max_failures times
        tune.report({"fail_reason": str(err), "node": node, metric: math.nan})
        return
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    tune.report({"epoch": len(attrs["curve"]), metric: attrs[metric], "attrs": json.dumps(attrs), "node": node})
