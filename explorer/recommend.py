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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd
from scipy.special import stdtrit  # Student t quantile: scipy.stats takes ~1 s to import

from explorer.errors import ExplorerError
from explorer.decisions import ACCURACY_DELTA, Decision, DecisionSpec, decide
from explorer.stats import Comparison, NoiseModel, compare, groups_of, summarize
from explorer.units import format_count

Candidate = tuple[str, dict[str, Any], int]  # (config key, complete dims, exact params)


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
    pruned: tuple[str, ...] = ()  # configurations within budget that were pruned and never completed

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
        if self.pruned:
            out.append(f"pruned within budget, never completed (a pruned configuration comes back once when the "
                       f"evidence against it weakens): {', '.join(self.pruned)}")
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
