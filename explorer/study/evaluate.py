"""The evaluation of one trial: its configuration as the sampler proposed it, its training run, what it
stores, an answer from storage when the configuration was measured already, and whether to prune it.

Both executors (local threads, Ray Tune workers) go through here, so a trial means the same wherever it
runs: what it failed of is sorted here into a result (the configuration failed) or a fault (the machine
did: explorer.faults), which is retried and never stored as a measurement. It does not decide what runs
next (queue.py).
"""

from __future__ import annotations

import importlib.metadata
import sys
import threading
import time
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna

from explorer import checkpoints
from explorer.errors import ExplorerError, TrialFailed, TrialReclaimed
from explorer.faults import Fault, classify
from explorer.identity import CLASS, current_key, execution_class, is_current
from explorer.kappa import kappa_attrs, space_regime
from explorer.result import TrialResult
from explorer.space import Config
from explorer.study.read import Reads, peers
from explorer.optuna_compat import storage_of, trial_storage_id
from explorer.watchdog import time_limit

if TYPE_CHECKING:
    from explorer.study.spec import ResolvedStudy
    from explorer.tasks import Task


class Evaluator:
    def __init__(self, study: ResolvedStudy, reads: Reads):
        self.study = study
        self.reads = reads
        self._sampling = threading.Lock()  # trials in threads sample one at a time, each seeing the other's proposal
        self.execution: str | None = None  # the class this run trains under (explorer.executors.devices.settle_class)

    @cached_property
    def regime(self) -> str:
        """How the study's space compares heads (explorer.kappa.space_regime: a pass over every configuration,
        made once, not per trial)."""
        return space_regime(self.study.space)

    def suggest(self, trial: optuna.Trial) -> Config:
        """The trial's configuration as the sampler proposed it: always feasible (explorer.sampling).

        Its ordered parameters (layers, heads, ...) are what samplers model; its key is stored as the
        categorical `arch` too, which queues, executors and dashboards read.
        """
        study = self.study
        trial.set_user_attr("identity", study.identity_key)  # the question this trial answers (explorer.identity)
        if self.execution is not None:
            trial.set_user_attr(CLASS, self.execution)
        if len(study.spec.budget.ladder) > 1 and "epochs" not in trial.user_attrs:
            trial.set_user_attr("epochs", study.entry_epochs)  # its length: a new configuration enters at this one
        with self._sampling:  # Optuna samples lazily, at the first suggest: the whole proposal is stored inside the lock
            return study.encoding(trial.study if not hasattr(study, "_encoding") else None).suggest(trial)

    def attrs(self, cfg: Config, result: TrialResult, seed: int) -> dict[str, Any]:
        """What a finished trial stores besides its objective values (a trial of a ladder: its length,
        `epochs`, and the task metric at each rung it measured, `rungs`)."""
        dims = cfg.dims
        ladder = {"epochs": max(result.rungs), "rungs": {str(e): m[self.study.task.metric] for e, m in result.rungs.items()}} \
            if result.rungs else {}
        return {
            "config": dims,
            **{k: dims[k] for k in ("layers", "heads", "width", "mlp") if k in dims},
            "params": cfg.params,
            "flops": self.study.space.family.flops(dims),
            "seed": seed,
            **result.metrics,
            **kappa_attrs(result.kappa_init, result.kappa_final, self.regime),
            "train_time_s": result.train_time_s,
            "steps": result.steps,
            "device": result.device,
            "compile": result.compile,
            "tf32": result.tf32,
            "seed_batch": result.seed_batch,
            "device_name": result.device_name,
            "precision": result.precision,
            "torch": torch_version(),
            CLASS: execution_class(result.device, result.precision),
            **ladder,
            **({"resumed_from": result.resumed_from} if result.resumed_from is not None else {}),  # explorer.checkpoints.Carry
        }

    def evaluate(self, cfg: Config, lineage: int, on_epoch: Callable[[int, dict[str, float]], None] | None = None,
                 device: str | None = None, checkpoint_dir: Path | None = None, seed: int | None = None,
                 shared: bool | Callable[[], bool] = False, epochs: int | None = None, kept: Path | None = None) -> dict[str, Any]:
        """Train `cfg` at `seed` (default: the first) for `epochs` (default: the entry length) as trial
        `lineage` (resuming its own checkpoint if a killed run left one) and return its attributes.

        Under wsd the run continues the latest state a shorter run of (`cfg`, `seed`) kept (`carry`; its
        attribute `resumed_from` says which length's, absent when it trained from scratch) and keeps its own;
        `kept` is where those states are (default: beside the trials' checkpoints; Ray brings them to its node).

        A failure of the configuration (NaN loss, an error in the model, running past `trial_timeout_s`,
        out of memory alone on its device) becomes `TrialFailed(reason)`, so the study goes on; a fault
        (a broken CUDA context; out of memory while other trials `shared` the device: a flag, or a callable asked
        when it happens) becomes `Fault`, and
        its checkpoint stays for the retry to resume (explorer.faults). An `ExplorerError` (the task's
        data is bad) is the study's, not the trial's, and stops it; pruning and interrupts pass through.
        A pruned or stopped trial (Ray Tune ends a stopped trial's thread with SystemExit) leaves no
        checkpoint for a later trial of the same configuration to resume. `checkpoint_dir` defaults to the
        trial's folder beside the study (Ray passes one in the trial's working dir).
        """
        study = self.study
        seed = study.seeds[0] if seed is None else seed
        length = epochs or study.entry_epochs
        budget = study.spec.budget.at(length).model_copy(update={"seed": seed})
        carry = carried(study, cfg, seed, length, kept)
        owner = {"study": study.spec.name, "trial": lineage, "config": cfg.key, "budget": budget.model_dump(mode="json", exclude={"seeds"})}
        # another run's checkpoint is not resumed
        ckpt = checkpoints.claim(checkpoint_dir or study.checkpoint_dir(cfg, lineage), owner)
        start = time.perf_counter()
        raised: list[BaseException] = []  # what `on_epoch` raised: the worker's (its storage failed), not the configuration's
        try:
            with time_limit(study.spec.trial_timeout_s):
                result = trainer(study.task)(cfg.family, cfg.dims, study.task, budget, callback=_noting(on_epoch, raised),
                                             checkpoint_dir=ckpt, device=device,
                                             checkpoint_every_s=study.spec.executor.checkpoint_every_s,
                                             **({"carry": carry} if carry is not None else {}))
        except (KeyboardInterrupt, TrialReclaimed):  # kept: the resumed trial (or the retry) continues from its checkpoint
            raise
        except (optuna.TrialPruned, ExplorerError, SystemExit):
            checkpoints.remove(ckpt)
            raise
        except Exception as err:
            if any(err is e for e in raised):  # not a measurement: it passes as it is, its checkpoint kept for the retry
                raise
            failure = classify(err, shared=shared() if callable(shared) else shared)
            if not isinstance(failure, Fault):  # a fault keeps its checkpoint: its retry resumes it
                checkpoints.remove(ckpt)
            if failure is err:
                raise
            raise failure from err
        checkpoints.remove(ckpt)
        if carry is not None:
            carry.ended(result.metrics)
        return {**self.attrs(cfg, result, seed), "curve": result.curve, "trial_time_s": time.perf_counter() - start}

    def evaluate_seeds(self, cfg: Config, seeds: list[int], on_epochs: list[Callable[[int, dict[str, float]], None] | None],
                       device: str | None = None, epochs: int | None = None) -> list[dict[str, Any] | Exception]:
        """Train `cfg` at each of `seeds` as one model (explorer.seedbatch): per seed, `evaluate`'s attributes,
        or the TrialFailed / TrialPruned that ends that seed alone.

        Raises NotBatchable before training when they cannot train as one; an ExplorerError and interrupts
        stop them all, and any other error fails each seed with its reason. No checkpoints: a group that
        dies trains again. `trial_timeout_s` bounds the group at that many seconds per seed.
        """
        from explorer.seedbatch import NotBatchable, run_seeds

        study = self.study
        if study.task.trains_itself:
            raise NotBatchable(f"task {study.task.name} trains each seed its own way")
        start = time.perf_counter()
        limit = None if study.spec.trial_timeout_s is None else study.spec.trial_timeout_s * len(seeds)
        try:
            with time_limit(limit):
                outcomes = run_seeds(cfg.family, cfg.dims, study.task, study.spec.budget.at(epochs or study.entry_epochs),
                                     seeds, on_epochs, device)
        except (NotBatchable, ExplorerError, TrialFailed):  # TrialFailed: the time limit, which ends every seed
            raise
        except Exception as err:
            raise TrialFailed(f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}") from err
        spent = (time.perf_counter() - start) / len(seeds)
        return [out if isinstance(out, Exception)
                else {**self.attrs(cfg, out, seed), "curve": out.curve, "trial_time_s": spent}
                for out, seed in zip(outcomes, seeds, strict=True)]

    def fault(self, ostudy: optuna.Study, trial: optuna.Trial, err: Fault) -> bool:
        """Record a fault on `trial`, which the caller then fails without it being a measurement, and
        `Queue.requeue_dead` queues again (its retry resumes its checkpoint; `alone` on a device of its own
        after running out of memory beside others). Past `executor.max_failures` faults of its lineage it
        fails by itself instead, saying so, and is counted as failed. Returns whether it will run again."""
        study = self.study
        frozen = storage_of(ostudy).get_trial(trial_storage_id(trial))
        lineage = study.lineage(frozen)
        before = sum("fault" in t.user_attrs and t.number != frozen.number and study.lineage(t) == lineage
                     for t in ostudy.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,)))
        trial.set_user_attr("fault", str(err))
        if before >= study.spec.executor.max_failures:
            trial.set_user_attr("fail_reason", f"gave up after {before + 1} faults (executor.max_failures: "
                                               f"{study.spec.executor.max_failures}); the last: {err}")
            return False
        if err.alone:
            trial.set_user_attr("alone", True)
        return True

    def answer_from_storage(self, ostudy: optuna.Study, trial: optuna.Trial, cfg: Config) -> list[float] | None:
        """The values of an earlier measurement of `cfg` at `trial`'s seed, recording `trial` as its duplicate; else None.

        A sampler may propose a measured configuration again: it is not trained twice. Optuna's
        sampler learns from the duplicate's values, and every explorer consumer (n_trials, pruning
        peers, the frame, recommendation, dashboard) skips it by its `duplicate_of` attr. Both
        executors answer duplicates here.
        """
        seen = self.reads.completed(ostudy).get((cfg.key, self.study.seed_of(trial), self.study.length_of(trial)))
        if seen is None:
            return None
        trial.set_user_attr("config", cfg.dims)
        trial.set_user_attr("params", cfg.params)
        trial.set_user_attr("duplicate_of", seen.number)
        return list(seen.values)

    def values(self, attrs: dict[str, Any]) -> list[float]:
        """The objective values, in the study's order, from a trial's stored attributes."""
        return [float(attrs[o.name]) for o in self.study.objectives]

    def should_prune(self, ostudy: optuna.Study, number: int, epoch: int, value: float, cfg: Config) -> bool:
        """Whether the pruner stops trial `number` after `epoch` (from 1). Replicates and verification
        trials run to the end: their configuration is measured on purpose."""
        study = self.study
        if study.spec.pruner.name == "none":
            return False
        trials = ostudy.get_trials(deepcopy=False)
        attrs = trials[number].user_attrs
        if attrs.get("replicate") or attrs.get("verify"):
            return False
        key, length = current_key(ostudy), study.length_of(trials[number])
        current = [t for t in trials if is_current(t, key) and study.length_of(t) == length]  # curves of one length
        return study.pruner.should_prune(epoch, value, cfg.params, peers(current, number), cfg.key)


def carried(study: ResolvedStudy, cfg: Config, seed: int, length: int, kept: Path | None = None) -> checkpoints.Carry | None:
    """How a run of `length` meets the other runs of (`cfg`, `seed`) under wsd (explorer.checkpoints.Carry), its
    states in `kept` (default: beside the trials' checkpoints); None for one length, a cosine schedule, or a
    task that trains itself."""
    budget = study.spec.budget
    if budget.lr_schedule != "wsd" or len(budget.ladder) == 1 or study.task.trains_itself:
        return None
    return checkpoints.Carry(kept or checkpoints.kept(study.checkpoint_root, cfg.key, seed), length, budget.longest)


def _noting(on_epoch: Callable[[int, dict[str, float]], None] | None,
            raised: list[BaseException]) -> Callable[[int, dict[str, float]], None] | None:
    """`on_epoch`, noting in `raised` what it raises: storing an epoch can fail (a database restarting, a
    Ray report), and that says nothing about the configuration, which `evaluate` must not record as failed."""
    if on_epoch is None:
        return None

    def noted(epoch: int, metrics: dict[str, float]) -> None:
        try:
            on_epoch(epoch, metrics)
        except Exception as err:
            raised.append(err)
            raise

    return noted


def trainer(task: Task) -> Callable[..., TrialResult]:
    """What trains a trial: explorer.train.run_trial (imported here: it brings torch), or the task's own
    `run_trial` for a task that trains itself (bench/standin.py's stand-in, which needs no torch)."""
    if task.trains_itself:
        return lambda family, dims, _task, budget, **kwargs: task.run_trial(family, dims, budget, **kwargs)
    from explorer.train import run_trial

    return run_trial


def torch_version() -> str:
    """The torch a trial ran with: the imported one's, else the installed one's (a trial that trained without it)."""
    torch = sys.modules.get("torch")
    return torch.__version__ if torch is not None else importlib.metadata.version("torch")
