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

A decision needs the pick's own evidence: at least MIN_OWN runs of it at the answer's length (a pick with
one run was decided at 0.9 points from a posterior whose interval excluded that run), and the bound covers
every split within the budget, those past the space's declared ranges too (`answer`'s `past`): where one of
them may be better than the pick, the pick is the best within the space, and the budget is not decided.

With several lengths the questions are at the target length (`decision.epochs`, default the longest).
What more runs would do is explorer.voi's; which runs a study buys next, explorer.policy's.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from explorer.errors import ExplorerError
from explorer.formats import margin as with_unit
from explorer.formats import bound, epochs_words, plural, split, value
from explorer.posterior import LEVEL, Posterior, Regret, lengths
from explorer.rows import row_key, split_row
from explorer.voi import seeds_to_decide
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
MIN_OWN = 2  # nor before the pick has this many runs of its own at the answer's length (not the surface's word alone)


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
    own: int = MIN_OWN  # the pick's runs at the answer's length
    rivals: tuple[str, ...] = ()  # splits past the space within the budget that may be better than the pick

    @property
    def pick(self) -> str:
        return self.regret.pick

    @property
    def eps(self) -> float:
        return self.regret.eps

    @property
    def decided(self) -> bool:
        """eps <= delta (over every split within the budget, past the space too), on a noise estimate of at least
        MIN_NOISE_DOF degrees of freedom, with at least MIN_OWN runs of the pick at its length, and no split past
        the space that may be better."""
        return bool(np.isfinite(self.eps) and self.eps <= self.delta and self.noise_dof >= MIN_NOISE_DOF and self.measured
                    and self.own >= MIN_OWN and not self.rivals)

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
                     "undecided: the best within the space; splits past it that fit the budget may be better"
                     if self.rivals else
                     f"undecided: {pick} has {plural(self.own, 'run')} of its own at this length, {MIN_OWN} needed"
                     if self.own < MIN_OWN else
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
    `full` read at `epochs`, and the advice names runs of any length of `full`. The bound is over every
    split within the budget, those `past` the space's ranges included (the promise is about the best within
    the budget); a split past the space is the pick only where the posterior shows it better than the best
    of the others (`shown_better`), and one that may be better than a pick within the space leaves it
    undecided (`rivals`)."""
    keys = within(posterior, budget)
    if not keys:
        raise ExplorerError(f"no configuration within {format_count(budget)} parameters", field="budget")
    regret = posterior.regret(keys, level)
    inside = tuple(k for k in keys if k not in past)
    if inside and len(inside) < len(keys):
        kept = posterior.regret(keys, level, among=inside)  # the best within the space, its bound over every split
        if regret.pick not in past or not shown_better(posterior, regret.pick, kept.pick, level):
            regret = kept
    others = [k for k in keys if k in past] if regret.pick not in past else []
    dof = noise_dof(posterior) if posterior.noise is not None else 0.0  # at the answer's length
    measured = bool(any(posterior.n[posterior.index[k]] > 0 for k in keys))
    own = int(posterior.n[posterior.index[regret.pick]])
    said = Answer(budget, regret, delta, level, verdict(posterior, regret.pick, baseline, delta, level), noise_dof=dof,
                  measured=measured, own=own, rivals=rivals(posterior, regret.pick, others, level))
    if said.decided or not advise:
        return said
    several = full is not None and epochs is not None and full is not posterior
    ladder = lengths(full) if several else []  # type: ignore[arg-type]
    source, asked = (full, [row_key(k, epochs) for k in keys]) if several else (posterior, list(keys))  # type: ignore[arg-type]
    if room is None and cap is not None:
        room = {k: max(cap - int(n), 0) for k, n in zip(source.keys, source.n) if n > 0 or ladder}
    at_cap = sum(1 for k in asked if room is not None and k in room and room[k] <= 0)
    if regret.eps <= delta and own < MIN_OWN and measured and not said.rivals:  # the pick's own runs are what is missing
        pick = row_key(regret.pick, epochs) if several else regret.pick  # type: ignore[arg-type]
        return replace(said, advice={pick: MIN_OWN - own}, cap=cap, at_cap=at_cap)
    advice, reached = seeds_to_decide(source, asked, delta, level, room, ladder=ladder)
    capped = bool(at_cap) and not reached  # the cap stops it: what would decide it were the cap raised
    if capped:
        advice, reached = seeds_to_decide(source, asked, delta, level, ladder=ladder)
    return replace(said, advice=advice, advice_reached=reached, cap=cap, at_cap=at_cap, past_cap=capped)


def shown_better(posterior: Posterior, a: str, b: str, level: float = LEVEL) -> bool:
    """Whether the posterior shows `a` better than `b`: the share of its draws with `a` ahead is at least `level`."""
    return posterior.has_intervals and float(np.mean(posterior.difference(a, b) > 0)) >= level


def rivals(posterior: Posterior, pick: str, keys: Sequence[str], level: float = LEVEL) -> tuple[str, ...]:
    """Those of `keys` (splits past the space) the posterior cannot rule out as better than the pick (ahead in
    more than (1 - level) / 2 of its draws), the likeliest better first."""
    if not posterior.has_intervals or not keys:
        return ()
    better = {k: float(np.mean(posterior.difference(k, pick) > 0)) for k in keys}
    return tuple(k for k in sorted(better, key=lambda k: -better[k]) if better[k] > (1 - level) / 2)


def distinct(posterior: Posterior, budgets: Sequence[int]) -> dict[tuple[str, ...], list[int]]:
    """The study's budgets grouped by the configurations they hold: one question each."""
    out: dict[tuple[str, ...], list[int]] = {}
    for b in sorted(budgets):
        keys = within(posterior, b)
        if keys:
            out.setdefault(keys, []).append(int(b))
    return out


def noise_dof(posterior: Posterior) -> float:
    """Degrees of freedom of the replicates a posterior's rows hold (at one length, read `at_length`): the
    noise model's own for one length."""
    return float(np.maximum(posterior.n - 1, 0).sum())


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
