"""What a study runs next: the grid's queue in spread order, replicate seeds, verification runs, the
retries of trials that did not finish, and how much is left.

Everything here is derived from the storage each time, so a resumed study (or a second worker) queues
exactly what is missing. It never trains (evaluate.py) nor opens the storage (storage.py).
"""

from __future__ import annotations

import random
import threading
from typing import TYPE_CHECKING, Any

import numpy as np
import optuna

from explorer.frame import trials_frame
from explorer.identity import current_rows, current_trials
from explorer.pruning import come_back
from explorer.replicates import wanted
from explorer.study.read import counts, runs_regardless
from explorer.study.storage import storage_of, trial_storage_id

if TYPE_CHECKING:
    from explorer.study.spec import Study

MAX_WORKER_DEATHS = 5  # a grid configuration whose trial died with its worker this often is not queued again
MAX_DUPLICATE_RUN = 200  # the sampler proposed only measured configurations this often in a row: the study stops
_WAITING, _RUNNING, _FAIL = optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.FAIL


def arch(t: optuna.trial.FrozenTrial) -> Any:
    """A trial's configuration key, also while it is queued (its fixed parameters)."""
    return t.system_attrs.get("fixed_params", t.params).get("arch")


class Queue:
    def __init__(self, study: Study):
        self.study = study
        self._queueing = threading.Lock()  # trials in threads (executor.n_jobs) end together: one queues the round

    def grid(self, ostudy: optuna.Study) -> list[str]:
        """Enqueue each feasible configuration no trial has taken yet (grid studies only), spread first.

        The queue is in `spread_order`, so a study whose n_trials is below the grid's size trains a
        prefix that covers the space, not the first keys in lexicographic order (all at depth 1).
        Called by the study's creator before it records the identity, so other workers find the queue
        full; only after `--force` with a new space may two workers queue the same configuration at
        once, and then the later copy is answered from storage (or waited for while it trains).
        """
        study = self.study
        if study.spec.sampler.name != "grid":
            return []
        taken = {arch(t) for t in current_trials(ostudy)}
        free = study.space.free_dims
        ordered = [study.keys[i] for i in spread_order([[cfg.dims[d] for d in free] for cfg in study.configs.values()])]
        missing = [key for key in ordered if key not in taken]
        for key in missing:
            ostudy.enqueue_trial({"arch": key})
        return missing

    def waiting(self, ostudy: optuna.Study) -> int:
        """Queued trials not yet taken by any worker, after re-queueing the work of dead workers."""
        self.study.store.repair(ostudy)
        self._requeue_lost(ostudy)
        return len(current_trials(ostudy, states=(_WAITING,)))

    def _requeue_lost(self, ostudy: optuna.Study) -> None:
        """Queue again a grid configuration whose every trial died with its worker and was not retried.

        A worker killed after failing a stale trial but before queueing its retry loses the
        configuration; so does one past Optuna's retry limit. Up to MAX_WORKER_DEATHS per configuration:
        one that keeps killing its worker (the kernel's OOM killer) is then left failed.
        """
        if self.study.spec.sampler.name != "grid":
            return
        alive: set[str] = set()
        deaths: dict[str, int] = {}
        for t in current_trials(ostudy):
            if t.user_attrs.get("replicate"):  # `replicates` queues a lost replicate again
                continue
            key = arch(t)
            if t.state == _FAIL and "fail_reason" not in t.user_attrs:
                deaths[key] = deaths.get(key, 0) + 1
            else:
                alive.add(key)
        for key, n in deaths.items():
            if key not in alive and key in self.study.configs and n < MAX_WORKER_DEATHS:
                ostudy.enqueue_trial({"arch": key}, user_attrs={"requeued_after_deaths": n})

    def requeue(self, ostudy: optuna.Study, trial: optuna.trial.FrozenTrial, alone: bool = False) -> None:
        """Queue a trial that did not finish (interrupted, reclaimed, a fault) again: its retry resumes its
        checkpoint, at its seed (a replicate stays one); `alone`: on a device of its own (explorer.faults)."""
        kept = {k: trial.user_attrs[k] for k in ("seed", "replicate", "verify", "alone") if k in trial.user_attrs}
        ostudy.enqueue_trial(trial.params, user_attrs={**kept, **({"alone": True} if alone else {}), "retry_of": self.study.lineage(trial)})

    def reclaim_running(self, ostudy: optuna.Study) -> list[int]:
        """Mark RUNNING trials failed and queue their configurations again.

        For storages without heartbeats (journal files), after a crash, when no other worker is
        running: with heartbeats this happens by itself after the grace period.
        """
        numbers = []
        for t in current_trials(ostudy, states=(_RUNNING,)):
            ostudy.tell(t.number, state=_FAIL)
            self.requeue(ostudy, t)
            numbers.append(t.number)
        return numbers

    def retry_failed(self, ostudy: optuna.Study) -> list[str]:
        """Queue again, at its seed, every (configuration, seed) whose trials all failed by themselves (a
        NaN loss, a bad learning rate): after the cause is fixed, `run --retry-failed` measures them.
        Trials whose worker died are retried by themselves and are not touched here."""
        failed: dict[tuple[str, int], optuna.trial.FrozenTrial] = {}
        settled: set[tuple[str, int]] = set()
        for t in current_trials(ostudy):
            key = (arch(t), self.study.seed_of(t))
            if t.state == _FAIL and "fail_reason" in t.user_attrs:
                failed.setdefault(key, t)
            elif t.state != _FAIL and "duplicate_of" not in t.user_attrs:
                settled.add(key)  # measured, running or queued already
        retried = []
        for key, t in failed.items():
            if key not in settled:
                kept = {k: t.user_attrs[k] for k in ("seed", "replicate") if k in t.user_attrs}
                ostudy.enqueue_trial({"arch": key[0]}, user_attrs={**kept, "retry_of_failed": t.number})
                retried.append(key[0])
        return retried

    def replicates(self, ostudy: optuna.Study) -> list[tuple[str, int]]:
        """Queue the replicates the policy wants now (explorer.replicates); returns (configuration, seed) pairs.

        A seed is taken once any trial of it is complete, pruned, running, queued or failed by itself
        (one whose worker died is retried or queued again here). `fixed` queues every missing seed of
        each measured configuration; `adaptive` queues one more seed per uncertain configuration, in
        rounds, only once every configuration the study asked for is measured and nothing is queued or running.
        """
        seeds = self.study.seeds
        with self._queueing:
            self._bring_back_pruned(ostudy)
            return self._queue_replicates(ostudy, seeds) if len(seeds) > 1 else []

    def _bring_back_pruned(self, ostudy: optuna.Study) -> list[str]:
        """Queue once more each pruned, never completed configuration that the pruner would no longer stop
        given the complete trials stored now (explorer.pruning.come_back): a pruned configuration is not
        buried for good when the evidence against it weakens. Each comes back once."""
        if self.study.spec.pruner.name != "dominated":
            return []
        trials = current_trials(ostudy)
        if any(t.state in (_WAITING, _RUNNING) for t in trials):
            return []  # in between rounds only, when the evidence is what it will be
        back = {arch(t) for t in trials if "came_back" in t.user_attrs}
        keys = [k for k in come_back(self.study.pruner, current_rows(trials_frame(ostudy), ostudy)) if k not in back]
        for key in keys:
            ostudy.enqueue_trial({"arch": key}, user_attrs={"came_back": True})
        return keys

    def _queue_replicates(self, ostudy: optuna.Study, seeds: list[int]) -> list[tuple[str, int]]:
        study = self.study
        trials = current_trials(ostudy)
        adaptive = study.spec.replicates.policy != "fixed"  # adaptive and decide: one seed more per round
        if adaptive and (any(t.state in (_WAITING, _RUNNING) for t in trials) or self._to_n(ostudy, trials) > 0):
            return []
        taken: dict[str, set[int]] = {}
        deaths: dict[tuple[str, int], int] = {}
        for t in trials:
            key, seed = arch(t), study.seed_of(t)
            died = t.state == _FAIL and "fail_reason" not in t.user_attrs
            deaths[key, seed] = deaths.get((key, seed), 0) + died
            if not died or deaths[key, seed] >= MAX_WORKER_DEATHS:  # one that keeps killing its worker is left
                taken.setdefault(key, set()).add(seed)
        queued = []
        base = study.space.baseline
        summary = study.reads.summary(ostudy, draws=None if study.spec.replicates.policy == "adaptive" else 0)
        for key in wanted(summary, len(seeds), study.spec.replicates, budgets=study.budgets(),
                          baseline=base.key if base else None, higher_is_better=study.task.higher_is_better,
                          decision=study.spec.decision):
            missing = [s for s in seeds if s not in taken.get(key, set())]
            for seed in missing[:1] if adaptive else missing:
                ostudy.enqueue_trial({"arch": key}, user_attrs={"seed": seed, "replicate": True})
                queued.append((key, seed))
        return queued

    def verification(self, ostudy: optuna.Study, keys: list[str]) -> list[str]:
        """Queue configurations `recommend --verify` asks for; they run even once `n_trials` is reached.

        A configuration already measured is not queued; one waiting in a grid's queue is marked.
        """
        taken = {arch(t): t for t in current_trials(ostudy)}
        queued = []
        for key in keys:
            t = taken.get(key)
            if t is None:
                ostudy.enqueue_trial({"arch": key}, user_attrs={"verify": True})
            elif t.state == _WAITING:
                storage_of(ostudy).set_trial_user_attr(trial_storage_id(t), "verify", True)  # no public API marks a queued trial
            else:
                continue
            queued.append(key)
        return queued

    def stalled(self, ostudy: optuna.Study) -> bool:
        """Whether the sampler's last MAX_DUPLICATE_RUN proposals were all measured already."""
        last = [t for t in current_trials(ostudy) if t.state.is_finished()][-MAX_DUPLICATE_RUN:]
        return len(last) == MAX_DUPLICATE_RUN and all("duplicate_of" in t.user_attrs for t in last)

    def remaining(self, ostudy: optuna.Study) -> int:
        """Trials still to run: configurations to measure up to `n_trials` (no more than those never
        measured), plus queued replicates and verification trials, which run whatever `n_trials` says."""
        trials = current_trials(ostudy)
        extra = sum(t.state == _WAITING and runs_regardless(t) for t in trials)
        return self._to_n(ostudy, trials) + extra

    def unstarted(self, ostudy: optuna.Study) -> int:
        """Trials no worker has started yet: `remaining` less the configurations being measured now,
        and for a grid no more than its queue (what a worker asking now would get)."""
        trials = current_trials(ostudy)
        waiting = [t for t in trials if t.state == _WAITING]
        extra = sum(runs_regardless(t) for t in waiting)
        running = sum(t.state == _RUNNING and not runs_regardless(t) for t in trials)
        left = max(0, self._to_n(ostudy, trials) - running) + extra
        return min(left, len(waiting)) if self.study.spec.sampler.name == "grid" else left

    def _to_n(self, ostudy: optuna.Study, trials: list[optuna.trial.FrozenTrial]) -> int:
        """Configurations still to measure before `n_trials` is reached (0 once the sampler stalled)."""
        counted = [t for t in trials if counts(t)]
        unmeasured = len(self.study.configs.keys() - {t.params.get("arch") for t in counted})
        return 0 if self.stalled(ostudy) else min(max(0, self.study.spec.n_trials - len(counted)), unmeasured)


def spread_order(points: list[list[Any]], exact_up_to: int = 4096) -> list[int]:
    """Indices of `points` ordered so that every prefix spreads over them: greedy farthest-point
    (maximin) on each dimension's value rank scaled to [0, 1], starting at the first point.

    Quadratic in the number of points; past `exact_up_to` a seeded shuffle, which spreads in expectation.
    """
    n = len(points)
    if n > exact_up_to:
        order = list(range(n))
        random.Random(0).shuffle(order)
        return order
    columns = list(zip(*points))
    ranks = [{v: i / max(len(set(col)) - 1, 1) for i, v in enumerate(sorted(set(col)))} for col in columns]
    x = np.array([[rank[v] for rank, v in zip(ranks, p, strict=True)] for p in points], dtype=float).reshape(n, len(columns))
    order = [0]
    nearest = np.linalg.norm(x - x[0], axis=1)
    nearest[0] = -np.inf  # taken
    for _ in range(n - 1):
        nxt = int(np.argmax(nearest))  # ties: the earliest point, so the order is deterministic
        order.append(nxt)
        nearest = np.minimum(nearest, np.linalg.norm(x - x[nxt], axis=1))
        nearest[nxt] = -np.inf
    return order
