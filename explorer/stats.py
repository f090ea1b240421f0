"""Replicates of a configuration: their aggregation, intervals, paired comparisons and front probability.

Fronts, recommendations, status and dashboards read per-configuration statistics from here, never raw
trials. Replicate `s` of every configuration trains with the same seed (the same data order), so two
configurations are compared on the seeds they share, as paired differences.

Intervals are Student t intervals, not bootstrap ones: a study has 1 to 6 replicates of a
configuration, and a percentile bootstrap of three values can never reach past their range, so it is
far too narrow there; the t interval is exact under normal noise at any n. At such n one configuration's
own variance is itself very noisy (with 2 replicates its t interval is ±12.7 standard errors), so each
variance is moderated towards a prior fitted to the other configurations' variances, as limma's
squeezeVar does for gene-wise variances (Smyth 2004): the sample variances are taken as scaled
inverse-chi-square draws around `s0²` with `d0` prior degrees of freedom, both fitted by the method of
moments on the log variances (`fit_prior`), and `s² = (d0·s0² + (n-1)·own) / (d0 + n-1)` with
`d0 + n - 1` degrees of freedom. The configuration's own variance is left out of its prior (else a
noisy one pulls its own prior up and reads as confirmed). Where the variances differ, the prior would
shrink the noisiest configurations' intervals the most: when Bartlett's test of equal variances
rejects at `HOMOGENEITY` or the fitted `d0` is below `MIN_PRIOR_DOF`, every interval is the
configuration's own (`NoiseModel.prior` is None), and so is that of a configuration whose own variance
is improbably large under its prior (an F test at `OUTLIER`; these settings were chosen on
digits-vit's noise, bench/coverage.py checks them on digits-wide and a heteroscedastic case too). With no noise model the intervals are the textbook
ones scipy gives. bench/coverage.py measures the coverage on each shipped table's noise.

The probability that a configuration is on the Pareto front is the share of posterior draws of every
configuration's mean (mean + se·T, T ~ t(dof)) whose front it is on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import special  # not scipy.stats: importing it takes ~1 s (see _bartlett)

from explorer.pareto import pareto_mask

LEVEL = 0.95
HOMOGENEITY = 0.05  # Bartlett p-value below which the variances count as different: no shared prior
MIN_PRIOR_DOF = 2.0  # a fitted prior weaker than this says little and shrinks the noisy ones: per-configuration instead
MIN_GROUPS = 3  # replicated configurations (besides the one judged) needed to fit a prior's spread
OUTLIER = 0.1  # a configuration whose variance exceeds its prior's (1 - OUTLIER) F quantile keeps its own interval
FRONT_DRAWS = 2000


@dataclass(frozen=True)
class Pooled:
    """A prior for a configuration's variance: `s0²` and its weight `d0` in degrees of freedom (explorer.stats.fit_prior)."""

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


def _trigamma_inverse(x: float) -> float:
    """y with trigamma(y) = x, by Newton's method as limma's trigammaInverse does."""
    if x > 1e7:
        return 1.0 / np.sqrt(x)
    if x < 1e-6:
        return 1.0 / x
    y = 0.5 + 1.0 / x
    for _ in range(50):
        tri = float(special.polygamma(1, y))
        step = tri * (1 - tri / x) / float(special.polygamma(2, y))
        y += step
        if -step / y < 1e-8:
            break
    return y


def fit_prior(variances: Sequence[float], dofs: Sequence[float]) -> Pooled | None:
    """The scaled inverse-chi-square prior (`s0²`, `d0`) of sample variances with `dofs` degrees of freedom:
    limma's fitFDist, moments of the log variances (`d0` infinite: the spread is all sampling noise)."""
    d = np.asarray(dofs, float)
    x = np.asarray(variances, float)
    keep = d > 0
    d, x = d[keep], x[keep]
    if len(x) < 2:
        return None
    floor = np.median(x) if np.median(x) > 0 else (x[x > 0].min() if (x > 0).any() else 1.0)
    z = np.log(np.maximum(x, 1e-5 * floor))  # a zero variance (a collapsed run) has no log
    e = z - special.digamma(d / 2) + np.log(d / 2)
    spread = float(np.var(e, ddof=1) - np.mean(special.polygamma(1, d / 2)))
    if spread <= 0:
        return Pooled(float(np.exp(e.mean())), float("inf"))
    d0 = 2 * _trigamma_inverse(spread)
    return Pooled(float(np.exp(e.mean() + special.digamma(d0 / 2) - np.log(d0 / 2))), float(d0))


class NoiseModel:
    """The study's replicate noise: each configuration's prior variance from the others' (empirical Bayes).

    `prior(*keys)` is the prior for a configuration (or a pair), fitted without their own variances;
    None where there is no usable prior (too few replicated configurations, or variances that differ),
    and then intervals are per configuration.
    """

    def __init__(self, groups: dict[str, Sequence[float]]):
        self.groups = {k: np.asarray(v, float) for k, v in groups.items()}
        many = [v for v in self.groups.values() if len(v) >= 2]
        self.bartlett = _bartlett(many)
        self.homogeneous = not (self.bartlett < HOMOGENEITY)
        self._cache: dict[frozenset[str], Pooled | None] = {}

    def prior(self, *leave_out: str) -> Pooled | None:
        key = frozenset(leave_out)
        if key not in self._cache:
            self._cache[key] = self._fit(key)
        return self._cache[key]

    def _fit(self, leave_out: frozenset[str]) -> Pooled | None:
        if not self.homogeneous:
            return None
        others = [v for k, v in self.groups.items() if k not in leave_out and len(v) >= 2]
        if not others:
            return None
        dof = float(sum(len(v) - 1 for v in others))
        if len(others) < MIN_GROUPS:  # too few to fit a spread: their pooled variance, worth its degrees of freedom
            prior = Pooled(sum(float(np.var(v, ddof=1)) * (len(v) - 1) for v in others) / dof, dof)
        else:
            prior = fit_prior([float(np.var(v, ddof=1)) for v in others], [len(v) - 1 for v in others])
            if prior is None or prior.dof < MIN_PRIOR_DOF:
                return None
            prior = Pooled(prior.var, min(prior.dof, dof))
        if prior.var <= 0:
            return None
        for key in leave_out:
            own = self.groups[key]
            if len(own) >= 2 and float(np.var(own, ddof=1)) > prior.var * special.fdtri(len(own) - 1, prior.dof, 1 - OUTLIER):
                return None
        return prior


def _bartlett(groups: Sequence[np.ndarray]) -> float:
    """Bartlett's p-value for equal variances over the groups that vary (NaN under two): a group of
    identical values is a collapsed run, not a measured variance, and would make every test reject.
    scipy.stats.bartlett's statistic (tests check it against that), with the chi-square tail from
    scipy.special: importing scipy.stats costs every command ~1 s."""
    varying = [np.asarray(g, float) for g in groups if np.var(g) > 0]
    if len(varying) < 2:
        return float("nan")
    n = np.array([len(g) for g in varying], float)
    var = np.array([np.var(g, ddof=1) for g in varying])
    k, total = len(varying), n.sum()
    pooled = float(np.sum((n - 1) * var) / (total - k))
    stat = ((total - k) * np.log(pooled) - np.sum((n - 1) * np.log(var))) / (
        1 + (np.sum(1 / (n - 1)) - 1 / (total - k)) / (3 * (k - 1)))
    return float(special.chdtrc(k - 1, stat))


def _moderated(own_var: float, n: int, prior: Pooled | None, prior_scale: float = 1.0) -> tuple[float, float]:
    """(variance, dof) of one group of `n`: its own, or moderated towards `prior_scale * prior.var`."""
    own_dof = n - 1
    if prior is None:
        return (own_var, float(own_dof)) if own_dof > 0 else (float("nan"), 0.0)
    if not np.isfinite(prior.dof):
        return prior_scale * prior.var, float("inf")
    d0 = prior.dof
    var = (d0 * prior_scale * prior.var + own_dof * (own_var if own_dof > 0 else 0.0)) / (d0 + own_dof)
    return var, d0 + own_dof


def mean_interval(values: Sequence[float], level: float = LEVEL, prior: Pooled | None = None) -> Interval:
    """The mean of `values` and its t interval (moderated towards `prior` when given; none from one value alone)."""
    x = np.asarray(values, float)
    n = len(x)
    var, dof = _moderated(float(np.var(x, ddof=1)) if n > 1 else 0.0, n, prior)
    se = float(np.sqrt(var / n)) if dof > 0 else float("nan")
    half = float(special.stdtrit(dof, 0.5 + level / 2) * se) if dof > 0 else float("nan")
    return Interval(float(np.mean(x)), half, dof, se)


@dataclass(frozen=True)
class Comparison:
    """`a - b` on the seeds both have (paired), its interval, and the probability that a is the better.

    The interval is at `level`, simultaneous over `family` comparisons (Bonferroni: each at
    `1 - (1 - level) / family`) when the answer picks among that many; every decision below reads off
    that one interval: beats (it excludes 0), non-inferior within `delta` (its lower end is above
    `-delta`), equivalent within `delta` (it lies inside ±delta: two one-sided tests, TOST).
    """

    diff: float
    half: float
    n: int  # shared seeds (0: unpaired)
    p_better: float  # posterior P(a better than b) under a flat prior; NaN without an interval
    se: float = float("nan")
    dof: float = float("nan")
    level: float = LEVEL
    family: int = 1

    @property
    def lo(self) -> float:
        return self.diff - self.half

    @property
    def hi(self) -> float:
        return self.diff + self.half

    @property
    def tied(self) -> bool:
        """No evidence either way at the interval's level (always, without an interval)."""
        return not np.isfinite(self.half) or abs(self.diff) <= self.half

    def beats(self) -> bool:
        return bool(np.isfinite(self.half) and self.lo > 0)

    def worse(self) -> bool:
        return bool(np.isfinite(self.half) and self.hi < 0)

    def non_inferior(self, delta: float) -> bool:
        """a is not worse than b by more than `delta`."""
        return bool(np.isfinite(self.half) and self.lo > -delta)

    def equivalent(self, delta: float) -> bool:
        """a and b differ by less than `delta` either way."""
        return bool(np.isfinite(self.half) and self.lo > -delta and self.hi < delta)

    def decided(self, delta: float) -> bool:
        return self.beats() or self.worse() or self.equivalent(delta)

    def seeds_to_decide(self, delta: float, cap: int = 1000) -> int | None:
        """About how many more shared seeds would decide it (beats, worse or equivalent) if the observed
        difference and variance held: a power calculation on the interval's half-width; None past `cap`."""
        if self.decided(delta):
            return 0
        n = max(self.n, 1)
        if not (np.isfinite(self.se) and np.isfinite(self.dof) and self.se > 0):
            return 1  # one seed each: a second gives the first variance
        sd = self.se * np.sqrt(n)
        need = max(abs(self.diff), delta - abs(self.diff))
        q = 1 - (1 - self.level) / self.family / 2
        for more in range(1, cap + 1):
            if special.stdtrit(self.dof + more, q) * sd / np.sqrt(n + more) < need:
                return more
        return None

    def words(self, a: str, b: str, unit: float = 100.0, what: str = "points") -> str:
        """'a beats b: +2.1 ± 1.0 points (paired, 3 seeds)' or 'no evidence that a beats b: ...'."""
        basis = f"paired over {self.n} seed{'s' if self.n != 1 else ''}" if self.n else "unpaired"
        if not np.isfinite(self.half):
            return f"{a} vs {b}: {unit * self.diff:+.1f} {what} on one seed each: no interval, so no evidence either way"
        simultaneous = f", simultaneous over {self.family} comparisons" if self.family > 1 else ""
        shown = f"{unit * self.diff:+.1f} ± {unit * self.half:.1f} {what} ({basis}, {self.level:.0%} interval{simultaneous})"
        if self.tied:
            return f"no evidence that {a} differs from {b}: tied, difference {shown}"
        return f"{a} beats {b}: {shown}" if self.diff > 0 else f"{a} is worse than {b}: {shown}"


def compare(a: dict[int, float], b: dict[int, float], higher_is_better: bool = True, level: float = LEVEL,
            prior: Pooled | None = None, family: int = 1) -> Comparison:
    """Compare two configurations' replicates, `{seed: metric}` each, signed so that > 0 means `a` is better.

    On shared seeds it is the paired t interval of the differences (scipy's `ttest_rel`); their variance
    is moderated towards twice the prior variance (the variance of a difference of two
    independent runs: conservative where common seeds make the runs agree). With no seed shared, the
    difference of the two means with both standard errors. `family`: the number of comparisons the
    answer chooses among (the interval is simultaneous over them).
    """
    sign = 1.0 if higher_is_better else -1.0
    shared = sorted(a.keys() & b.keys())
    if shared:
        d = sign * (np.array([a[s] for s in shared]) - np.array([b[s] for s in shared]))
        n = len(d)
        var, dof = _moderated(float(np.var(d, ddof=1)) if n > 1 else 0.0, n, prior, prior_scale=2.0)
        se = float(np.sqrt(var / n)) if dof > 0 else float("nan")
        diff = float(d.mean())
    else:
        ia, ib = mean_interval(list(a.values()), level, prior), mean_interval(list(b.values()), level, prior)
        n, diff = 0, sign * (ia.mean - ib.mean)
        se, dof = float(np.hypot(ia.se, ib.se)), min(ia.dof, ib.dof)
    family = max(1, int(family))
    if not dof > 0 or not np.isfinite(se):
        return Comparison(diff, float("nan"), n, float("nan"), level=level, family=family)
    if se == 0:
        return Comparison(diff, 0.0, n, float(diff > 0) if diff != 0 else 0.5, 0.0, dof, level, family)
    half = float(special.stdtrit(dof, 1 - (1 - level) / family / 2) * se)
    return Comparison(diff, half, n, float(special.stdtr(dof, diff / se)), se, dof, level, family)


def summarize(frame: pd.DataFrame, metric: str, objectives: Sequence[tuple[str, str]], level: float = LEVEL,
              draws: int = FRONT_DRAWS, seed: int = 0, first_seed: int = 0) -> pd.DataFrame:
    """One row per configuration from a `trials_frame`'s completed measurements.

    Columns: arch, the dimensions, params (and any other objective, averaged), n, seeds, values (by
    seed), mean (also under the metric's name), std, se, lo, hi (the interval), dof, on_front (the front of means), front_prob, and
    tied_with: for a configuration off the front, the front member dominating it that it is tied with
    (no evidence that either is better), so it is marked rather than hidden. Without any replicate the
    interval columns and front_prob are NaN: a one-seed study has no interval (front_prob is NaN with
    `draws=0` too, for callers that do not need it). A trial stored before seeds existed (no `seed`)
    trained with the study's first seed: it is read as `first_seed`.
    """
    done = frame[frame["state"] == "COMPLETE"].dropna(subset=[metric])
    if "duplicate_of" in done:
        done = done[done["duplicate_of"].isna()]
    if not len(done):
        return pd.DataFrame(columns=["arch", "params", "n", "mean", "std", "lo", "hi", "front_prob", "on_front", "tied_with"])
    directions = dict(objectives)
    higher = directions.get(metric, "maximize") == "maximize"
    seed_of = done["seed"] if "seed" in done else pd.Series(first_seed, index=done.index)
    done = done.assign(seed=seed_of.fillna(first_seed).astype(int)).drop_duplicates(["arch", "seed"])
    groups = {key: dict(zip(g["seed"], g[metric].astype(float))) for key, g in done.groupby("arch", sort=False)}
    noise = NoiseModel({k: list(v.values()) for k, v in groups.items()})
    rows = []
    for key, g in done.groupby("arch", sort=False):
        first = g.iloc[0]
        values = groups[key]
        iv = mean_interval(list(values.values()), level, noise.prior(key))
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
    replicated = bool(np.isfinite(table["se"]).any())
    table["front_prob"] = front_probability(table, metric, objectives, draws, seed) if replicated and draws else np.nan
    table["tied_with"] = _ties(table, groups, metric, objectives, higher, level, noise if replicated else None)
    table.attrs["noise"] = noise
    return table.sort_values(["params", "arch"], ignore_index=True)


def front_probability(table: pd.DataFrame, metric: str, objectives: Sequence[tuple[str, str]],
                      draws: int = FRONT_DRAWS, seed: int = 0) -> np.ndarray:
    """Each configuration's share of posterior draws of the means in which it is on the Pareto front."""
    rng = np.random.default_rng(seed)
    names, dirs = [n for n, _ in objectives], [d for _, d in objectives]
    base = table[names].to_numpy(float)
    col = names.index(metric)
    dof = np.clip(table["dof"].to_numpy(float), 1e-9, 1e9)  # an infinite prior weight: normal draws
    se = table["se"].to_numpy(float)
    with np.errstate(invalid="ignore"):  # a configuration without an interval is drawn at its mean
        drawn = base[:, col] + np.where(np.isfinite(se), rng.standard_t(dof, size=(draws, len(table))) * se, 0.0)
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
          higher: bool, level: float, noise: NoiseModel | None) -> list[str | None]:
    """For each off-front configuration, the cheapest front member dominating it (its mean at least as good, and
    every other objective) that it is tied with: a cheaper member with a worse mean does not dominate it."""
    front = table[table["on_front"]].sort_values("params")
    out: list[str | None] = []
    for _, row in table.iterrows():
        tied = None
        if not row["on_front"] and noise is not None:
            for _, f in front.iterrows():
                better = f["mean"] >= row["mean"] if higher else f["mean"] <= row["mean"]
                prior = noise.prior(f["arch"], row["arch"])
                if better and _dominates(f, row, metric, objectives) and compare(groups[f["arch"]], groups[row["arch"]], higher, level, prior).tied:
                    tied = f["arch"]
                    break
        out.append(tied)
    return out


def groups_of(table: pd.DataFrame) -> dict[str, dict[int, float]]:
    """{arch: {seed: metric}} from a `summarize` table."""
    return {row.arch: dict(zip(row.seeds, row.values)) for row in table.itertuples()}
