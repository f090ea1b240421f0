"""Run a study's trials through Ray Tune: a local Ray by default, or a cluster (`address`), GPUs per trial.

The Optuna storage stays the single source of truth, exactly as with the local executor: Ray Tune only
schedules. The searcher and scheduler that meet Ray's interfaces are in ray_bridge.py; here:

- `RayExecutor.prepare`: joins the cluster and resolves its devices (explorer.executors.devices): with
  GPUs, `device: auto` gives each trial one (`gpu`), as many trials at once as the cluster holds; a
  request no node can meet is one line at once. Ray Client (`ray://`) is refused: under it Tune's driver,
  and with it the searcher and the study's storage, would run on the head node.
- `train_trial`, the function trainable: `Evaluator.evaluate` (explorer.study.evaluate) on the GPU (or
  CPUs) Ray assigns, reporting each epoch, with a Ray checkpoint of the trial's checkpoint folder when
  one was written (`checkpoint_every_s`), resuming from it after a failure. A fault that broke the
  worker's CUDA context is raised, so Ray retries the trial on a fresh worker (Tune never reuses the
  actor of a trial that raised); one out of memory beside other trials on a shared GPU is reported, and
  the searcher queues it again with a GPU of its own (`alone`).

Trials are self-contained: a worker rebuilds the study from that data (`Study.from_data`), never
from the driver's YAML files, so nodes need no shared disk; only the task's data must exist on every
node, and a trial that cannot find it fails with that reason. Tune's checkpoints go to
`executor.storage_path` (a shared folder or a URI); a cluster of several nodes refuses the default
local folder. Ray's driver-side log lines go to `<study>.ray.log` beside the study, not the terminal.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
import pyarrow.fs as pafs
import ray
from ray import tune
from ray.tune.execution.placement_groups import PlacementGroupFactory
from ray.tune.schedulers import TrialScheduler

from explorer import checkpoints
from explorer.checkpoints import CHECKPOINT
from explorer.errors import ExplorerError, TrialFailed
from explorer.executors.base import EpochCallback, Executor, TrialCallback
from explorer.executors.devices import Execution, cluster_execution
from explorer.executors.ray_bridge import BinnedScheduler, FaultScheduler, OptunaBridge, _Link
from explorer.faults import Fault
from explorer.study import ExecutorSpec, Study
from explorer.study.evaluate import carried


class RayExecutor(Executor):
    def prepare(self, study: Study) -> Execution:
        refuse_ray_client(study)
        log_to_file(ray_log(study))
        connect(study.spec.executor)
        self.execution = cluster_execution(study, [n["Resources"] for n in ray.nodes() if n.get("Alive")])
        return self.execution

    def run(self, study: Study, ostudy: optuna.Study, on_trial: TrialCallback | None = None,
            on_epoch: EpochCallback | None = None) -> None:
        execution = self.settle(study, ostudy)
        study.queue.replicates(ostudy, execution.slots)  # a resumed study queues the replicates it still lacks
        if study.queue.remaining(ostudy) == 0:
            return
        check_storage_path(study)
        study.queue.waiting(ostudy)  # trials a dead driver left: failed, queued again
        link = _Link(study, ostudy, on_trial, on_epoch)  # both run on this driver, which Tune hands every result
        name = f"{study.spec.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        try:
            make_tuner(study, link, name, execution).fit()
        finally:
            interrupted = link.release()
        if interrupted:  # Tune caught Ctrl-C and stopped its trials: their configurations are queued again
            raise KeyboardInterrupt
        if study.reads.too_many_failures(ostudy):
            raise ExplorerError(f"stopped after {study.reads.failures(ostudy)} failed trials (max_failures: {study.spec.max_failures}); "
                                "see `explorer status` for their reasons", source=str(study.source))


def refuse_ray_client(study: Study) -> None:
    """`ray://` (Ray Client) in one line, before anything is opened or written.

    Under Ray Client, Tune runs its driver as an actor on the head node (Ray's docs advise Ray Jobs, not
    Ray Client, for Tune): the searcher would open this study's storage there (a SQLite or journal path of
    this machine: another file, or none), and this run's progress and Ctrl-C handling would be lost.
    """
    address = study.spec.executor.address or os.environ.get("RAY_ADDRESS") or ""
    if address.startswith("ray://"):
        raise ExplorerError(f"{address} is Ray Client, under which Ray Tune's driver (and this study's storage and searcher) "
                            "would run on the head node, not here: run `explorer run` on the head node with --address auto "
                            "(or from any node with the head's host:port, e.g. 10.0.0.1:6379)",
                            source=str(study.source), field="executor.address")


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


def make_tuner(study: Study, link: _Link, name: str, execution: Execution) -> tune.Tuner:
    """A Tuner whose searcher decides how many trials run: until the storage holds `n_trials`, at most
    `execution.slots` at once (what the cluster holds, or `max_concurrent`).

    The task's metric is declared, so `ResultGrid.get_best_result()` works on what `fit` returns.
    """
    ex = study.spec.executor
    # Keeping 2 Ray checkpoints per trial forces an experiment snapshot every 2 epochs: cheap (the state
    # is small), but Ray warns about it on every snapshot when epochs are short.
    logging.getLogger("ray.tune.execution.experiment_state").setLevel(logging.ERROR)
    mode = "max" if study.task.higher_is_better else "min"
    return tune.Tuner(
        trainable(link, ex, execution),
        tune_config=tune.TuneConfig(search_alg=OptunaBridge(link, execution.slots), scheduler=scheduler(link), num_samples=-1,
                                    metric=study.task.metric, mode=mode,
                                    max_concurrent_trials=execution.slots, reuse_actors=True),
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
    execution = RayExecutor().prepare(study)
    return tune.Tuner.restore(str(path), trainable(_Link(study), study.spec.executor, execution),
                              resume_unfinished=True, resume_errored=True)


def trainable(link: _Link, ex: ExecutorSpec, execution: Execution) -> Any:
    """`train_trial` with each trial's resources: `cpu`, and its GPU share (a whole GPU for a trial queued
    again `alone` after it ran out of memory beside others on a shared one)."""
    return tune.with_resources(tune.with_parameters(train_trial, link=link), functools.partial(resources, ex.cpu, execution.gpu))


def resources(cpu: float, gpu: float, config: dict[str, Any]) -> PlacementGroupFactory:
    share = max(gpu, 1.0) if gpu and config.get("alone") else gpu
    return PlacementGroupFactory([{"CPU": cpu, **({"GPU": share} if share else {})}])


def scheduler(link: _Link) -> TrialScheduler:
    return FaultScheduler(link) if link.study().spec.pruner.name == "none" else BinnedScheduler(link)


def kept_place(study: Study, key: str, seed: int) -> tuple[pafs.FileSystem, str]:
    """Where the states the runs of (configuration, seed) keep live on a cluster (explorer.checkpoints.Carry):
    under the experiment root, which every node reaches as it reaches Ray's checkpoints (a shared folder
    or a URI such as s3://bucket/path; a cluster of several nodes refuses a local one)."""
    fs, root = pafs.FileSystem.from_uri(str(experiment_root(study)))
    return fs, f"{root.rstrip('/')}/{checkpoints.kept(Path(), key, seed).as_posix()}"


def _kept_there(fs: pafs.FileSystem, where: str) -> dict[int, str]:
    found = fs.get_file_info(pafs.FileSelector(where, allow_not_found=True))
    return {int(stem): f.path for f in found if f.path.endswith(".pt") and (stem := f.base_name[:-3]).isdigit()}


def fetch_kept(study: Study, key: str, seed: int, carry: checkpoints.Carry) -> None:
    """Bring the latest state kept for this run (`carry.source`, from the experiment root) to this node's
    `carry.folder`; none found, or unreadable: the run trains from scratch (correct, only slower)."""
    try:
        fs, where = kept_place(study, key, seed)
        usable = {n: p for n, p in _kept_there(fs, where).items() if n <= carry.length}
        if not usable:
            return
        carry.folder.mkdir(parents=True, exist_ok=True)
        source = usable[max(usable)]
        for remote in (source[:-3] + ".json", source):  # the state last: a state found has its metrics beside it
            if fs.get_file_info(remote).type == pafs.FileType.File:
                pafs.copy_files(remote, str(carry.folder / remote.rsplit("/", 1)[1]), source_filesystem=fs,
                                destination_filesystem=pafs.LocalFileSystem())
    except (OSError, ValueError) as err:
        logging.getLogger("explorer").warning("no kept state fetched for %s seed %s: %s", key, seed, err)


def store_kept(study: Study, key: str, seed: int, carry: checkpoints.Carry) -> None:
    """After the run ended: its kept state to the experiment root (under a temporary name, then moved), and
    the shorter runs' states there deleted (`Carry.ended` did so on this node)."""
    try:
        fs, where = kept_place(study, key, seed)
        if carry.keep is not None and carry.keep.exists():
            fs.create_dir(where, recursive=True)
            for local in (carry.keep.with_suffix(".json"), carry.keep):
                if local.exists():
                    pafs.copy_files(str(local), f"{where}/{local.name}.tmp", source_filesystem=pafs.LocalFileSystem(),
                                    destination_filesystem=fs)
                    fs.move(f"{where}/{local.name}.tmp", f"{where}/{local.name}")
        for length, path in _kept_there(fs, where).items():
            if length < carry.length:
                for name in (path[:-3] + ".json", path):
                    if fs.get_file_info(name).type == pafs.FileType.File:
                        fs.delete_file(name)
        if not fs.get_file_info(pafs.FileSelector(where, allow_not_found=True)):
            fs.delete_dir(where)
    except (OSError, ValueError) as err:
        logging.getLogger("explorer").warning("kept state of %s seed %s not stored: %s", key, seed, err)


def trial_device(gpu_ids: Sequence[Any]) -> str:
    """Ray sets CUDA_VISIBLE_DEVICES to the GPUs it assigned: the first visible one (cuda:0) is ours.

    A trial Ray gave a GPU never trains on the CPU instead: torch not seeing it is a fault of the node,
    retried on another."""
    if not gpu_ids:
        return "cpu"
    import torch  # here: a trial of a task that trains itself (bench/standin.py) never loads it

    if not torch.cuda.is_available():
        raise Fault(f"Ray assigned GPU {', '.join(map(str, gpu_ids))} on node {ray.util.get_node_ip_address()}, but torch "
                    f"there sees no CUDA device (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')!r}, "
                    f"torch {torch.__version__})", broken=True)
    return "cuda:0"


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
    assigned = ray.get_runtime_context().get_assigned_resources()
    cpus, shared = assigned.get("CPU", 1), 0 < assigned.get("GPU", 0) < 1  # a GPU share: its neighbours' memory too
    if not study.task.trains_itself:
        import torch

        torch.set_num_threads(max(1, int(cpus)))  # Ray sets OMP_NUM_THREADS=1; use what the trial was given
    lineage = config.get("lineage", config["optuna_number"])
    scratch = Path(tune.get_context().get_trial_dir()) / "explorer-trial"  # not the trial dir itself: it is the cwd
    folder = scratch / "checkpoint"
    shutil.rmtree(scratch, ignore_errors=True)
    previous = tune.get_checkpoint()
    if previous is not None:  # a retry after a dead worker or node: continue where Ray last saved
        previous.to_directory(str(folder))

    reported: list[tuple[int, int]] = []  # the checkpoint file last handed to Ray (inode, mtime)

    def on_epoch(epoch: int, metrics: dict[str, float]) -> None:
        path = folder / CHECKPOINT
        stamp = (path.stat().st_ino, path.stat().st_mtime_ns) if path.exists() else None
        new = stamp is not None and stamp not in reported  # written this epoch (checkpoint_every_s): Ray uploads it
        reported[:] = [stamp] if new else reported
        tune.report({**metrics, "epoch": epoch + 1, "node": node}, checkpoint=tune.Checkpoint.from_directory(str(folder)) if new else None)

    seed, length = config.get("seed", study.seeds[0]), config.get("epochs") or study.entry_epochs
    carry = carried(study, cfg, seed, length, scratch / "kept")
    if carry is not None:  # the state a shorter run of (configuration, seed) kept, from wherever it ran
        fetch_kept(study, cfg.key, seed, carry)
    try:
        device = trial_device(ray.get_gpu_ids()) if not study.task.trains_itself else "cuda:0" if ray.get_gpu_ids() else "cpu"
        attrs = study.evaluator.evaluate(cfg, lineage, on_epoch, device, checkpoint_dir=folder,
                                         seed=seed, shared=shared and not config.get("alone"),
                                         epochs=length, kept=carry.folder if carry is not None else None)
        if carry is not None:
            store_kept(study, cfg.key, seed, carry)
    except TrialFailed as err:  # a result, not a Ray error: Ray would retry it max_failures times
        tune.report({"fail_reason": str(err), "node": node, metric: math.nan})
        return
    except Fault as err:
        where = f"{err} (Ray node {ray.util.get_node_ip_address()}, pid {os.getpid()})"
        tune.report({"fault": where, "alone": err.alone, "broken": err.broken, "node": node, metric: math.nan})
        if err.broken:  # an error: Ray retries it on a fresh worker, this one's CUDA context being unusable
            raise
        return  # out of memory beside others: the searcher queues it again with a GPU of its own
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    tune.report({"epoch": len(attrs["curve"]), metric: attrs[metric], "attrs": json.dumps(attrs), "node": node})
