"""A local worker trains the queued seeds of its trial's configuration together with it, as one model.

When a worker starts trial T of configuration C at seed s, the study's queue may hold trials of C at
other seeds (replicates queued together). If training them as one model pays on this device
(`explorer.seedbatch.worth_batching`), the worker claims them and trains all at once (explorer.seedbatch).

Every (configuration, seed) is still trained once and recorded as its own Optuna trial. A queued trial
is claimed as `Queue.claim` takes one (`queue.pop`): its state set from WAITING to RUNNING in one storage
transaction that fails when another worker took it first, and only then opened as an `optuna.Trial`
(`Evaluator.suggest` gives it the identity and parameters any trial gets). A claimed trial beats its own
heartbeat while it trains, so if this worker dies it is failed and retried like any other; it ends with
its own attributes (`seed_batch` says how many seeds trained with it), its own failure or pruning, and
Ctrl-C queues it again. Trials that would resume a checkpoint are not claimed (a group keeps none).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import optuna

from explorer.errors import TrialFailed, TrialReclaimed
from explorer.identity import current_trials
from explorer.seedbatch import NotBatchable, worth_batching
from explorer.space import Config
from explorer.study import Study
from explorer.study.liveness import beating
from explorer.study.queue import arch, pop
from explorer.train import default_device

_WAITING, _RUNNING = optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING
OnEpoch = Callable[[optuna.Trial], Callable[[int, dict[str, float]], None]]
Ended = Callable[[optuna.trial.FrozenTrial | None], None]  # what the worker does after each trial ends (None: reclaimed)


def claim(study: Study, ostudy: optuna.Study, trial: optuna.Trial, cfg: Config, device: str | None = None) -> list[optuna.Trial]:
    """The queued trials of `cfg` at seeds other than `trial`'s that this worker now owns, one per seed; none
    when training them with `trial` would not pay here, or when `trial` itself resumes a checkpoint."""
    own = study.seed_of(trial)
    if _resumes(study, ostudy, trial.number, cfg):
        return []
    candidates: dict[int, optuna.trial.FrozenTrial] = {}
    for t in current_trials(ostudy, states=(_WAITING,)):
        seed = study.seed_of(t)
        if (arch(t) == cfg.key and seed != own and seed not in candidates and study.length_of(t) == study.length_of(trial)
                and not _resumes(study, ostudy, t.number, cfg)):
            candidates[seed] = t
    if not candidates or not worth_batching(cfg.family, cfg.dims, study.task, study.spec.budget, 1 + len(candidates),
                                            device or default_device()):
        return []
    claimed = []
    for t in candidates.values():
        mine = pop(ostudy, t)
        if mine is None:
            continue  # another worker took it first
        if study.evaluator.suggest(mine).key != cfg.key:  # fixed by the queue: cannot differ
            raise AssertionError(f"queued trial {t.number} is not of {cfg.key}")
        mine.set_user_attr("config", cfg.dims)
        mine.set_user_attr("params", cfg.params)
        claimed.append(mine)
    return claimed


def train_together(study: Study, ostudy: optuna.Study, trial: optuna.Trial, cfg: Config, claimed: list[optuna.Trial],
                   on_epoch: OnEpoch, ended: Ended, device: str | None = None) -> dict[str, Any] | None:
    """Train `trial` and `claimed` as one model; record and end each claimed trial and return `trial`'s
    attributes (raising its failure or pruning as `Evaluator.evaluate` would). None when they cannot train
    as one: then `claimed` have been trained one by one here, and `trial` is the caller's to train."""
    trials = [trial, *claimed]
    seeds = [study.seed_of(t) for t in trials]
    try:
        with _beating(ostudy, claimed):
            outcomes = study.evaluator.evaluate_seeds(cfg, seeds, [on_epoch(t) for t in trials], device, study.length_of(trial))
    except NotBatchable:
        for t in claimed:
            _end(study, ostudy, t, _alone(study, ostudy, t, cfg, on_epoch, device), ended)
        return None
    except TrialFailed as err:  # past the group's time limit, or an error in the model: every seed's reason
        outcomes = [err] * len(trials)
    except KeyboardInterrupt:
        for t in claimed:
            t.set_user_attr("interrupted", "interrupted (Ctrl-C) while it trained; its configuration is queued again")
            _tell(ostudy, t, state=optuna.trial.TrialState.FAIL)
        study.queue.requeue_dead(ostudy)
        raise
    for t, out in zip(claimed, outcomes[1:], strict=True):
        _end(study, ostudy, t, out, ended)
    if isinstance(outcomes[0], BaseException):
        raise outcomes[0]
    return outcomes[0]


def _alone(study: Study, ostudy: optuna.Study, trial: optuna.Trial, cfg: Config, on_epoch: OnEpoch,
           device: str | None) -> dict[str, Any] | BaseException:
    with beating(ostudy, trial):
        try:
            lineage = study.lineage(ostudy.get_trials(deepcopy=False)[trial.number])
            return study.evaluator.evaluate(cfg, lineage, on_epoch(trial), device, seed=study.seed_of(trial),
                                            epochs=study.length_of(trial))
        except (TrialFailed, optuna.TrialPruned, TrialReclaimed) as err:
            return err


def _end(study: Study, ostudy: optuna.Study, trial: optuna.Trial, outcome: dict[str, Any] | BaseException, ended: Ended) -> None:
    """Record a claimed trial's outcome and end it, as the worker ends the trial it runs."""
    if isinstance(outcome, optuna.TrialPruned):
        frozen = _tell(ostudy, trial, state=optuna.trial.TrialState.PRUNED)
    elif isinstance(outcome, TrialReclaimed):
        frozen = None  # another worker failed it as dead: its retry records it
    elif isinstance(outcome, BaseException):
        if isinstance(outcome, TrialFailed):  # else its epoch's callback failed (the storage): not a measurement, run again
            trial.set_user_attr("fail_reason", str(outcome))
        frozen = _tell(ostudy, trial, state=optuna.trial.TrialState.FAIL)
    else:
        for key, value in outcome.items():
            trial.set_user_attr(key, value)
        frozen = _tell(ostudy, trial, values=study.evaluator.values(outcome))
    ended(frozen)


def _tell(ostudy: optuna.Study, trial: optuna.Trial, **kwargs: Any) -> optuna.trial.FrozenTrial | None:
    """Record a trial's end; None when another worker failed it as dead meanwhile (its retry records it)."""
    try:
        return ostudy.tell(trial, **kwargs)
    except optuna.exceptions.UpdateFinishedTrialError:
        return None


def _resumes(study: Study, ostudy: optuna.Study, number: int, cfg: Config) -> bool:
    """Whether trial `number` would resume a checkpoint that an earlier run of its lineage left."""
    frozen = ostudy.get_trials(deepcopy=False)[number]
    return study.checkpoint_dir(cfg, study.lineage(frozen)).exists()


def _beating(ostudy: optuna.Study, trials: list[optuna.Trial]) -> ExitStack:
    """Heartbeats for each claimed trial while the group trains (explorer.study.liveness)."""
    stack = ExitStack()
    for t in trials:
        stack.enter_context(beating(ostudy, t))
    return stack
