"""What a study runs next: the grid's queue in spread order, replicate seeds, verification runs, the
retries of trials that did not finish, and how much is left.

Everything here is derived from the storage each time, so a resumed study (or a second worker) queues
exactly what is missing. Each decision reads and writes under the study's lock (lock.py), across
threads, processes and hosts, so two workers never both queue (or start) what only one should: every
(configuration, seed) is trained once. It never trains (evaluate.py) nor opens the storage (storage.py).
"""

from __future__ import annotations

import os
import random
import socket
import threading
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import optuna

from explorer import checkpoints
from explorer.frame import trials_frame
from explorer.identity import current_rows, current_trials, per_trial
from explorer.optuna_compat import storage_of, trial_storage_id
from explorer.rows import row_key, split_row
from explorer.pruning import come_back
from explorer.replicates import wanted
from explorer.study.read import Reads, counts, is_measured, runs_regardless
from explorer.study.storage import Store

if TYPE_CHECKING:
    from explorer.space import Config
    from explorer.study.evaluate import Evaluator
    from explorer.study.spec import ResolvedStudy

MAX_WORKER_DEATHS = 5  # a grid configuration whose trial died with its worker this often is not queued again
MAX_DUPLICATE_RUN = 200  # the sampler proposed only measured configurations this often in a row: the study stops
_WAITING, _RUNNING, _FAIL = optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.FAIL
_COMPLETE = optuna.trial.TrialState.COMPLETE
WORKER = f"{socket.gethostname()}:{os.getpid()}"
_KEPT = ("seed", "epochs", "replicate", "verify", "retry_of_failed", "came_back", "alone")  # what a retry keeps: its run, why it runs, where


@dataclass(frozen=True)
class Plan:
    """What the study's workers may start (`startable`)."""

    now: list[optuna.trial.FrozenTrial]  # queued trials that may start now, in queue order
    held: list[optuna.trial.FrozenTrial]  # queued trials waiting for another run of their (configuration, seed) to end
    sampler: int  # new configurations the sampler may still start

    def ready(self) -> int:
        """Runs a free worker would start without a new round: queued ones and the sampler's (not the held:
        they wait for a worker that is busy with their (configuration, seed))."""
        return len(self.now) + self.sampler


def arch(t: optuna.trial.FrozenTrial) -> Any:
    """A trial's configuration key, also while it is queued (its fixed parameters)."""
    return t.system_attrs.get("fixed_params", t.params).get("arch")


def run(study: ResolvedStudy, t: optuna.trial.FrozenTrial) -> tuple[Any, int, int]:
    """What a trial measures: (configuration, seed, length). Every run is trained once."""
    return arch(t), study.seed_of(t), study.length_of(t)


class Queue:
    """What runs next, decided under `store`'s lock; `evaluator` gives the trial evaluator (made on first use:
    it imports torch), whose `suggest` turns a claimed trial into its configuration."""

    def __init__(self, study: ResolvedStudy, store: Store, reads: Reads, evaluator: Callable[[], Evaluator]):
        self.study, self.store, self.reads, self._evaluator = study, store, reads, evaluator
        self.evidence: frozenset[int] | None = None  # the finished trials the replicate policy last read
        self.offered = 0  # the free slots it was offered then
        self._reading = threading.Lock()  # one reading of the policy at a time in this process: a second waits for its runs

    def claim(self, ostudy: optuna.Study) -> tuple[optuna.Trial, Config] | None:
        """Start the next trial this worker may run, with its configuration; None when none may start now.

        Under the study's lock, the count of what is left and the start are one step for every worker:
        never more than `n_trials` configurations, never one (configuration, seed) twice. Queued trials
        go first, in queue order (`startable`); then a new proposal while `n_trials` admits one (never for
        a grid: its queue is all it runs).
        """
        with self.store.lock():
            trials = current_trials(ostudy)
            plan = startable(self, ostudy, trials)
            trial = next(filter(None, (pop(ostudy, t) for t in plan.now)), None)
            if trial is None:
                if plan.sampler <= 0:
                    return None
                with warnings.catch_warnings(action="ignore", category=UserWarning):  # "heartbeat ... with optimize": we beat ourselves
                    trial = ostudy.ask()
            cfg = self._evaluator().suggest(trial)
            trial.set_user_attr("worker", WORKER)  # who took it: `status` and a post-mortem can say
            return trial, cfg

    def grid(self, ostudy: optuna.Study) -> list[str]:
        """Enqueue each feasible configuration no trial has taken yet (grid studies only), spread first:
        in `spread_order`, so that n_trials below the grid's size trains a prefix that covers the space.
        Its creator queues the grid before it records the identity; `--force` queues what a new space adds.
        """
        study = self.study
        if study.spec.sampler.name != "grid":
            return []
        with self.store.lock():
            taken = {arch(t) for t in current_trials(ostudy)}
            free = study.space.free_dims
            ordered = [study.keys[i] for i in spread_order([[cfg.dims[d] for d in free] for cfg in study.configs.values()])]
            missing = [key for key in ordered if key not in taken]
            for key in missing:
                enqueue(self.study, ostudy, {"arch": key})
        return missing

    def waiting(self, ostudy: optuna.Study) -> int:
        """Queued trials not yet taken by any worker, after failing and queueing again the work of dead workers."""
        self.store.repair(ostudy)
        self.requeue_dead(ostudy)
        return len(current_trials(ostudy, states=(_WAITING,)))

    def requeue_dead(self, ostudy: optuna.Study) -> list[tuple[str, int, int]]:
        """Queue again each run (configuration, seed, length) whose every trial ended without a result (its
        worker died, was interrupted or reclaimed): the retry resumes its checkpoint, at its seed, for the same reason.

        Idempotent and under the study's lock: two workers (or one killed between failing a stale trial
        and queueing it) never queue one twice. One whose worker died MAX_WORKER_DEATHS times (the
        kernel's OOM killer, say) is left failed; interrupts do not count, nor faults (a fault past
        `executor.max_failures` fails by itself: explorer.faults).
        """
        with self.store.lock():
            trials = current_trials(ostudy)
            if not any(t.state == _FAIL and "fail_reason" not in t.user_attrs for t in trials):
                return []  # nothing ended without a result (the common case: read once, cheaply)
            dead: dict[tuple[str, int, int], list[optuna.trial.FrozenTrial]] = {}
            alive: set[tuple[str, int, int]] = set()
            for t in trials:
                pair = run(self.study, t)
                if t.state == _FAIL and "fail_reason" not in t.user_attrs:
                    dead.setdefault(pair, []).append(t)
                elif t.state in (_WAITING, _RUNNING) or is_measured(t):
                    alive.add(pair)
            queued = []
            for pair, trials in dead.items():
                deaths = sum("interrupted" not in t.user_attrs and "fault" not in t.user_attrs for t in trials)
                if pair in alive or pair[0] not in self.study.configs or deaths >= MAX_WORKER_DEATHS:
                    continue
                last = max(trials, key=lambda t: t.number)
                kept = {k: last.user_attrs[k] for k in _KEPT if k in last.user_attrs}
                enqueue(self.study, ostudy, last.params or {"arch": pair[0]}, **kept, retry_of=checkpoints.lineage(last))
                queued.append(pair)
            return queued

    def reclaim_running(self, ostudy: optuna.Study) -> list[int]:
        """Fail RUNNING trials and queue them again, now (`resume --reclaim`, no other worker alive):
        otherwise heartbeats do this after the grace period."""
        with self.store.lock():
            numbers = []
            for t in current_trials(ostudy, states=(_RUNNING,)):
                ostudy.tell(t.number, state=_FAIL)
                numbers.append(t.number)
            self.requeue_dead(ostudy)
        return numbers

    def retry_failed(self, ostudy: optuna.Study) -> list[str]:
        """Queue again, at its seed, every (configuration, seed) whose trials all failed by themselves (a
        NaN loss, a bad learning rate): after the cause is fixed, `run --retry-failed` measures them.
        Trials whose worker died are retried by themselves and are not touched here."""
        with self.store.lock():
            failed: dict[tuple[str, int, int], optuna.trial.FrozenTrial] = {}
            settled: set[tuple[str, int, int]] = set()
            for t in current_trials(ostudy):
                key = run(self.study, t)
                if t.state == _FAIL and "fail_reason" in t.user_attrs:
                    failed.setdefault(key, t)
                elif t.state != _FAIL and "duplicate_of" not in t.user_attrs:
                    settled.add(key)  # measured, running or queued already
            retried = []
            for key, t in failed.items():
                if key not in settled:
                    kept = {k: t.user_attrs[k] for k in ("seed", "epochs", "replicate") if k in t.user_attrs}
                    enqueue(self.study, ostudy, {"arch": key[0]}, **kept, retry_of_failed=t.number)
                    retried.append(key[0])
            return retried

    def replicates(self, ostudy: optuna.Study, free: int = 1) -> list[tuple[str, int]]:
        """Queue the runs the replicate policy wants now (explorer.replicates); returns (configuration, seed) pairs.

        `free`: this worker's idle slots (threads of a local run, Ray's trials below `max_concurrent`). A
        round is due while some of them would find nothing to start (`startable`) and the policy has
        something new to read: results, or more free slots than it was offered. `decide` then hands out up
        to that many runs at once (`batch`), knowing the runs in flight (`pending`); a row may come back
        several times, each a distinct seed. `adaptive` gives one more run to each configuration it wants
        that is not in flight; `fixed` queues every missing seed. Each run's seed is the one
        `Budget.continues` names (under wsd the seed whose run is longest: the new run continues it), and
        a (configuration, seed, length) is queued once. The policy reads outside the study's lock.
        """
        with self._reading:
            with self.store.lock():
                self.requeue_dead(ostudy)
                _bring_back_pruned(self, ostudy)
                if len(self.study.seeds) == 1 and len(self.study.spec.budget.ladder) == 1:
                    return []  # no more seeds, no longer runs
                trials = current_trials(ostudy)
                plan = startable(self, ostudy, trials)
                batch = _round_due(self, trials, plan, free)
                if batch is None:
                    return []
                pending = _pending(self.study, trials, plan)
            return _read_policy(self, ostudy, batch, pending)

    def verification(self, ostudy: optuna.Study, keys: list[str]) -> list[str]:
        """Queue configurations `recommend --verify` asks for; they run even once `n_trials` is reached.

        A configuration already measured is not queued; one waiting in a grid's queue is marked.
        """
        with self.store.lock():
            taken = {arch(t): t for t in current_trials(ostudy)}
            queued = []
            for key in keys:
                t = taken.get(key)
                if t is None:
                    enqueue(self.study, ostudy, {"arch": key}, verify=True)
                elif t.state == _WAITING:
                    storage_of(ostudy).set_trial_user_attr(trial_storage_id(t), "verify", True)  # no public API marks a queued trial
                else:
                    continue
                queued.append(key)
            return queued

    def grid_note(self) -> str | None:
        """What a grid study that trains only a prefix of its grid says when it starts."""
        spec, size = self.study.spec, len(self.study.configs)
        if spec.sampler.name != "grid" or spec.n_trials >= size:
            return None
        return (f"grid of {size} configurations, n_trials {spec.n_trials}: trains {spec.n_trials} spread over the grid "
                "(its queue is in farthest-point order); raise n_trials to run the rest")

    def stalled(self, ostudy: optuna.Study) -> bool:
        """Whether the sampler's last MAX_DUPLICATE_RUN proposals were all measured already."""
        last = [t for t in current_trials(ostudy) if t.state.is_finished()][-MAX_DUPLICATE_RUN:]
        return len(last) == MAX_DUPLICATE_RUN and all("duplicate_of" in t.user_attrs for t in last)

    def remaining(self, ostudy: optuna.Study) -> int:
        """Trials still to run: configurations to measure up to `n_trials` (no more than those never
        measured), plus queued replicates and verification trials, which run whatever `n_trials` says."""
        trials = current_trials(ostudy)
        extra = sum(t.state == _WAITING and runs_regardless(t) for t in trials)
        return self.to_measure(ostudy, trials) + extra

    def unstarted(self, ostudy: optuna.Study) -> int:
        """Trials no worker has started yet: what `startable` says will start (for a grid no more than its queue)."""
        plan = startable(self, ostudy, current_trials(ostudy))
        return len(plan.now) + len(plan.held) + plan.sampler

    def to_start(self, ostudy: optuna.Study, trials: list[optuna.trial.FrozenTrial]) -> int:
        """Configurations the sampler may still start: `to_measure` less those whose first run is in flight."""
        return self.to_measure(ostudy, trials) - sum(t.state == _RUNNING and not runs_regardless(t) for t in trials)

    def to_measure(self, ostudy: optuna.Study, trials: list[optuna.trial.FrozenTrial]) -> int:
        """Configurations still to measure before `n_trials` is reached (0 once the sampler stalled)."""
        counted = [key for key in per_trial(ostudy, trials, "counted", _counted) if key is not _UNCOUNTED]
        unmeasured = len(self.study.configs.keys() - set(counted))
        return 0 if self.stalled(ostudy) else min(max(0, self.study.spec.n_trials - len(counted)), unmeasured)


def startable(queue: Queue, ostudy: optuna.Study, trials: list[optuna.trial.FrozenTrial]) -> Plan:
    """What workers may start: the queued trials that may start now, in queue order (those that run
    regardless of `n_trials`, those whose run is complete already (answered from storage, so that no
    stray copy stays queued for ever), and as many others as `n_trials` still admits), those held
    until another run of their (configuration, seed) ends (under wsd the longer run continues from
    the shorter one's state: explorer.train), and how many new proposals the sampler may still start.
    A grid's queued trials past `n_trials` are in none of them: they never start."""
    slots = queue.to_start(ostudy, trials)
    waiting = sorted((t for t in trials if t.state == _WAITING), key=lambda t: t.number)
    done = queue.reads.completed(ostudy).keys()
    free = {t.number for t in waiting if runs_regardless(t) or run(queue.study, t) in done}
    admitted = {t.number for t in [t for t in waiting if t.number not in free][:max(0, slots)]}
    going = [t for t in waiting if t.number in free or t.number in admitted]
    training = {(arch(t), queue.study.seed_of(t)) for t in trials if t.state == _RUNNING} \
        if queue.study.spec.budget.lr_schedule == "wsd" else set()
    now = [t for t in going if (arch(t), queue.study.seed_of(t)) not in training]
    sampler = 0 if queue.study.spec.sampler.name == "grid" else max(0, slots) - len(admitted)
    return Plan(now, [t for t in going if t not in now], sampler)


_UNCOUNTED = object()


def _counted(t: optuna.trial.FrozenTrial) -> Any:
    """The configuration a trial counts towards `n_trials` (explorer.study.read.counts), or _UNCOUNTED."""
    return t.params.get("arch") if counts(t) else _UNCOUNTED


def enqueue(study: ResolvedStudy, ostudy: optuna.Study, params: dict[str, Any], **attrs: Any) -> None:
    """Queue a trial, marked with the question it answers (explorer.identity) and the worker that queued it."""
    ostudy.enqueue_trial(params, user_attrs={"identity": study.identity_key, "queued_by": WORKER, **attrs})


def _bring_back_pruned(queue: Queue, ostudy: optuna.Study) -> list[str]:
    """Queue once more each pruned, never completed configuration that the pruner would no longer stop
    given the complete trials stored now (explorer.pruning.come_back): a pruned configuration is not
    buried for good when the evidence against it weakens. Each comes back once."""
    study = queue.study
    if study.spec.pruner.name != "dominated":
        return []
    trials = current_trials(ostudy)
    plan = startable(queue, ostudy, trials)
    if any(t.state == _RUNNING for t in trials) or plan.now or plan.held:
        return []  # in between rounds only, when the evidence is what it will be (a grid's trials past n_trials never run)
    back = {arch(t) for t in trials if "came_back" in t.user_attrs}
    keys = [k for k in come_back(study.pruner, current_rows(trials_frame(ostudy), ostudy)) if k not in back]
    for key in keys:
        enqueue(study, ostudy, {"arch": key}, came_back=True)
    return keys


def _round_due(queue: Queue, trials: list[optuna.trial.FrozenTrial], plan: Plan, free: int) -> int | None:
    """How many runs a round may hand out now, or None when none is due. `fixed` reads each new set of
    results once and queues whatever it wants; `adaptive` and `decide` read when some of the `free`
    slots would find nothing to start and there are results they have not read, or more free slots than
    their last reading was offered (what it wanted then is queued, or in flight until a result comes)."""
    evidence = frozenset(t.number for t in trials if t.state.is_finished())
    if queue.study.spec.replicates.policy == "fixed":
        if evidence == queue.evidence:
            return None
        queue.evidence = evidence
        return max(free, 1)
    batch = free - plan.ready()
    if batch <= 0 or (evidence == queue.evidence and free <= queue.offered):
        return None
    queue.evidence, queue.offered = evidence, free
    return batch


def _pending(study: ResolvedStudy, trials: list[optuna.trial.FrozenTrial], plan: Plan) -> dict[str, int]:
    """Runs in flight per row (running, or queued to run): under wsd a run counts at each rung it will
    measure; a grid's queued trials past `n_trials`, which never run, do not count."""
    ladder = study.spec.budget.ladder
    out: Counter[str] = Counter()
    for t in [t for t in trials if t.state == _RUNNING] + plan.now + plan.held:
        key, _, length = run(study, t)
        if len(ladder) == 1:
            out[key] += 1
            continue
        for rung in [r for r in ladder if r <= length] if study.spec.budget.lr_schedule == "wsd" else [length]:
            out[row_key(key, rung)] += 1
    return dict(out)


def _read_policy(queue: Queue, ostudy: optuna.Study, batch: int, pending: dict[str, int]) -> list[tuple[str, int]]:
    """The policy's reading (outside the study's lock: other workers claim meanwhile), queued under it."""
    try:
        rows = _wanted_rows(queue, ostudy, batch, pending)
    except BaseException:
        queue.evidence = None  # read again by the next call
        raise
    with queue.store.lock():
        return _queue_rows(queue, ostudy, rows)


def _wanted_rows(queue: Queue, ostudy: optuna.Study, batch: int | None = None, pending: dict[str, int] | None = None) -> list[str]:
    """The rows (configurations, or a configuration at a length) the policy wants one more run of; `decide`
    at most `batch` of them, knowing the `pending` runs in flight."""
    study = queue.study
    if study.spec.replicates.policy == "fixed" and len(study.spec.budget.ladder) == 1:
        # every measured configuration short of the seeds, in the summary's order (parameters, then key): no posterior to fit
        runs = queue.reads.completed(ostudy)
        seeds = Counter(key for key, _, _ in runs)
        params = {key: int(t.user_attrs.get("params", 0)) for (key, _, _), t in runs.items()}
        return sorted((k for k, n in seeds.items() if n < len(study.seeds)), key=lambda k: (params[k], k))
    summary = queue.reads.summary(ostudy, draws=None if study.spec.replicates.policy == "adaptive" else 0)
    return wanted(summary, len(study.seeds), study.spec.replicates, budgets=study.budgets(), decision=study.spec.decision,
                  baseline=study.space.baseline.key if study.space.baseline is not None else None, batch=batch, pending=pending)


def _queue_rows(queue: Queue, ostudy: optuna.Study, rows: list[str]) -> list[tuple[str, int]]:
    """Queue the policy's `rows` against the storage as it is now (under the lock): a run per row, at the seed
    `Budget.continues` names among the runs stored, queued or running (never a (configuration, seed,
    length) twice); `fixed` every seed a row lacks, `adaptive` one run per configuration not in flight."""
    study = queue.study
    trials = current_trials(ostudy)
    policy, budget = study.spec.replicates.policy, study.spec.budget
    in_flight = {arch(t) for t in trials if t.state in (_WAITING, _RUNNING)} if policy == "adaptive" else set()
    lengths: dict[str, dict[int, set[int]]] = {}  # configuration -> seed -> the lengths its runs train
    for t in trials:
        key, seed, length = run(study, t)
        lengths.setdefault(key, {}).setdefault(seed, set()).add(length)
    queued = []
    for row in rows:
        key, length = split_row(row)
        if key in in_flight:
            continue
        length = length or study.entry_epochs
        runs = lengths.setdefault(key, {})
        while (pick := budget.continues(length, runs, study.seeds)) is not None:
            seed = pick[0]
            enqueue(study, ostudy, {"arch": key}, seed=seed, replicate=True, **({"epochs": length} if len(budget.ladder) > 1 else {}))
            runs.setdefault(seed, set()).add(length)
            queued.append((key, seed))
            if policy != "fixed":
                break
    return queued


def pop(ostudy: optuna.Study, t: optuna.trial.FrozenTrial) -> optuna.Trial | None:
    """Take the queued trial `t` (what `ask()` does with the first one): None if another worker took it."""
    storage = storage_of(ostudy)
    try:
        if not storage.set_trial_state_values(trial_storage_id(t), _RUNNING):  # atomic in every storage
            return None
    except optuna.exceptions.UpdateFinishedTrialError:
        return None
    return optuna.Trial(ostudy, trial_storage_id(t))


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
