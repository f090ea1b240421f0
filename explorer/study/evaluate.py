"""The evaluation of one trial: its configuration as the sampler proposed it, its training run, what it
stores, an answer from storage when the configuration was measured already, and whether to prune it.

Both executors (local threads, Ray Tune workers) go through here, so a trial means the same wherever it
runs. It does not decide what runs next (queue.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna

from explorer import checkpoints
from explorer.conditioning import kappa_attrs, space_regime
from explorer.errors import ExplorerError, TrialFailed, TrialReclaimed
from explorer.identity import current_key, is_current, legacy_key
from explorer.space import Config
from explorer.seedbatch import NotBatchable, run_seeds
from explorer.study.read import peers
from explorer.train import TrialResult, run_trial
from explorer.watchdog import time_limit

if TYPE_CHECKING:
    from explorer.study.spec import Study


class Evaluator:
    def __init__(self, study: Study):
        self.study = study
        self._sampling = threading.Lock()  # trials in threads sample one at a time, each seeing the other's proposal

    def suggest(self, trial: optuna.Trial) -> Config:
        """The trial's configuration as the sampler proposed it: always feasible (explorer.sampling).

        Its ordered parameters (layers, heads, ...) are what samplers model; its key is stored as the
        categorical `arch` too, which queues, executors and dashboards read.
        """
        study = self.study
        trial.set_user_attr("identity", study.identity_key)  # the question this trial answers (explorer.identity)
        with self._sampling:  # Optuna samples lazily, at the first suggest: the whole proposal is stored inside the lock
            return study.encoding(trial.study if not hasattr(study, "_encoding") else None).suggest(trial)

    def attrs(self, cfg: Config, result: TrialResult, seed: int) -> dict[str, Any]:
        """What a finished trial stores besides its objective values."""
        dims = cfg.dims
        return {
            "config": dims,
            **{k: dims[k] for k in ("layers", "heads", "width", "mlp") if k in dims},
            "params": cfg.params,
            "flops": self.study.space.family.flops(dims),
            "seed": seed,
            **result.metrics,
            **kappa_attrs(result.kappa_init, result.kappa_final, space_regime(self.study.space)),
            "train_time_s": result.train_time_s,
            "steps": result.steps,
            "device": result.device,
            "compile": result.compile,
            "tf32": result.tf32,
            "seed_batch": result.seed_batch,
        }

    def evaluate(self, cfg: Config, lineage: int, on_epoch: Callable[[int, dict[str, float]], None] | None = None,
                 device: str | None = None, checkpoint_dir: Path | None = None, seed: int | None = None) -> dict[str, Any]:
        """Train `cfg` at `seed` (default: the first) as trial `lineage` (resuming its own checkpoint if a
        killed run left one) and return its attributes.

        Any failure inside the trial (NaN loss, out of memory, an error in the model, running past
        `trial_timeout_s`) becomes `TrialFailed(reason)`, so the study goes on; an `ExplorerError`
        (the task's data is bad) is the study's, not the trial's, and stops it; pruning and interrupts
        pass through. A pruned or stopped trial (Ray Tune ends a stopped trial's thread with
        SystemExit) leaves no checkpoint for a later trial of the same configuration to resume.
        `checkpoint_dir` defaults to the trial's folder beside the study (Ray passes one in the trial's
        working dir).
        """
        study = self.study
        seed = study.seeds[0] if seed is None else seed
        budget = study.spec.budget.model_copy(update={"seed": seed})
        owner = {"study": study.spec.name, "trial": lineage, "config": cfg.key, "budget": budget.model_dump(mode="json", exclude={"seeds"})}
        # another run's checkpoint is not resumed
        ckpt = checkpoints.claim(checkpoint_dir or study.checkpoint_dir(cfg, lineage), owner)
        start = time.perf_counter()
        try:
            with time_limit(study.spec.trial_timeout_s):
                result = run_trial(cfg.family, cfg.dims, study.task, budget, callback=on_epoch,
                                   checkpoint_dir=ckpt, device=device)
        except (KeyboardInterrupt, TrialReclaimed):  # kept: the resumed trial (or the retry) continues from its checkpoint
            raise
        except (optuna.TrialPruned, TrialFailed, ExplorerError, SystemExit):
            checkpoints.remove(ckpt)
            raise
        except Exception as err:
            checkpoints.remove(ckpt)
            raise TrialFailed(f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}") from err
        checkpoints.remove(ckpt)
        return {**self.attrs(cfg, result, seed), "curve": result.curve, "trial_time_s": time.perf_counter() - start}

    def evaluate_seeds(self, cfg: Config, seeds: list[int], on_epochs: list[Callable[[int, dict[str, float]], None] | None],
                       device: str | None = None) -> list[dict[str, Any] | Exception]:
        """Train `cfg` at each of `seeds` as one model (explorer.seedbatch): per seed, `evaluate`'s attributes,
        or the TrialFailed / TrialPruned that ends that seed alone.

        Raises NotBatchable before training when they cannot train as one; an ExplorerError and interrupts
        stop them all, and any other error fails each seed with its reason. No checkpoints: a group that
        dies trains again. `trial_timeout_s` bounds the group at that many seconds per seed.
        """
        study = self.study
        start = time.perf_counter()
        limit = None if study.spec.trial_timeout_s is None else study.spec.trial_timeout_s * len(seeds)
        try:
            with time_limit(limit):
                outcomes = run_seeds(cfg.family, cfg.dims, study.task, study.spec.budget, seeds, on_epochs, device)
        except (NotBatchable, ExplorerError, TrialFailed):  # TrialFailed: the time limit, which ends every seed
            raise
        except Exception as err:
            raise TrialFailed(f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}") from err
        spent = (time.perf_counter() - start) / len(seeds)
        return [out if isinstance(out, Exception)
                else {**self.attrs(cfg, out, seed), "curve": out.curve, "trial_time_s": spent}
                for out, seed in zip(outcomes, seeds, strict=True)]

    def answer_from_storage(self, ostudy: optuna.Study, trial: optuna.Trial, cfg: Config) -> list[float] | None:
        """The values of an earlier measurement of `cfg` at `trial`'s seed, recording `trial` as its duplicate; else None.

        A sampler may propose a measured configuration again: it is not trained twice. Optuna's
        sampler learns from the duplicate's values, and every explorer consumer (n_trials, pruning
        peers, the frame, recommendation, dashboard) skips it by its `duplicate_of` attr. Both
        executors answer duplicates here.
        """
        seen = self.study.reads.completed(ostudy).get((cfg.key, self.study.seed_of(trial)))
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
        key, legacy = current_key(ostudy), legacy_key(ostudy)
        current = [t for t in trials if is_current(t, key, legacy)]
        return study.pruner.should_prune(epoch, value, cfg.params, peers(current, number), cfg.key)
