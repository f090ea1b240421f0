"""Decisions a user can act on: for a budget, whether the pick is non-inferior to the baseline, beats a
configuration, is equivalent to it within a margin, or how many more seeds would decide it; and the
budgets a study answers (`decision:` in its YAML).

It reads per-configuration statistics (explorer.stats), never raw trials, and builds no model.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from explorer.errors import ExplorerError
from explorer.stats import LEVEL, Comparison, compare, groups_of
from explorer.units import parse_count

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


ACCURACY_DELTA = 0.005  # 0.5 points of an accuracy-like metric in [0, 1]
LOSS_DELTA = 0.01  # of the best mean: a loss has no natural scale, so the margin is relative
DEFAULT_BUDGETS = 10


class DecisionSpec(BaseModel):
    """`decision:` in a study: what counts as decided, at which budgets, and how many seeds it may take."""

    model_config = ConfigDict(extra="forbid")
    delta: float | None = Field(None, gt=0)  # metric units; None: ACCURACY_DELTA when maximized, LOSS_DELTA x |best mean| when minimized
    budgets: list[str] | None = None  # "250k", "baseline", "10%-below-baseline"; None: DEFAULT_BUDGETS log-spaced over the space
    level: float = Field(LEVEL, gt=0.5, lt=1)
    max_seeds: int | None = Field(None, ge=2)  # the `decide` replicate policy's cap per configuration; None: budget.seeds

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
class Decision:
    """A budget's answer in words a user can act on; `pair` is what more seeds would decide when undecided."""

    kind: Literal["non-inferior", "beats", "equivalent", "undecided"]
    a: str
    b: str
    comparison: Comparison
    delta: float
    more_seeds: int | None = None  # undecided: about this many more seeds of a and b (None: more than 1000)

    @property
    def decided(self) -> bool:
        return self.kind != "undecided"

    def words(self, unit: float = 100.0, what: str = "points") -> str:
        c, margin = self.comparison, f"{unit * self.delta:.2g} {what}"
        level = f"{c.level:.0%}" + (f", simultaneous over {c.family} comparisons" if c.family > 1 else "")
        shown = f"{unit * c.diff:+.1f} ± {unit * c.half:.1f} {what} ({level})"
        if self.kind == "non-inferior":
            return f"{self.a} is the smallest configuration not worse than the baseline {self.b} by more than {margin} ({level}): {shown}"
        if self.kind == "beats":
            return f"{self.a} beats {self.b} by {shown}"
        if self.kind == "equivalent":
            return f"{self.a} and {self.b} are equivalent within {margin}: {shown}"
        more = "more than 1000" if self.more_seeds is None else f"about {self.more_seeds}"
        return f"undecided: {more} more seeds of {self.a} and {self.b} would decide it (observed {shown}, margin {margin})"


def decide(table: pd.DataFrame, budget: int, pick: str, baseline_key: str | None, higher_is_better: bool,
           delta: float, level: float = LEVEL) -> list[Decision]:
    """Every decided statement at `budget` about the pick (a `summarize` table's `arch`), else one undecided.

    In order: the smallest configuration within the budget (no larger than the baseline, best mean
    first among equal sizes) not worse than the baseline by more than `delta`; the pick beating the
    baseline, or the baseline beating the pick (the budget costs accuracy); the pick beating every other configuration within the budget (said against the closest);
    the smallest configuration no larger than the pick equivalent to it. Comparisons against the
    baseline are simultaneous over the candidates compared with it, those against the pick over the
    others within the budget. Undecided: the pair (the pick and the runner-up, or the baseline) that
    the fewest more seeds would decide, from the observed variance.
    """
    groups, noise = groups_of(table), table.attrs["noise"]
    sign = 1.0 if higher_is_better else -1.0
    inside = table[table["params"] <= budget].assign(_score=lambda t: sign * t["mean"])
    inside = inside.sort_values(["params", "_score"], ascending=[True, False])
    others = [k for k in inside["arch"] if k != pick]

    def cmp(a: str, b: str, family: int) -> Comparison:
        return compare(groups[a], groups[b], higher_is_better, level, noise.prior(a, b), family)

    out: list[Decision] = []
    candidates: list[str] = []
    if baseline_key in groups:
        base_params = int(table.loc[table["arch"] == baseline_key, "params"].iloc[0])
        smaller = [k for k, p in zip(inside["arch"], inside["params"]) if k != baseline_key and p <= base_params]
        candidates = smaller + ([pick] if pick != baseline_key and pick not in smaller else [])
        for key in smaller:
            c = cmp(key, baseline_key, len(candidates))
            if c.non_inferior(delta):
                out.append(Decision("non-inferior", key, baseline_key, c, delta))
                break
        if pick != baseline_key and (c := cmp(pick, baseline_key, len(candidates))).beats():
            out.append(Decision("beats", pick, baseline_key, c, delta))
        elif pick != baseline_key and c.worse():  # the budget costs accuracy: the baseline beats the best within it
            out.append(Decision("beats", baseline_key, pick, cmp(baseline_key, pick, len(candidates)), delta))
    versus = {k: cmp(pick, k, len(others)) for k in others}
    if versus and all(c.beats() for c in versus.values()):
        closest = min(versus, key=lambda k: versus[k].diff)
        out.append(Decision("beats", pick, closest, versus[closest], delta))
    pick_params = int(table.loc[table["arch"] == pick, "params"].iloc[0])
    same = [k for k in others if int(table.loc[table["arch"] == k, "params"].iloc[0]) <= pick_params and versus[k].equivalent(delta)]
    if same:
        out.append(Decision("equivalent", same[0], pick, versus[same[0]], delta))
    if out or not others and not candidates:
        return out
    pairs = []
    if others:
        runner = min(versus, key=lambda k: versus[k].diff)
        pairs.append((pick, runner, versus[runner]))
    if baseline_key in groups and pick != baseline_key:
        pairs.append((pick, baseline_key, cmp(pick, baseline_key, len(candidates))))
    need = [(p[2].seeds_to_decide(delta), p) for p in pairs]
    more, (a, b, c) = min(need, key=lambda x: float("inf") if x[0] is None else x[0])
    return [Decision("undecided", a, b, c, delta, more)]
