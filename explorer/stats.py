"""Replicates of a configuration: their aggregation, intervals, paired comparisons and front probability.

Fronts, recommendations, status and dashboards read per-configuration statistics from here, never raw
trials. Replicate `s` of every configuration trains with the same seed (the same data order), so two
configurations are compared on the seeds they share, as paired differences.

Intervals are Student t intervals, not bootstrap ones: a study has 1 to 6 replicates of a
configuration, and a percentile bootstrap of three values can never reach past their range, so it is
far too narrow there; the t interval is exact under normal noise at any n. At such n one configuration's
own variance is itself very noisy (with 2 replicates its t interval is ±12.7 standard errors), so when
the study has replicates elsewhere each variance is moderated towards the study's pooled replicate
variance, as limma does for gene-wise variances (Smyth 2004): `s² = (d0·pooled + (n-1)·own) / (d0 + n-1)`
with `d0 = PRIOR_DOF` (capped at the pooled degrees of freedom) and `d0 + n - 1` degrees of freedom.
With no pooled variance (`pooled=None`) the intervals are the textbook ones scipy gives.

The probability that a configuration is on the Pareto front is the share of posterior draws of every
configuration's mean (mean + se·T, T ~ t(dof)) whose front it is on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.special import stdtr, stdtrit  # Student t cdf and quantile: scipy.stats takes ~1 s to import

from explorer.pareto import pareto_mask

LEVEL = 0.95
PRIOR_DOF = 4.0  # weight of the pooled variance, in degrees of freedom: a configuration's own variance counts as much from 5 replicates on
FRONT_DRAWS = 2000


@dataclass(frozen=True)
class Pooled:
    """The study's replicate variance: pooled within-configuration variance and its degrees of freedom."""

    var: float
    dof: float


@dataclass(frozen=True)
class Interval:
    mean: float
    half: float  # half-width; NaN where there is no interval
    dof: float
    se: float

    @property
    def lo(self) -> float:
        return self.mean - self.half

    @property
    def hi(self) -> float:
        return self.mean + self.half


def pooled_variance(groups: Sequence[Sequence[float]]) -> Pooled | None:
    """Within-group variance pooled over the groups with at least two values; None if none has."""
    dof = sum(len(g) - 1 for g in groups if len(g) >= 2)
    if dof == 0:
        return None
    ss = sum(float(np.sum((np.asarray(g, float) - np.mean(g)) ** 2)) for g in groups if len(g) >= 2)
    return Pooled(ss / dof, float(dof))


def _moderated(own_var: float, n: int, pooled: Pooled | None, prior_scale: float = 1.0) -> tuple[float, float]:
    """(variance, dof) of one group of `n`: its own, or moderated towards `prior_scale * pooled.var`."""
    own_dof = n - 1
    if pooled is None:
        return (own_var, float(own_dof)) if own_dof > 0 else (float("nan"), 0.0)
    d0 = min(PRIOR_DOF, pooled.dof)
    var = (d0 * prior_scale * pooled.var + own_dof * (own_var if own_dof > 0 else 0.0)) / (d0 + own_dof)
    return var, d0 + own_dof


def mean_interval(values: Sequence[float], level: float = LEVEL, pooled: Pooled | None = None) -> Interval:
    """The mean of `values` and its t interval (moderated by `pooled` when given; none from one value alone)."""
    x = np.asarray(values, float)
    n = len(x)
    var, dof = _moderated(float(np.var(x, ddof=1)) if n > 1 else 0.0, n, pooled)
    se = float(np.sqrt(var / n)) if dof > 0 else float("nan")
    half = float(stdtrit(dof, 0.5 + level / 2) * se) if dof > 0 else float("nan")
    return Interval(float(np.mean(x)), half, dof, se)


@dataclass(frozen=True)
class Comparison:
    """`a - b` on the seeds both have (paired), its interval, and the probability that a is the better."""

    diff: float
    half: float
    n: int  # shared seeds (0: unpaired)
    p_better: float  # posterior P(a better than b) under a flat prior; NaN without an interval

    @property
    def tied(self) -> bool:
        """No evidence either way at the interval's level (always, without an interval)."""
        return not np.isfinite(self.half) or abs(self.diff) <= self.half

    def words(self, a: str, b: str, unit: float = 100.0, what: str = "points") -> str:
        """'a beats b: +2.1 ± 1.0 points (paired, 3 seeds)' or 'no evidence that a beats b: ...'."""
        basis = f"paired over {self.n} seeds" if self.n else "unpaired"
        if not np.isfinite(self.half):
            return f"{a} vs {b}: {unit * self.diff:+.1f} {what} on one seed each: no interval, so no evidence either way"
        shown = f"{unit * self.diff:+.1f} ± {unit * self.half:.1f} {what} ({basis}, {LEVEL:.0%} interval)"
        if self.tied:
            return f"no evidence that {a} differs from {b}: tied, difference {shown}"
        return f"{a} beats {b}: {shown}" if self.diff > 0 else f"{a} is worse than {b}: {shown}"


def compare(a: dict[int, float], b: dict[int, float], higher_is_better: bool = True, level: float = LEVEL,
            pooled: Pooled | None = None) -> Comparison:
    """Compare two configurations' replicates, `{seed: metric}` each, signed so that > 0 means `a` is better.

    On shared seeds it is the paired t interval of the differences (scipy's `ttest_rel`); their variance
    is moderated towards twice the pooled replicate variance (the variance of a difference of two
    independent runs: conservative where common seeds make the runs agree). With no seed shared, the
    difference of the two means with both standard errors.
    """
    sign = 1.0 if higher_is_better else -1.0
    shared = sorted(a.keys() & b.keys())
    if shared:
        d = sign * (np.array([a[s] for s in shared]) - np.array([b[s] for s in shared]))
        n = len(d)
        var, dof = _moderated(float(np.var(d, ddof=1)) if n > 1 else 0.0, n, pooled, prior_scale=2.0)
        se = float(np.sqrt(var / n)) if dof > 0 else float("nan")
        diff = float(d.mean())
    else:
        ia, ib = mean_interval(list(a.values()), level, pooled), mean_interval(list(b.values()), level, pooled)
        n, diff = 0, sign * (ia.mean - ib.mean)
        se, dof = float(np.hypot(ia.se, ib.se)), min(ia.dof, ib.dof)
    if not dof > 0 or not np.isfinite(se):
        return Comparison(diff, float("nan"), n, float("nan"))
    if se == 0:
        return Comparison(diff, 0.0, n, float(diff > 0) if diff != 0 else 0.5)
    half = float(stdtrit(dof, 0.5 + level / 2) * se)
    return Comparison(diff, half, n, float(stdtr(dof, diff / se)))


def summarize(frame: pd.DataFrame, metric: str, objectives: Sequence[tuple[str, str]], level: float = LEVEL,
              draws: int = FRONT_DRAWS, seed: int = 0) -> pd.DataFrame:
    """One row per configuration from a `trials_frame`'s completed measurements.

    Columns: arch, the dimensions, params (and any other objective, averaged), n, seeds, values (by
    seed), mean (also under the metric's name), std, se, lo, hi (the interval), dof, on_front (the front of means), front_prob, and
    tied_with: for a configuration off the front, the front member dominating it that it is tied with
    (no evidence that either is better), so it is marked rather than hidden. Without any replicate the
    interval columns and front_prob are NaN: a one-seed study has no interval (front_prob is NaN with
    `draws=0` too, for callers that do not need it).
    """
    done = frame[frame["state"] == "COMPLETE"].dropna(subset=[metric])
    if "duplicate_of" in done:
        done = done[done["duplicate_of"].isna()]
    if not len(done):
        return pd.DataFrame(columns=["arch", "params", "n", "mean", "std", "lo", "hi", "front_prob", "on_front", "tied_with"])
    directions = dict(objectives)
    higher = directions.get(metric, "maximize") == "maximize"
    seed_of = done["seed"] if "seed" in done else pd.Series(0, index=done.index)
    done = done.assign(seed=seed_of.fillna(0).astype(int)).drop_duplicates(["arch", "seed"])
    groups = {key: dict(zip(g["seed"], g[metric].astype(float))) for key, g in done.groupby("arch", sort=False)}
    pooled = pooled_variance([list(v.values()) for v in groups.values()])
    rows = []
    for key, g in done.groupby("arch", sort=False):
        first = g.iloc[0]
        values = groups[key]
        iv = mean_interval(list(values.values()), level, pooled)
        row = {"arch": key, **{d: first[d] for d in ("layers", "heads", "width", "mlp") if d in g},
               **{name: g[name].astype(float).mean() for name in directions if name != metric},
               "params": first["params"], "n": len(values), "seeds": sorted(values),
               "values": [values[s] for s in sorted(values)], "mean": iv.mean, metric: iv.mean,
               "std": float(np.std(list(values.values()), ddof=1)) if len(values) > 1 else float("nan"),
               "se": iv.se, "lo": iv.lo, "hi": iv.hi, "dof": iv.dof}
        rows.append(row)
    table = pd.DataFrame(rows)
    names = [name for name, _ in objectives]
    dirs = [d for _, d in objectives]
    table["on_front"] = pareto_mask(table[names].to_numpy(float), dirs)
    table["front_prob"] = front_probability(table, metric, objectives, draws, seed) if pooled and draws else np.nan
    table["tied_with"] = _ties(table, groups, metric, objectives, higher, level, pooled)
    table.attrs["pooled"] = pooled
    return table.sort_values(["params", "arch"], ignore_index=True)


def front_probability(table: pd.DataFrame, metric: str, objectives: Sequence[tuple[str, str]],
                      draws: int = FRONT_DRAWS, seed: int = 0) -> np.ndarray:
    """Each configuration's share of posterior draws of the means in which it is on the Pareto front."""
    rng = np.random.default_rng(seed)
    names, dirs = [n for n, _ in objectives], [d for _, d in objectives]
    base = table[names].to_numpy(float)
    col = names.index(metric)
    dof = np.maximum(table["dof"].to_numpy(float), 1e-9)
    drawn = base[:, col] + rng.standard_t(dof, size=(draws, len(table))) * np.nan_to_num(table["se"].to_numpy(float))
    if len(names) == 2:
        return _front_share_2d(drawn, base[:, 1 - col], dirs[col] == "maximize", dirs[1 - col] == "maximize")
    hits = np.zeros(len(table))
    for row in drawn:
        values = base.copy()
        values[:, col] = row
        hits += pareto_mask(values, dirs)
    return hits / draws


def _front_share_2d(drawn: np.ndarray, cost: np.ndarray, metric_up: bool, cost_up: bool) -> np.ndarray:
    """`front_probability` for one drawn metric and one fixed objective, all draws at once: a
    configuration is on the front when it is the best of its cost and better than everything cheaper."""
    x = drawn if metric_up else -drawn
    c = -cost if cost_up else cost
    levels, group = np.unique(c, return_inverse=True)
    best = np.full((len(x), len(levels)), -np.inf)
    for g in range(len(levels)):
        best[:, g] = x[:, group == g].max(axis=1)
    before = np.concatenate([np.full((len(x), 1), -np.inf), np.maximum.accumulate(best, axis=1)[:, :-1]], axis=1)
    on = (x >= best[:, group]) & (x > before[:, group])
    return on.mean(axis=0)


def _dominates(a: pd.Series, b: pd.Series, metric: str, objectives: Sequence[tuple[str, str]]) -> bool:
    """Whether `a` is at least as good as `b` in every objective but the metric (means)."""
    for name, direction in objectives:
        if name == metric:
            continue
        if (a[name] > b[name]) if direction == "minimize" else (a[name] < b[name]):
            return False
    return True


def _ties(table: pd.DataFrame, groups: dict[str, dict[int, float]], metric: str, objectives: Sequence[tuple[str, str]],
          higher: bool, level: float, pooled: Pooled | None) -> list[str | None]:
    """For each off-front configuration, the cheapest front member dominating it that it is tied with."""
    front = table[table["on_front"]].sort_values("params")
    out: list[str | None] = []
    for _, row in table.iterrows():
        tied = None
        if not row["on_front"] and pooled is not None:
            for _, f in front.iterrows():
                if _dominates(f, row, metric, objectives) and compare(groups[f["arch"]], groups[row["arch"]], higher, level, pooled).tied:
                    tied = f["arch"]
                    break
        out.append(tied)
    return out


def groups_of(table: pd.DataFrame) -> dict[str, dict[int, float]]:
    """{arch: {seed: metric}} from a `summarize` table."""
    return {row.arch: dict(zip(row.seeds, row.values)) for row in table.itertuples()}
