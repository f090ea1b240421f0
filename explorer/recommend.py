"""The best (layers, heads[, mlp]) split for a parameter budget: measured, or predicted and marked so.

Measured: the configuration with the best mean over its replicate seeds within the budget, with its
interval, the baseline as a paired difference, and a decision (`decide`): one of "X is the smallest
configuration not worse than the baseline by more than delta", "X beats Y by d ± h", "X and Y are
equivalent within delta", or "undecided: about N more seeds of X and Y would decide it". The pick is the
best of many, so every comparison it makes is at a level simultaneous over the comparisons it chooses
among (Bonferroni, explorer.stats.compare's `family`): with 24 equal configurations a per-comparison 95%
interval says the best "beats" the baseline in 13% of studies (bench/coverage.py). Configurations tied
with the pick are counted, and listed only on request. Predicted: when a feasible configuration inside the budget was never run, a
least-squares surface fitted on every measurement (each replicate a row, so the replicate noise is in
its residual) at fixed width,

    metric ~ a + b*log(layers) + c*log(heads) + d*log(layers)*log(heads)   [+ e*log(mlp)]

predicts it with a 95% prediction interval; it is recommended only when even the interval's
worse end beats the measured best, and only inside the (layers, heads) range the study covered.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field
from scipy.special import stdtrit  # Student t quantile: scipy.stats takes ~1 s to import

from explorer.errors import ExplorerError
from explorer.stats import LEVEL, Comparison, NoiseModel, compare, groups_of, summarize
from explorer.units import format_count, parse_count

Candidate = tuple[str, dict[str, Any], int]  # (config key, complete dims, exact params)

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


@dataclass(frozen=True)
class Surface:
    """The fitted depth x heads model at one width; `predict` gives mean and 95% half-width."""

    width: int
    coef: np.ndarray
    xtx_inv: np.ndarray
    sigma: float  # residual standard error
    dof: int
    uses_mlp: bool
    metric: str

    @staticmethod
    def features(layers: np.ndarray, heads: np.ndarray, mlp: np.ndarray, uses_mlp: bool) -> np.ndarray:
        ll, lh = np.log(np.asarray(layers, float)), np.log(np.asarray(heads, float))
        cols = [np.ones_like(ll), ll, lh, ll * lh] + ([np.log(np.asarray(mlp, float))] if uses_mlp else [])
        return np.column_stack(cols)

    def predict(self, layers: float, heads: float, mlp: float) -> tuple[float, float]:
        x = self.features(np.array([layers]), np.array([heads]), np.array([mlp]), self.uses_mlp)[0]
        se = self.sigma * math.sqrt(1.0 + float(x @ self.xtx_inv @ x))
        return float(x @ self.coef), float(stdtrit(self.dof, 0.975) * se)

    def describe(self) -> str:
        terms = "a + b*log(layers) + c*log(heads) + d*log(layers)*log(heads)"
        terms += " + e*log(mlp)" if self.uses_mlp else ""
        return (
            f"{self.metric} ~ {terms} at width {self.width} (least squares, "
            f"{self.dof + len(self.coef)} trials, residual s.e. {self.sigma:.4g}, 95% prediction interval)"
        )


def fit_surface(df: pd.DataFrame, width: int, metric: str = "accuracy") -> Surface | None:
    """Fit on the completed measurements at `width`; None when they cannot pin the surface down.

    Trials answered from storage (`duplicate_of`) are no measurement and are dropped; the surface
    needs two more distinct configurations than it has coefficients.
    """
    rows = _measurements(df)
    rows = rows[rows["width"] == width].dropna(subset=[metric, "layers", "heads"])
    uses_mlp = rows["mlp"].nunique() > 1
    x = Surface.features(rows["layers"], rows["heads"], rows["mlp"], uses_mlp)
    y = rows[metric].to_numpy(float)
    p = x.shape[1]
    if rows["arch"].nunique() < p + 2 or np.linalg.matrix_rank(x) < p:
        return None
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    dof = len(y) - p
    sigma = math.sqrt(float(np.sum((y - x @ coef) ** 2)) / dof)
    return Surface(int(width), coef, np.linalg.pinv(x.T @ x), sigma, dof, uses_mlp, metric)


@dataclass(frozen=True)
class Recommendation:
    """What to build for `budget`, how sure we are, and what it beats."""

    budget: int
    key: str
    layers: int
    heads: int
    width: int | None
    mlp: int | None
    params: int
    metric: str
    value: float  # the mean over its seeds (measured) or the surface's prediction
    kind: Literal["measured", "predicted"]
    trial: int | None = None  # the first trial that measured it
    n: int = 0  # seeds behind `value` (measured)
    half: float = math.nan  # 95% half-width of `value`: the t interval of the mean (NaN: one seed, no interval)
    uncertainty: float | None = None  # 95% prediction half-width (predicted only)
    model: str | None = None  # the fitted surface, in words (predicted only)
    measured_key: str | None = None  # the measured best it was compared against (predicted only)
    measured_value: float | None = None
    tied: tuple[str, ...] = ()  # measured configurations within budget not distinguished from it, by params then mean
    tied_params: tuple[int, ...] = ()
    equivalent: tuple[str, ...] = ()  # those of `tied` equivalent to it within `delta`
    decisions: tuple[Decision, ...] = ()  # what is decided at this budget (one undecided entry when nothing is)
    delta: float = ACCURACY_DELTA
    list_ties: bool = False  # lines() lists the tied configurations, not only their count
    baseline_key: str | None = None
    baseline_value: float | None = None
    baseline_params: int | None = None
    baseline: Comparison | None = None  # it against the baseline, > 0 meaning better
    verify: tuple[str, ...] = ()  # study configs around it: a follow-up study runs these
    higher_is_better: bool = True
    beyond: tuple[str, ...] = ()  # the shape law's answer where the budget passes the measured range (explorer.extrapolate)

    @property
    def margin(self) -> float | None:
        """value - baseline value, signed so > 0 means better (paired over shared seeds where measured)."""
        return None if self.baseline is None else self.baseline.diff

    def lines(self) -> list[str]:
        """The recommendation as a few lines for a terminal: never "beats" without an interval excluding 0."""
        shown = f"{self.metric} {self.value:.4g}"
        if self.kind == "predicted":
            shown += f" ± {self.uncertainty:.2g} (predicted, not measured)"
        elif math.isfinite(self.half):
            shown += f" ± {self.half:.2g} (measured: mean of {self.n} seeds, 95% t interval; first trial {self.trial})"
        else:
            shown += f" (measured, trial {self.trial}; one seed, no interval: set budget.seeds for replicates)"
        out = [
            f"budget {format_count(self.budget)}: {self.key} (mlp={self.mlp}, width={self.width}), "
            f"{format_count(self.params)} params, {shown}"
        ]
        if self.kind == "predicted":
            out.append(f"model: {self.model}")
            if self.measured_key is not None:
                out.append(f"best measured within budget: {self.measured_key}, {self.measured_value:.4g}")
        unit, what = (100.0, "points") if self.higher_is_better else (1.0, self.metric)
        out += [d.words(unit, what) for d in self.decisions]
        if self.tied:
            smaller = (f"; the smallest: {self.tied[0]}, {format_count(self.tied_params[0])} params"
                       if self.tied_params[0] < self.params else "; none of them is smaller")
            out.append(f"{len(self.equivalent)} configurations within budget equivalent to {self.key} within "
                       f"{unit * self.delta:.2g} {what}; {len(self.tied) - len(self.equivalent)} more not distinguished "
                       f"from it{smaller}")
            if self.list_ties:
                listed = ", ".join(f"{k} ({format_count(p)}{', equivalent' if k in self.equivalent else ''})"
                                   for k, p in zip(self.tied, self.tied_params))
                out.append(f"not distinguished from it: {listed}")
        elif self.kind == "measured" and math.isfinite(self.half):
            out.append("every other configuration within budget is distinguished from it")
        if self.baseline_key is not None and self.baseline_value is None:
            out.append(f"baseline {self.baseline_key} has no completed trial in this study")
        elif self.baseline is not None and self.key == self.baseline_key:
            out.append(f"it is the baseline ({format_count(self.baseline_params or 0)} params)")
        elif self.baseline is not None:
            out.append(f"baseline {self.baseline_key} ({format_count(self.baseline_params or 0)} params, {self.metric} "
                       f"{self.baseline_value:.4g}): " + self.baseline.words(self.key, "the baseline", unit, what))
        around = [k for k in self.verify if k != self.key]
        if around:
            out.append(f"to check it, measure its neighbours too (`explorer recommend ... --verify` queues them): {'; '.join(around)}")
        return out + list(self.beyond)


def _measurements(df: pd.DataFrame) -> pd.DataFrame:
    """Completed trials that measured something: not duplicates answered from storage."""
    done = df[df["state"] == "COMPLETE"]
    return done[done["duplicate_of"].isna()] if "duplicate_of" in done else done


def _dims(row: dict[str, Any], name: str) -> int | None:
    value = row.get(name)
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else int(value)


def _known(done: pd.DataFrame, candidates: Sequence[Candidate]) -> pd.DataFrame:
    """Every config the study measured or could run: arch, dims and params."""
    cols = ["arch", "layers", "heads", "width", "mlp", "params"]
    rows = done[cols].to_dict("records") + [
        {"arch": k, **{d: dims.get(d) for d in cols[1:5]}, "params": p} for k, dims, p in candidates
    ]
    return pd.DataFrame(rows, columns=cols).drop_duplicates("arch")


def _neighbours(key: str, known: pd.DataFrame, budget: int) -> tuple[str, ...]:
    """Configs of `known` one step away in layers and/or heads at the same width and mlp."""
    known = known.fillna({"width": -1, "mlp": -1})
    me = known[known["arch"] == key].iloc[0]
    same = known[(known["width"] == me["width"]) & (known["mlp"] == me["mlp"]) & (known["params"] <= budget)]
    step = {}
    for dim in ("layers", "heads"):
        values = sorted(same[dim].unique())
        rank = {v: i for i, v in enumerate(values)}
        step[dim] = (same[dim].map(rank) - rank[me[dim]]).abs()
    near = same[(step["layers"] <= 1) & (step["heads"] <= 1)].sort_values(["layers", "heads"])
    return tuple(dict.fromkeys(near["arch"]))


def _predictions(
    done: pd.DataFrame, candidates: Sequence[Candidate], budget: int, metric: str
) -> list[dict[str, Any]]:
    """Surface predictions for the unmeasured candidates within budget, inside the studied range."""
    out, surfaces = [], {}
    measured = set(done["arch"])
    for key, dims, params in candidates:
        if key in measured or params > budget or dims.get("width") is None:
            continue
        at_width = done[done["width"] == dims["width"]]
        if not (
            at_width["layers"].min() <= dims["layers"] <= at_width["layers"].max()
            and at_width["heads"].min() <= dims["heads"] <= at_width["heads"].max()
        ):
            continue
        width = int(dims["width"])
        if width not in surfaces:
            surfaces[width] = fit_surface(done, width, metric)
        if surfaces[width] is None:
            continue
        mean, half = surfaces[width].predict(dims["layers"], dims["heads"], dims.get("mlp") or 1)
        out.append(
            {**dims, "key": key, "arch": key, "params": params, "value": mean, "kind": "predicted",
             "uncertainty": half, "model": surfaces[width].describe()}
        )
    return out


def recommend(
    df: pd.DataFrame,
    budget: int,
    baseline_key: str | None,
    metric: str = "accuracy",
    candidates: Sequence[Candidate] = (),
    higher_is_better: bool = True,
    decision: DecisionSpec | None = None,
    list_ties: bool = False,
) -> Recommendation:
    """Best configuration within `budget` from a `trials_frame`, measured or (marked) predicted.

    `candidates` are the space's feasible configs; those inside the budget that no completed
    trial measured are the ones the fitted surface may predict. `decision` sets the margin and level of
    the decision (`decide`); `list_ties` makes `lines()` list the configurations tied with the pick.
    """
    decision = decision or DecisionSpec()
    sign = 1.0 if higher_is_better else -1.0
    done = _measurements(df).dropna(subset=[metric, "params"])
    direction = "maximize" if higher_is_better else "minimize"
    table = summarize(done, metric, [(metric, direction), ("params", "minimize")], level=decision.level, draws=0)
    groups = groups_of(table)
    noise = table.attrs["noise"]
    first = done.groupby("arch")["number"].min() if len(done) else pd.Series(dtype=int)
    inside = table[table["params"] <= budget]
    measured: dict[str, Any] | None = None
    if len(inside):  # ties: fewer params, then the earlier trial
        best = inside.assign(_score=sign * inside["mean"], number=inside["arch"].map(first))
        best = best.sort_values(["_score", "params", "number"], ascending=[False, True, True]).iloc[0]
        measured = {**best.to_dict(), "key": best["arch"], "value": float(best["mean"]), "kind": "measured",
                    "trial": int(best["number"]), "n": int(best["n"]), "half": float(best["hi"] - best["mean"])}
    predicted = [
        p for p in _predictions(done, candidates, budget, metric)
        if measured is None or sign * p["value"] - p["uncertainty"] > sign * measured["value"]
    ]
    chosen = max(predicted, key=lambda p: sign * p["value"]) if predicted else measured
    if chosen is None:
        raise ExplorerError(
            f"no completed trial or predictable configuration within {format_count(budget)} parameters",
            field="budget",
        )

    delta = decision.margin(higher_is_better, chosen["value"])
    tied: list[tuple[int, float, str]] = []
    equivalent: list[str] = []
    decisions: list[Decision] = []
    family = max(1, len(inside) - 1)
    if chosen["kind"] == "measured":
        noise: NoiseModel = table.attrs["noise"]
        for row in inside.itertuples():
            if row.arch == chosen["key"]:
                continue
            c = compare(groups[chosen["key"]], groups[row.arch], higher_is_better, decision.level,
                        noise.prior(chosen["key"], row.arch), family)
            if math.isfinite(c.half) and c.tied:
                tied.append((int(row.params), -sign * row.mean, row.arch))
                if c.equivalent(delta):
                    equivalent.append(row.arch)
        decisions = decide(table, budget, chosen["key"], baseline_key, higher_is_better, delta, decision.level)
    tied.sort()

    base_value = base_params = comparison = None
    if baseline_key in groups:
        base = table[table["arch"] == baseline_key].iloc[0]
        base_value, base_params = float(base["mean"]), int(base["params"])
        if chosen["kind"] == "measured":
            against = sum(1 for p, k in zip(inside["params"], inside["arch"]) if k != baseline_key and p <= base_params)
            against += chosen["params"] > base_params
            comparison = compare(groups[chosen["key"]], groups[baseline_key], higher_is_better, decision.level,
                                 noise.prior(chosen["key"], baseline_key), max(1, against))
        else:  # a prediction against a measured mean: unpaired, both uncertainties
            half = math.hypot(chosen["uncertainty"], float(base["hi"] - base["mean"]) if math.isfinite(base["hi"]) else 0.0)
            comparison = Comparison(sign * (chosen["value"] - base_value), half, 0, math.nan)
    elif baseline_key is not None:
        base_params = next((p for k, _, p in candidates if k == baseline_key), None)

    prior = measured if chosen["kind"] == "predicted" else None
    return Recommendation(
        budget=int(budget),
        key=str(chosen["key"]),
        layers=int(chosen["layers"]),
        heads=int(chosen["heads"]),
        width=_dims(chosen, "width"),
        mlp=_dims(chosen, "mlp"),
        params=int(chosen["params"]),
        metric=metric,
        value=float(chosen["value"]),
        kind=chosen["kind"],
        trial=chosen.get("trial"),
        n=int(chosen.get("n", 0)),
        half=float(chosen.get("half", math.nan)),
        uncertainty=chosen.get("uncertainty"),
        model=chosen.get("model"),
        measured_key=prior["key"] if prior else None,
        measured_value=prior["value"] if prior else None,
        baseline_key=baseline_key,
        baseline_value=base_value,
        tied=tuple(k for _, _, k in tied),
        tied_params=tuple(p for p, _, _ in tied),
        equivalent=tuple(k for _, _, k in tied if k in equivalent),
        decisions=tuple(decisions),
        delta=delta,
        list_ties=list_ties,
        higher_is_better=higher_is_better,
        baseline_params=base_params,
        baseline=comparison,
        verify=_neighbours(str(chosen["key"]), _known(done, candidates), budget),
    )
