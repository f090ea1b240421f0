"""The read side of a study: which stored trials are measurements, counts of them, and the
per-configuration summary that `status`, `export`, `recommend`, `dashboard` and the queue share. Only the
trials of the study's current identity are read (explorer.identity).

Nothing here writes to the storage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import optuna
import pandas as pd

from explorer.decisions import Answer, answer, distinct
from explorer.frame import trials_frame
from explorer.identity import classes, current_key, current_rows, current_trials, per_trial
from explorer.pruning import Peer
from explorer.stats import summarize

if TYPE_CHECKING:
    from explorer.study.spec import ResolvedStudy

_COMPLETE, _PRUNED, _FAIL = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL


def is_measured(t: optuna.trial.FrozenTrial) -> bool:
    """Whether a trial is a measurement: complete, pruned, or failed by itself (`fail_reason`).

    A duplicate answered from storage is not; nor a trial failed because its worker died (stale
    heartbeat) or because of a fault (`fault`: a broken CUDA context, out of memory beside other trials;
    explorer.faults): neither has a `fail_reason`, and both are retried. A fault retried past
    `executor.max_failures` fails by itself, saying so.
    """
    if "duplicate_of" in t.user_attrs:
        return False
    return t.state in (_COMPLETE, _PRUNED) or (t.state == _FAIL and "fail_reason" in t.user_attrs)


def counts(t: optuna.trial.FrozenTrial) -> bool:
    """Whether a trial counts towards `n_trials`: a measurement of a configuration, not a replicate of
    one, nor the retry of a failed or pruned one (a configuration counts once)."""
    again = ("retry_of_failed", "came_back")
    return is_measured(t) and not t.user_attrs.get("replicate") and not any(k in t.user_attrs for k in again)


def runs_regardless(t: optuna.trial.FrozenTrial) -> bool:
    """Trials that run whatever `n_trials` says: their configuration is measured on purpose (a replicate
    seed, a verification, the retry of a failed configuration, a pruned one brought back)."""
    attrs = t.user_attrs
    return bool(attrs.get("verify") or attrs.get("replicate") or "retry_of_failed" in attrs or "came_back" in attrs)


def peers(trials: list[optuna.trial.FrozenTrial], number: int) -> list[Peer]:
    """The other trials' parameter counts and per-epoch curves, for pruning: distinct measurements only."""
    return [Peer(t.user_attrs["params"], t.user_attrs["curve"], t.params.get("arch")) for t in trials
            if t.number != number and "curve" in t.user_attrs and "params" in t.user_attrs and "duplicate_of" not in t.user_attrs]


class Reads:
    """Counts and summaries of one study's stored trials."""

    def __init__(self, study: ResolvedStudy):
        self.study = study

    def finished(self, ostudy: optuna.Study) -> int:
        """Measurements so far, replicates included (see `is_measured`)."""
        return sum(is_measured(t) for t in current_trials(ostudy))

    def configurations(self, ostudy: optuna.Study) -> int:
        """Configurations measured so far (complete, pruned or failed by itself): what `n_trials` counts."""
        return len({t.params.get("arch") for t in current_trials(ostudy) if counts(t)})

    def outcomes(self, ostudy: optuna.Study) -> tuple[int, int]:
        """(configurations with a result: a complete or pruned trial; configurations whose every trial failed
        by itself): what `status` says, so that failed configurations never read as measured."""
        results, failed = set(), set()
        for t in current_trials(ostudy):
            if is_measured(t):
                (failed if t.state == _FAIL else results).add(t.params.get("arch"))
        return len(results), len(failed - results)

    def set_aside(self, ostudy: optuna.Study) -> int:
        """Trials that ran under an earlier identity (before `run --force` changed the budget, say): kept, not read."""
        key = current_key(ostudy)
        return sum(not key.asks(t) for t in ostudy.get_trials(deepcopy=False))

    def classes_note(self, ostudy: optuna.Study) -> str | None:
        """One line when the study holds trials of more than one execution class (CPU and GPU), else None:
        which class is read (the one it runs under now) and how many trials of the others are set aside."""
        ran, now = classes(ostudy), current_key(ostudy).execution
        if len(ran) < 2:
            return None
        others = ", ".join(f"{n} of {cls}" for cls, n in sorted(ran.items()) if cls != now)
        if now:
            return (f"this study holds trials of {len(ran)} execution classes: the {ran[now]} of {now} are read, {others} "
                    "are kept and set aside (results of two classes are never compared)")
        return (f"this study holds trials of {len(ran)} execution classes ({others}), read together until a run records "
                "the one it trains under (`explorer run` refuses to go on under one of them without --force)")

    def failures(self, ostudy: optuna.Study) -> int:
        return sum(t.state == _FAIL and "fail_reason" in t.user_attrs for t in current_trials(ostudy))

    def too_many_failures(self, ostudy: optuna.Study) -> bool:
        """Whether `max_failures` trials failed by themselves: the study stops, it would fail them all."""
        limit = self.study.spec.max_failures
        return limit is not None and self.failures(ostudy) >= limit

    def completed(self, ostudy: optuna.Study) -> dict[tuple[str, int, int], optuna.trial.FrozenTrial]:
        """The first completed measurement of each run (configuration, seed, length)."""
        out: dict[tuple[str, int, int], optuna.trial.FrozenTrial] = {}
        trials = [t for t in current_trials(ostudy, states=(_COMPLETE,)) if "duplicate_of" not in t.user_attrs]
        for t, key in zip(trials, per_trial(ostudy, trials, "run", self.run), strict=True):
            out.setdefault(key, t)
        return out

    def run(self, t: optuna.trial.FrozenTrial) -> tuple[str, int, int]:
        """A stored trial's run: (configuration, seed, length)."""
        return t.params.get("arch"), self.study.seed_of(t), self.study.length_of(t)

    def summary(self, ostudy: optuna.Study, draws: int | None = None, epochs: int | None = None,
                frame: pd.DataFrame | None = None) -> pd.DataFrame:
        """Per-configuration statistics of the stored measurements (explorer.stats.summarize), with the
        posterior of every configuration of the space (the unmeasured ones predicted) in its attrs; at
        `epochs` (default the study's target length) where the study trains several lengths. `frame`: the
        current trials' rows to read (default all; bench/cluster.py reads those stored by a time)."""
        study = self.study
        objectives = [(o.name, o.direction) for o in study.objectives]
        kwargs = {} if draws is None else {"draws": draws}
        candidates = [(c.key, c.dims, c.params) for c in study.configs.values()]
        budget = study.spec.budget
        rows = current_rows(trials_frame(ostudy), ostudy) if frame is None else frame
        return summarize(rows, study.task.metric, objectives,
                         first_seed=study.seeds[0], candidates=candidates, epochs=epochs or study.target_epochs,
                         lengths=budget.ladder, budget=budget, seeds=study.seeds, **kwargs)

    def answers(self, summary: pd.DataFrame) -> list[tuple[list[int], Answer]]:
        """The answer at each of the study's budgets (`decision.budgets`), budgets holding the same
        configurations once: (those budgets, their answer), from the summary's posterior. An undecided
        answer offers seeds only to configurations below the study's cap (`Study.seed_cap`), and says how
        many are at it."""
        if not len(summary):
            return []
        study, post = self.study, summary.attrs["posterior"]
        base = study.space.baseline
        best = float(np.nanmax(post.sign() * summary["mean"])) * post.sign()
        delta = study.spec.decision.margin(study.task.higher_is_better, best)
        return [(at, answer(post, at[-1], base.key if base else None, delta, study.spec.decision.level,
                            full=summary.attrs.get("full"), epochs=summary.attrs.get("epochs"), cap=study.seed_cap))
                for at in distinct(post, study.budgets()).values()]

    def learning(self, frame: pd.DataFrame) -> str | None:
        """In words, when the runs of a `trials_frame` were still learning as they stopped (explorer.learning)."""
        from explorer.learning import said

        study = self.study
        return said(frame, study.task.metric, study.task.higher_is_better, study.spec.budget)

    def replicate_cost(self, ostudy: optuna.Study) -> tuple[int, int]:
        """(runs measured, runs that every measured configuration at the maximum seeds would take)."""
        summary = self.summary(ostudy, draws=0)
        return int(summary["n"].sum()) if len(summary) else 0, len(summary) * len(self.study.seeds)
