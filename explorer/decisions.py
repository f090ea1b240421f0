"""The answer for a budget, read off the one posterior (explorer.posterior): the configuration to use,
its regret bound, whether that is decided, the verdict against the baseline, and what more seeds buy.

"use X: within eps of the best configuration within the budget (95%)": eps is the 95% quantile of the
regret max_c mu_c - mu_X over the posterior draws, c over every configuration within the budget
(measured, or predicted by the surface), and X is the configuration with the smallest such bound (ties:
the smaller expected regret, then fewer parameters). The pick minimises the bound rather than the
expected regret because the bound is what the answer promises: a budget is *decided* when eps <=
delta, and any configuration whose bound is within delta would do. Against the baseline, from the same
draws of the difference X - baseline: beats (its 95% interval above 0), worse (below 0), equivalent
within delta (its 90% interval inside ±delta: two one-sided 5% tests, Schuirmann's TOST), non-inferior
(the 95% interval's lower end above -delta: one-sided 2.5%, as ICH E9 asks), or no evidence either way.
Beats and worse read the two-sided interval because the direction is chosen after seeing the data: with
one-sided 5% each, a pick truly equal to the baseline was said to beat it or lose to it in 10% of
simulated studies.

Seeds by value of information (`next_seeds`): each seed goes where it most shrinks the bounds still
above delta at the study's budgets, budgets that hold the same configurations counted once. What a
seed would do is imagined on the draws (explorer.posterior.Posterior.imagine): the posterior's spread
after it, its mean held. It reads the posterior and nothing above it.

With several lengths the questions are at the target length (`decision.epochs`, default the longest)
and a run may be bought at any length of the ladder: a new seed of a configuration at a short length,
or a longer run of a contender. Each is judged by how much it shrinks the bounds at the target length
per second of training (the posterior's `cost`, from the trials' own train times).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from explorer.errors import ExplorerError
from explorer.formats import margin as with_unit
from explorer.formats import bound, epochs_words, plural, split, value
from explorer.posterior import LEVEL, Posterior, Regret, at_length, lengths
from explorer.rows import row_key, split_row
from explorer.voi import greedy, seeds_to_decide
from explorer.units import format_count, parse_count

_BELOW = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*%\s*-?\s*below\s*-?\s*baseline\s*$", re.IGNORECASE)


def parse_budget(text: str, baseline_params: int | None = None) -> int:
    """`"60M"`, `"1.5e6"`, `"250k"`, `"baseline"` or `"10%-below-baseline"` -> a parameter count."""
    below = _BELOW.match(text)
    if below or text.strip().lower() == "baseline":
        if baseline_params is None:
            raise ExplorerError(f"{text!r} needs a study with a baseline", field="budget")
        percent = float(below.group(1)) if below else 0.0
        if percent >= 100:
            raise ExplorerError(f"{text!r} leaves no parameters", field="budget")
        return round(baseline_params * (1 - percent / 100))
    try:
        budget = parse_count(text)
    except ValueError as err:
        raise ExplorerError(f"{err}, or N%-below-baseline", field="budget") from None
    if budget <= 0:
        raise ExplorerError(f"{text!r} is not a positive parameter count", field="budget")
    return budget


ACCURACY_DELTA = 0.01  # 1 point of an accuracy-like metric: the default study's top seed sd is 1.3 points, 1/360 a step
LOSS_DELTA = 0.01  # of the best mean: a loss has no natural scale, so the margin is relative
DEFAULT_BUDGETS = 10
MIN_NOISE_DOF = 12  # a bound is no decision before the run noise is estimated on this many degrees of freedom


class DecisionSpec(BaseModel):
    """`decision:` in a study: what counts as decided, at which budgets, and how many seeds it may take."""

    model_config = ConfigDict(extra="forbid")
    delta: float | None = Field(None, gt=0, description="the margin, in the metric's units: a budget is decided when "
                                                        "its regret bound is at most this; null: "
                                                        f"{ACCURACY_DELTA:g} for an accuracy-like metric (maximized, in "
                                                        f"[0, 1]), {LOSS_DELTA:.0%} of the best mean for a loss")
    budgets: list[str] | None = Field(None, description="the parameter budgets the study answers (`250k`, `baseline`, "
                                                        f"`10%-below-baseline`); null: {DEFAULT_BUDGETS} log-spaced "
                                                        "over the space's parameter counts")
    level: float = Field(LEVEL, gt=0.5, lt=1, description="the confidence of the regret bound and of the verdicts")
    max_seeds: int | None = Field(None, ge=2, description="the `decide` policy's cap on seeds per configuration; "
                                                          "null: every seed of `budget.seeds`")
    epochs: int | None = Field(None, ge=1, description="the length (epochs) the answers are for; null: the longest of "
                                                       "`budget.epochs`")

    def margin(self, higher_is_better: bool, best: float) -> float:
        """`delta`, or its documented default for the metric's direction."""
        if self.delta is not None:
            return self.delta
        return ACCURACY_DELTA if higher_is_better else LOSS_DELTA * abs(best)

    def budget_list(self, params: Sequence[int], baseline_params: int | None = None) -> list[int]:
        """The parameter budgets the study answers: the named ones, else log-spaced from its smallest to its largest configuration."""
        if self.budgets is not None:
            return [parse_budget(b, baseline_params) for b in self.budgets]
        return sorted({int(round(b)) for b in np.geomspace(min(params), max(params), DEFAULT_BUDGETS)})


@dataclass(frozen=True)
class Verdict:
    """The pick against the baseline from the posterior's draws of their difference (> 0: the pick is better)."""

    kind: Literal["beats", "worse", "equivalent", "non-inferior", "no evidence", "is the baseline", "unmeasured"]
    baseline: str
    diff: float = float("nan")
    lo: float = float("nan")  # the difference's 2.5% quantile
    hi: float = float("nan")  # its 97.5% quantile

    def words(self, pick: str, delta: float, unit: float = 100.0, what: str = "points") -> str:
        base = split(self.baseline)
        if self.kind == "is the baseline":
            return f"{pick} is the baseline"
        if self.kind == "unmeasured":
            return f"no verdict against the baseline {base}: it has no completed run at this length"
        if not np.isfinite(self.lo):
            return f"against the baseline {base}: {unit * self.diff:+.1f} {what}, no interval (one seed each)"
        shown = f"{unit * self.diff:+.1f} {what}, 95% interval {unit * self.lo:+.1f} to {unit * self.hi:+.1f}"
        margin = with_unit(delta, unit, what, exact=True)
        said = {"beats": f"{pick} beats the baseline {base}",
                "worse": f"the baseline {base} beats {pick} (the budget costs {what})",
                "equivalent": f"{pick} is equivalent to the baseline {base} within {margin}",
                "non-inferior": f"{pick} is not worse than the baseline {base} by more than {margin}",
                "no evidence": f"no evidence either way between {pick} and the baseline {base}"}[self.kind]
        return f"{said}: {shown}"


def verdict(posterior: Posterior, pick: str, baseline: str | None, delta: float, level: float = LEVEL) -> Verdict | None:
    """The pick against the baseline from the same posterior (one-sided claims at `level` each)."""
    if baseline is None:
        return None
    if baseline == pick:
        return Verdict("is the baseline", baseline)
    if baseline not in posterior.index or posterior.n[posterior.index[baseline]] == 0:
        return Verdict("unmeasured", baseline)
    if not posterior.has_intervals:
        i, j = posterior.index[pick], posterior.index[baseline]
        return Verdict("no evidence", baseline, posterior.sign() * float(posterior.raw[i] - posterior.raw[j]))
    d = posterior.difference(pick, baseline)
    lo, hi, lo90, hi90 = (float(q) for q in np.quantile(d, [(1 - level) / 2, (1 + level) / 2, 1 - level, level]))
    kind: str = ("beats" if lo > 0 else "worse" if hi < 0 else "equivalent" if -delta < lo90 and hi90 < delta
                 else "non-inferior" if lo > -delta else "no evidence")
    return Verdict(kind, baseline, float(d.mean()), lo, hi)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Answer:
    """One budget's answer: use `pick`, within `eps` of the best within the budget (`level`), decided or not."""

    budget: int
    regret: Regret
    delta: float
    level: float
    verdict: Verdict | None = None
    advice: dict[str, int] = field(default_factory=dict)  # undecided: more seeds per configuration (or row) that would decide it
    advice_reached: bool = True  # False: even ADVICE_CAP more seeds would not (advice is then where they would go)
    noise_dof: float = float("inf")  # degrees of freedom of the run noise estimate the bound rests on
    measured: bool = True  # some configuration within the budget has a run at the answer's length
    cap: int | None = None  # the study's seeds per configuration
    at_cap: int = 0  # measured configurations within the budget already at `cap`
    past_cap: bool = False  # seeds below the cap cannot decide it: `advice` is what would, were the cap raised

    @property
    def pick(self) -> str:
        return self.regret.pick

    @property
    def eps(self) -> float:
        return self.regret.eps

    @property
    def decided(self) -> bool:
        """eps <= delta, on a noise estimate of at least MIN_NOISE_DOF degrees of freedom, with runs at its length."""
        return bool(np.isfinite(self.eps) and self.eps <= self.delta and self.noise_dof >= MIN_NOISE_DOF and self.measured)

    def advice_words(self) -> str:
        """Where more seeds would go, each with its count: `3 / 8 (4 seeds), 5 / 8 (1 seed)`; with several
        lengths, runs: `3 / 8 at 40 epochs (2 runs)`."""
        return ", ".join(f"{shown(k)} ({plural(n, 'seed' if split_row(k)[1] is None else 'run')})"
                         for k, n in self.advice.items())

    def words(self, unit: float = 100.0, what: str = "points") -> list[str]:
        """The answer's lines: the bound and whether it decides, the verdict, what would decide it."""
        margin = with_unit(self.delta, unit, what, exact=True)
        pick = split(self.pick)
        if not np.isfinite(self.eps):
            out = [f"use {pick} (the best mean): no bound yet, one seed per configuration; undecided"]
        else:
            state = ("decided" if self.decided else f"undecided (margin {margin})" if self.eps > self.delta else
                     "undecided: no run within the budget reached this length yet (predicted from shorter runs)"
                     if not self.measured else
                     f"undecided: the run noise rests on {self.noise_dof:g} degrees of freedom of replicates, "
                     f"{MIN_NOISE_DOF} needed (more seeds of any configurations)")
            out = [f"use {pick}: within {with_unit(self.eps, unit, what)} of the best configuration within the budget "
                   f"({self.level:.0%}); {state}"]
        if self.verdict is not None:
            out.append(self.verdict.words(pick, self.delta, unit, what))
        return out + ([self.seeds_words()] if self.seeds_words() else [])

    def seeds_words(self) -> str:
        """Undecided: how many more seeds (runs, with several lengths) would decide it and where they would go,
        or why none can; else ''."""
        if self.decided:
            return ""
        if not self.advice:  # advised against a cap, and nothing below it helps
            return f"no run the study may still buy narrows it (its cap: {self.cap} seeds per configuration)" if self.cap else ""
        total = sum(self.advice.values())
        more = "more run" if any(split_row(k)[1] is not None for k in self.advice) else "more seed"
        head = (f"about {plural(total, more)} would decide it" if self.advice_reached
                else f"{plural(total, more)} would narrow it but not decide it")
        if self.past_cap:  # said as what raising the cap would buy, never as seeds the study will run
            head = (f"seeds below the study's cap of {self.cap} per configuration cannot decide it ({self.at_cap} within "
                    f"the budget at the cap); with budget.seeds (or decision.max_seeds) raised, {head}")
        return f"{head}: {self.advice_words()}"


def shown(row: str) -> str:
    """A configuration, or a (configuration, length) row, in words: `3 / 8`, `3 / 8 at 40 epochs`."""
    key, epochs = split_row(row)
    return split(key) if epochs is None else f"{split(key)} at {epochs_words(epochs)}"


def within(posterior: Posterior, budget: int) -> tuple[str, ...]:
    """The configurations the posterior knows with at most `budget` parameters."""
    return tuple(k for k, p in zip(posterior.keys, posterior.params) if p <= budget)


def answer(posterior: Posterior, budget: int, baseline: str | None, delta: float, level: float = LEVEL,
           room: Mapping[str, int] | None = None, advise: bool = True, cap: int | None = None,
           full: Posterior | None = None, epochs: int | None = None, past: Collection[str] = ()) -> Answer:
    """The answer at `budget`; undecided, which configurations and how many seeds would decide it
    (`room`: seeds each may still get; `cap`: the study's seeds per configuration, giving `room` when
    it is None; neither: no limit; `advise`: False leaves that out). With several lengths `posterior` is
    `full` read at `epochs`, and the advice names runs of any length of `full`. A split `past` the
    measured range is the answer only where the posterior shows it better than the best of the others
    (`shown_better`); else the answer, and its bound, are among the others."""
    keys = within(posterior, budget)
    if not keys:
        raise ExplorerError(f"no configuration within {format_count(budget)} parameters", field="budget")
    regret = posterior.regret(keys, level)
    inside = tuple(k for k in keys if k not in past)
    if inside and len(inside) < len(keys):
        kept = posterior.regret(inside, level)
        if regret.pick not in past or not shown_better(posterior, regret.pick, kept.pick, level):
            keys, regret = inside, kept
    dof = noise_dof(posterior) if posterior.noise is not None else 0.0  # at the answer's length
    measured = bool(any(posterior.n[posterior.index[k]] > 0 for k in keys))
    said = Answer(budget, regret, delta, level, verdict(posterior, regret.pick, baseline, delta, level), noise_dof=dof,
                  measured=measured)
    if said.decided or not advise:
        return said
    ladder = to_buy(lengths(full), epochs) if full is not None and epochs is not None and full is not posterior else []
    source, asked = (full, [row_key(k, epochs) for k in keys]) if ladder else (posterior, list(keys))
    if room is None and cap is not None:
        room = {k: max(cap - int(n), 0) for k, n in zip(source.keys, source.n) if n > 0 or ladder}
    at_cap = sum(1 for k in asked if room is not None and k in room and room[k] <= 0)
    advice, reached = seeds_to_decide(source, asked, delta, level, room, ladder=ladder)
    capped = bool(at_cap) and not reached  # the cap stops it: what would decide it were the cap raised
    if capped:
        advice, reached = seeds_to_decide(source, asked, delta, level, ladder=ladder)
    return Answer(budget, regret, delta, level, said.verdict, advice, reached, dof, measured, cap, at_cap, capped)


def shown_better(posterior: Posterior, a: str, b: str, level: float = LEVEL) -> bool:
    """Whether the posterior shows `a` better than `b`: the share of its draws with `a` ahead is at least `level`."""
    return posterior.has_intervals and float(np.mean(posterior.difference(a, b) > 0)) >= level


def distinct(posterior: Posterior, budgets: Sequence[int]) -> dict[tuple[str, ...], list[int]]:
    """The study's budgets grouped by the configurations they hold: one question each."""
    out: dict[tuple[str, ...], list[int]] = {}
    for b in sorted(budgets):
        keys = within(posterior, b)
        if keys:
            out.setdefault(keys, []).append(int(b))
    return out


def next_seeds(posterior: Posterior, budgets: Sequence[int], delta: float, level: float, room: Mapping[str, int],
               batch: int | None = None, baseline: str | None = None, epochs: int | None = None) -> list[str]:
    """The measured configurations that get one more seed now (the `decide` replicate policy): a round
    of one seed each where it most shrinks the undecided bounds, as many as there are undecided questions
    (at least 2); `room[key]` is how many more seeds a configuration may get. While the noise estimate
    rests on fewer than MIN_NOISE_DOF degrees of freedom (none at first), the best means of each question
    get the next seed instead, enough of them to reach it. The `baseline` gets a seed in every round while
    a verdict claims something against it for a pick with more seeds than it has (`_claim_outruns`).

    With several lengths `posterior` is the whole one, `epochs` the target length, `room` per row, and
    what it returns are rows (a configuration at a length): the first seeds go to the shortest length,
    a first run at the target to each question's best means, then runs by value per second."""
    ladder = lengths(posterior) if epochs is not None else []
    if ladder:
        return _next_runs(posterior, budgets, delta, level, room, batch, baseline, epochs, to_buy(ladder, epochs))
    questions = list(distinct(posterior, budgets))
    dof = posterior.noise.dof if posterior.noise is not None else 0.0
    if dof < MIN_NOISE_DOF:  # too little replication to trust the noise: more seeds of each question's best means
        out: dict[str, None] = {}
        for depth in range(1, 1 + max(map(len, questions))):
            for keys in questions:
                top = sorted((k for k in keys if room.get(k, 0) > 0 and posterior.n[posterior.index[k]] > 0),
                             key=lambda k: -posterior.sign() * posterior.mean[posterior.index[k]])
                out.update(dict.fromkeys(top[:depth]))
            if len(out) >= max(2, MIN_NOISE_DOF - dof):
                break
        return list(out)
    regrets = [posterior.regret(q, level) for q in questions]
    undecided = [q for q, r in zip(questions, regrets) if r.eps > delta]
    chosen: dict[str, int] = {}
    if undecided:
        measured = {k: room.get(k, 0) for k in posterior.keys if posterior.n[posterior.index[k]] > 0}
        chosen, _ = greedy(posterior, undecided, delta, level, measured, batch or max(2, len(undecided)), repeat=False)
    if baseline is not None and room.get(baseline, 0) > 0 and _claim_outruns(posterior, [r.pick for r in regrets], baseline,
                                                                              delta, level):
        chosen.setdefault(baseline, 1)
    return list(chosen)


def to_buy(ladder: Sequence[int], epochs: int) -> list[int]:
    """The lengths a run is bought at: the shortest (a new seed, cheap) and the target (under wsd its run gives
    every shorter rung too; on bench/lengths.py the policy spent a third of its runs on the middle rung of
    10/20/40 and decided nothing at 40)."""
    return sorted({ladder[0], epochs})


def _next_runs(full: Posterior, budgets: Sequence[int], delta: float, level: float, room: Mapping[str, int],
               batch: int | None, baseline: str | None, epochs: int, ladder: Sequence[int]) -> list[str]:
    """`next_seeds` for several lengths: rows, judged at `epochs` per second of training. The run noise is
    estimated first where it is cheap (seeds at the shortest length), then at the target itself (a bound at
    a length is no decision before its own replicates give MIN_NOISE_DOF degrees of freedom: the noise of
    40-epoch runs read off 10-epoch ones made the default study sure to 0.3 points of single runs)."""
    view = at_length(full, epochs)
    if not len(view.keys):  # no surface yet, nothing run at the target: rank by the shortest length's runs
        view = at_length(full, ladder[0])
    questions = list(distinct(view, budgets))
    measured = {split_row(k)[0] for k, n in zip(full.keys, full.n) if n > 0}
    for length, dof in ((ladder[0], full.noise.dof if full.noise is not None else 0.0), (epochs, noise_dof(view))):
        if dof < MIN_NOISE_DOF:  # more runs of each question's best means at this length, enough to reach it
            out: dict[str, None] = {}
            for depth in range(1, 1 + max(map(len, questions))):
                for keys in questions:
                    top = sorted((k for k in keys if k in measured and room.get(row_key(k, length), 0) > 0),
                                 key=lambda k: -view.sign() * view.mean[view.index[k]])
                    out.update(dict.fromkeys(row_key(k, length) for k in top[:depth]))
                if len(out) >= max(2, MIN_NOISE_DOF - dof):
                    break
            if out:
                return list(out)
    regrets = [view.regret(q, level) for q in questions]
    undecided = [tuple(row_key(k, epochs) for k in q) for q, r in zip(questions, regrets) if r.eps > delta]
    chosen: dict[str, int] = {}
    if undecided:
        options = {row_key(k, e): room.get(row_key(k, e), 0) for k in measured for e in ladder}
        chosen, _ = greedy(full, undecided, delta, level, options, batch or max(2, len(undecided)), repeat=False, ladder=ladder)
    target = row_key(baseline, epochs) if baseline is not None else None
    if target is not None and room.get(target, 0) > 0 and baseline in measured and (
            full.n[full.index[target]] == 0 or _claim_outruns(view, [r.pick for r in regrets], baseline, delta, level)):
        chosen.setdefault(target, 1)  # no verdict against a baseline with no run at the target
    return list(chosen)


def noise_dof(posterior: Posterior) -> float:
    """Degrees of freedom of the replicates a posterior's rows hold (at one length, read `at_length`): the
    noise model's own for one length."""
    return float(np.maximum(posterior.n - 1, 0).sum())


def _claim_outruns(posterior: Posterior, picks: Sequence[str], baseline: str, delta: float, level: float) -> bool:
    """Whether a verdict against the baseline claims something (beats, worse, equivalent, non-inferior)
    for a pick with more seeds than the baseline has: one or two seeds of a noisy baseline made such
    claims false in bench/decide.py's fidelity table (2 of 40 studies at a 1-point margin), so
    the baseline catches up."""
    if baseline not in posterior.index or posterior.n[posterior.index[baseline]] == 0:
        return False
    have = posterior.n[posterior.index[baseline]]
    return any(posterior.n[posterior.index[p]] > have and verdict(posterior, p, baseline, delta, level).kind
               in ("beats", "worse", "equivalent", "non-inferior") for p in dict.fromkeys(picks))


def table(answers: Sequence[tuple[list[int], Answer]], posterior: Posterior, metric: str, higher_is_better: bool) -> pd.DataFrame:
    """The answers at a study's budgets as rows to show (status, the dashboard): budgets, the configuration
    to use, its params, mean and 95% interval, eps, decided, the verdict, what more seeds would do."""
    lo, hi = posterior.interval()
    unit, what = (100.0, "points") if higher_is_better else (1.0, metric)
    rows = []
    for at, a in answers:
        i = posterior.index[a.pick]
        rows.append({"budget": " to ".join(dict.fromkeys(format_count(b) for b in (at[0], at[-1]))), "use": split(a.pick),
                     "params": int(posterior.params[i]), metric: value(posterior.mean[i], higher_is_better),
                     "95% interval": f"{value(lo[i], higher_is_better)} to {value(hi[i], higher_is_better)}"
                     if posterior.has_intervals else "",
                     f"ε ({what})": (bound(a.eps) if higher_is_better else f"{a.eps:.2g}") if np.isfinite(a.eps) else "",
                     "decided": "yes" if a.decided else "no",
                     "vs baseline": a.verdict.kind if a.verdict is not None else "",
                     "more seeds": a.seeds_words()})
    return pd.DataFrame(rows)
