"""The split for a budget no one measured: a shape law fitted on a study's runs, with bootstrap intervals.

The law (per-dimension power terms, as in Alabdulmohsin et al. 2023, "Getting ViT in Shape", at one
training length) gives the error as a floor, one decreasing power term per shape dimension, and one
increasing term in parameters:

    err = E + sum_d A_d * (x_d / g_d) ** -a_d + B * (params / g_p) ** b        all coefficients >= 0

with err = 1 - metric for a metric where higher is better (accuracy) and err = metric otherwise (a
loss), d over layers, heads, width and MLP, and g the geometric means over the measured configurations
(they only condition the fit). The growth term is SoViT's `beta x^b t^-c` at a fixed training length:
at a fixed number of epochs a larger model is less trained, so the law can have an optimum size
instead of promising that bigger is always better. A budget is a constraint on the candidates; the law
says how to spend it across depth, heads, width and MLP. A dimension with one measured value (one
width, one MLP) cannot be fitted: its term is dropped, and said so. At most 1 + 2 x 5 = 11 coefficients.

The fit is Chinchilla's (Hoffmann et al. 2022, approach 3): a Huber loss on log err (scale
HUBER_SCALE, i.e. about 10% relative error before a residual counts as an outlier), over the
configurations' mean error, from several starts, keeping the best. Intervals are bootstrap intervals
(Besiroglu et al. 2024): each of BOOTSTRAP refits resamples the configurations, then the seeds within
each, and the prediction interval adds a resampled configuration-level residual of the full fit
(so it covers a configuration's mean over the study's seeds, not just the law's mean).

How far beyond the largest measured configuration the answer may go, `REACH`, was chosen on
bench/extrapolate.py (see that file for the figures); past it `answer` refuses in one line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy import optimize, stats

from explorer.errors import ExplorerError
from explorer.formats import split
from explorer.formats import value as shown
from explorer.units import format_count

DIMS = ("layers", "heads", "width", "mlp")
HUBER_SCALE = 0.1
STARTS = 8
BOOTSTRAP = 200
LEVEL = 0.95
REACH = 2.0  # budget / largest measured configuration the answer is validated to: chosen on bench/extrapolate.py
GROWTH_MAX = 1.0  # the growth exponent's bound: steeper, a term too small to see in the data dominates a few-fold past it
ERR_FLOOR = 1e-4  # a mean error of 0 (every seed perfect) is clipped here before its log

Candidate = tuple[str, dict[str, Any], int]  # (config key, complete dims, exact params), as explorer.recommend


@dataclass(frozen=True)
class ShapeModel:
    """The fitted law, its bootstrap refits and residuals; `predict` and `draws` give the metric."""

    metric: str
    higher_is_better: bool
    terms: tuple[str, ...]  # the dimensions with a power term
    dropped: tuple[str, ...]  # why each missing dimension was dropped, in words
    scale: np.ndarray  # g_d per term, then g_p
    coef: np.ndarray  # [E, A_1, a_1, ..., A_n, a_n, B, b] of the full fit
    boot: np.ndarray  # (BOOTSTRAP, len(coef)) refits
    residuals: np.ndarray  # log err residuals of the full fit, one per configuration
    n_configs: int
    n_runs: int
    max_params: int  # the largest measured configuration

    def _log_err(self, coef: np.ndarray, x: np.ndarray) -> np.ndarray:
        return _log_err(coef, np.log(x / self.scale))

    def _x(self, dims: Sequence[Mapping[str, Any]]) -> np.ndarray:
        cols = [*self.terms, "params"]
        return np.array([[float(d[c]) for c in cols] for d in dims]).reshape(len(dims), len(cols))

    def _to_metric(self, log_err: np.ndarray) -> np.ndarray:
        err = np.exp(log_err)
        return 1.0 - np.minimum(err, 1.0) if self.higher_is_better else err

    def predict(self, dims: Sequence[Mapping[str, Any]]) -> np.ndarray:
        """The law's metric (full fit) at each configuration: its dims and `params`."""
        return self._to_metric(self._log_err(self.coef, self._x(dims)))

    def laws(self, dims: Sequence[Mapping[str, Any]]) -> np.ndarray:
        """(refits, n): each bootstrap refit's law at each configuration (the law's uncertainty alone)."""
        x = self._x(dims)
        return self._to_metric(np.array([self._log_err(c, x) for c in self.boot]))

    def draws(self, dims: Sequence[Mapping[str, Any]], seed: int = 0) -> np.ndarray:
        """(refits, n) predictive draws of each configuration's mean metric: a refit's law + a resampled residual.

        One residual per refit, shared by the configurations, so their differences carry the law's uncertainty only.
        """
        x = self._x(dims)
        rng = np.random.default_rng(seed)
        laws = np.array([self._log_err(c, x) for c in self.boot])
        return self._to_metric(laws + rng.choice(self.residuals, size=(len(self.boot), 1)))

    def describe(self) -> str:
        err = "1 - " + self.metric if self.higher_is_better else self.metric
        c, n = self.coef, len(self.terms)
        terms = " + ".join(f"{c[1 + 2 * i]:.3g}*({t}/{self.scale[i]:.3g})^-{c[2 + 2 * i]:.2f}"
                           for i, t in enumerate(self.terms))
        growth = f"{c[1 + 2 * n]:.3g}*(params/{self.scale[n]:.3g})^{c[2 + 2 * n]:.2f}"
        out = (f"{err} ~ {c[0]:.3g} + {terms} + {growth} (Huber fit in log space on {self.n_configs} "
               f"configurations, {self.n_runs} runs; {len(self.boot)} bootstrap refits)")
        return out + "".join(f"; {d}" for d in self.dropped)


def _log_err(coef: np.ndarray, logx: np.ndarray) -> np.ndarray:
    """log err at `logx` (the shape terms' log x_d / g_d, then log params / g): decays, then the growth term."""
    total = np.full(logx.shape[0], coef[0])
    last = logx.shape[1] - 1
    for i in range(logx.shape[1]):
        sign = 1.0 if i == last else -1.0
        total = total + coef[1 + 2 * i] * np.exp(sign * coef[2 + 2 * i] * logx[:, i])
    return np.log(np.maximum(total, 1e-12))


def _runs(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    """One row per measured run: completed, not answered from storage, with its dims and metric."""
    if "state" in frame:
        frame = frame[frame["state"] == "COMPLETE"]
    if "duplicate_of" in frame:
        frame = frame[frame["duplicate_of"].isna()]
    config = "arch" if "arch" in frame else "key"
    out = frame.dropna(subset=[metric, "layers", "heads"]).assign(_config=lambda f: f[config])
    for dim in DIMS:
        if dim not in out:
            out[dim] = np.nan
    return out


def _fit_once(logx: np.ndarray, y: np.ndarray, starts: Sequence[np.ndarray]) -> np.ndarray:
    """The best of least-squares Huber fits of log err from `starts`."""
    p = 1 + 2 * logx.shape[1]
    lower = np.zeros(p)
    upper = np.full(p, np.inf)
    upper[0] = float(np.exp(y.min()))  # the floor lies below every measured error
    upper[2::2] = 4.0  # decay exponents: 4 is steeper than any scaling law reported
    upper[-1] = GROWTH_MAX
    best, cost = starts[0], math.inf
    for start in starts:
        res = optimize.least_squares(lambda c: _log_err(c, logx) - y, np.clip(start, lower, upper - 1e-9),
                                     bounds=(lower, upper), loss="huber", f_scale=HUBER_SCALE)
        if res.cost < cost:
            best, cost = res.x, res.cost
    return best


def _starts(y: np.ndarray, n_terms: int, rng: np.random.Generator) -> list[np.ndarray]:
    """STARTS initialisations: floor at a share of the smallest error, amplitudes and exponents spread."""
    low = float(np.exp(y.min()))
    out = []
    for _ in range(STARTS):
        c = [low * rng.uniform(0.0, 0.9)]
        for _ in range(n_terms):
            c += [float(np.exp(y.mean())) * rng.uniform(0.1, 1.0) / max(n_terms, 1), rng.uniform(0.1, 2.0)]
        out.append(np.array(c))
    return out


def fit(frame: pd.DataFrame, metric: str = "accuracy", higher_is_better: bool = True, seed: int = 0,
        bootstrap: int = BOOTSTRAP) -> ShapeModel:
    """Fit the law on a study's runs (one row per run: dims, `params`, `metric`, and `seed` where replicated).

    Raises ExplorerError when fewer configurations were measured than the law has coefficients + 2.
    """
    runs = _runs(frame, metric)
    if higher_is_better and (runs[metric] > 1).any():
        raise ExplorerError(f"{metric} above 1: the law models 1 - {metric}, for a metric in [0, 1]", field="metric")
    runs = runs.assign(_err=(1.0 - runs[metric]) if higher_is_better else runs[metric])
    if (runs["_err"] < 0).any():
        raise ExplorerError(f"{metric} is negative: the law models it as a positive error", field="metric")
    configs = runs.groupby("_config")[list(DIMS) + ["params"]].first()
    terms, dropped = [], []
    for dim in DIMS:
        values = configs[dim].dropna().unique()
        if configs[dim].isna().any() or len(values) < 2:
            known = not configs[dim].isna().any()
            why = f"one value measured ({dim}={values[0]:g})" if known else "not known for every configuration"
            dropped.append(f"{dim} term dropped: {why}")
        else:
            terms.append(dim)
    p = 1 + 2 * (len(terms) + 1)
    if len(configs) < p + 2:
        raise ExplorerError(f"{len(configs)} measured configurations cannot fit a law of {p} coefficients "
                            f"(at least {p + 2} needed)", field="budget")
    values = configs[[*terms, "params"]].to_numpy(float)
    scale = np.exp(np.log(values).mean(axis=0))
    logx = np.log(values / scale)
    keys = list(configs.index)
    by_config = {k: g["_err"].to_numpy(float) for k, g in runs.groupby("_config")}

    def target(groups: Sequence[np.ndarray]) -> np.ndarray:
        return np.log(np.maximum([g.mean() for g in groups], ERR_FLOOR))

    rng = np.random.default_rng(seed)
    y = target([by_config[k] for k in keys])
    coef = _fit_once(logx, y, _starts(y, len(terms) + 1, rng))
    boot = []
    for _ in range(bootstrap):  # configurations, then seeds within each
        pick = rng.integers(len(keys), size=len(keys))
        groups = [rng.choice(by_config[keys[i]], size=len(by_config[keys[i]])) for i in pick]
        yb = target(groups)
        boot.append(_fit_once(logx[pick], yb, [coef, *_starts(yb, len(terms) + 1, rng)[:1]]))
    return ShapeModel(metric, higher_is_better, tuple(terms), tuple(dropped), scale, coef,
                      np.array(boot).reshape(bootstrap, p), y - _log_err(coef, logx), len(keys), len(runs),
                      int(configs["params"].max()))


@dataclass(frozen=True)
class Prediction:
    key: str
    dims: dict[str, Any]
    params: int
    value: float  # the law's metric (full fit)
    lo: float  # LEVEL predictive interval of the configuration's mean metric
    hi: float
    p_best: float  # share of bootstrap refits in which it is the best within the budget


@dataclass(frozen=True)
class Extrapolation:
    """The answer for a budget: the predicted best, its equivalents, how far out it is, or a refusal."""

    budget: int
    measured_max_params: int
    metric: str
    best: Prediction | None  # None: refused
    rivals: tuple[Prediction, ...] = ()  # no evidence the best beats them (paired over refits), best first
    model: str = ""
    reach: float = REACH
    refusal: str | None = None
    outside: frozenset[str] = frozenset()  # candidates past the space's declared ranges
    higher_is_better: bool = True  # an accuracy-like metric: written to 3 decimals

    @property
    def factor(self) -> float:
        return self.budget / self.measured_max_params

    def lines(self) -> list[str]:
        """What recommend prints: the pick with its interval, the rivals it does not beat, the distance; or one refusal."""
        if self.refusal is not None:
            return [self.refusal]
        b = self.best
        assert b is not None
        where = (f"{self.factor:.1f}x the largest measured configuration ({format_count(self.measured_max_params)})"
                 if self.factor > 1 else "within the measured range")
        like = self.higher_is_better
        out = [
            f"budget {format_count(self.budget)}, {where}: predicted best {split(b.key)}, {format_count(b.params)} params, "
            f"{self.metric} {shown(b.value, like)} ({LEVEL:.0%} bootstrap prediction interval {shown(b.lo, like)} to "
            f"{shown(b.hi, like)}; best in {b.p_best:.0%} of refits; predicted, not measured)",
            f"model: {self.model}",
        ]
        if b.key in self.outside:
            out.append(f"{split(b.key)} is past the space's declared ranges (its fixed dimensions and constraints kept): "
                       "`explorer recommend ... --verify` trains it at the study's budget, in a study of its own")
        if self.rivals:
            rivals = "; ".join(f"{split(r.key)}: {format_count(r.params)} params, {shown(r.value, like)} ({LEVEL:.0%} "
                               f"interval {shown(r.lo, like)} to {shown(r.hi, like)})" for r in self.rivals[:5])
            more = f"; and {len(self.rivals) - 5} more" if len(self.rivals) > 5 else ""
            out.append(f"not distinguishable from it (the refits' paired {LEVEL:.0%} interval of the difference "
                       f"includes 0): {rivals}{more}")
        else:
            out.append("every other split within the budget is predicted worse (paired over the refits)")
        return out


def refusal(budget: int, top: int, reach: float = REACH) -> str:
    """The one line past the law's validated reach."""
    return (f"budget {format_count(budget)} is {budget / top:.1f}x the largest measured configuration "
            f"({format_count(top)}); the shape law is validated to {reach:g}x (bench/extrapolate.py): "
            f"measure configurations up to {format_count(int(budget / reach))} params first")


def answer(model: ShapeModel, candidates: Sequence[Candidate], budget: int, measured_max_params: int | None = None,
           reach: float = REACH, outside: frozenset[str] = frozenset()) -> Extrapolation:
    """The predicted best split among `candidates` within `budget`, or a refusal past `reach` x the data.

    `measured_max_params` defaults to the model's largest measured configuration.
    """
    top = int(measured_max_params or model.max_params)
    if budget > reach * top:
        return Extrapolation(budget, top, model.metric, None, reach=reach, refusal=refusal(budget, top, reach))
    inside = sorted((c for c in candidates if c[2] <= budget), key=lambda c: c[2])  # ties go to fewer params
    if not inside:
        raise ExplorerError(f"no configuration of the space fits {format_count(budget)} parameters", field="budget")
    dims = [{**c[1], "params": c[2]} for c in inside]
    sign = 1.0 if model.higher_is_better else -1.0
    value = sign * model.predict(dims)
    lo, hi = np.quantile(model.draws(dims), [(1 - LEVEL) / 2, (1 + LEVEL) / 2], axis=0)
    laws = sign * model.laws(dims)
    wins = np.bincount(np.argmax(laws, axis=1), minlength=len(inside)) / len(laws)
    first = int(np.argmax(value))
    gap = laws[:, [first]] - laws  # the best's advantage per refit: the shared residual cancels
    tied = np.quantile(gap, (1 - LEVEL) / 2, axis=0) <= 0
    preds = [Prediction(k, {n: v for n, v in d.items() if n != "params"}, int(p), float(sign * v), float(a), float(b), float(w))
             for (k, d, p), v, a, b, w in zip(inside, value, lo, hi, wins)]
    rivals = sorted((i for i in range(len(preds)) if tied[i] and i != first), key=lambda i: (-value[i], preds[i].params))
    return Extrapolation(int(budget), top, model.metric, preds[first], tuple(preds[i] for i in rivals),
                         model.describe(), reach, outside=outside, higher_is_better=model.higher_is_better)


@dataclass(frozen=True)
class Fidelity:
    """Do the short runs' answers hold at the long budget? Kendall's tau and per-budget verdicts."""

    tau: float
    p_value: float
    budgets: tuple[int, ...]  # those with a configuration inside
    short_picks: tuple[str, ...]
    long_picks: tuple[str, ...]
    held: tuple[bool, ...]  # same pick, or the short pick's long metric within `margin` of the long best
    floor: float  # the share a random pick within each budget would hold
    margin: float
    gaps: tuple[float, ...] = field(default=())  # long best - long metric of the short pick, per budget

    @property
    def share(self) -> float:
        return float(np.mean(self.held)) if self.held else math.nan

    def lines(self) -> list[str]:
        return [f"Kendall's tau {self.tau:.3f} (p {self.p_value:.2g})",
                f"the answer held at {sum(self.held)} of {len(self.held)} budgets ({self.share:.0%}; same pick at "
                f"{sum(a == b for a, b in zip(self.short_picks, self.long_picks))}; a random pick holds "
                f"{self.floor:.0%}); largest loss {max(self.gaps, default=0.0):.4f}"]


def order_held(short: Mapping[str, float], long: Mapping[str, float], params: Mapping[str, int],
               budgets: Sequence[int], margin: float, higher_is_better: bool = True) -> Fidelity:
    """Compare configurations' short-run and long-run means: rank agreement and the best-within-budget answers.

    At each budget the short runs pick the best configuration within it; the answer holds when the long
    runs' best is the same configuration, or the short pick's long mean is within `margin` of it.
    """
    keys = [k for k in short if k in long]
    sign = 1.0 if higher_is_better else -1.0
    tau, p_value = stats.kendalltau([short[k] for k in keys], [long[k] for k in keys])
    used, picks_s, picks_l, held, gaps, floor = [], [], [], [], [], []
    for budget in budgets:
        inside = [k for k in keys if params[k] <= budget]
        if not inside:
            continue
        used.append(int(budget))
        ps = max(inside, key=lambda k: (sign * short[k], -params[k]))
        pl = max(inside, key=lambda k: (sign * long[k], -params[k]))
        gap = sign * (long[pl] - long[ps])
        picks_s.append(ps)
        picks_l.append(pl)
        gaps.append(gap)
        held.append(ps == pl or gap <= margin)
        floor.append(np.mean([sign * (long[pl] - long[k]) <= margin for k in inside]))
    return Fidelity(float(tau), float(p_value), tuple(used), tuple(picks_s), tuple(picks_l),
                    tuple(held), float(np.mean(floor)) if floor else math.nan, margin, tuple(gaps))


def past_the_data(trials: pd.DataFrame, budget: int, candidates: Sequence[Candidate], metric: str,
                  higher_is_better: bool, outside: set[str] | frozenset[str] = frozenset()) -> tuple[list[str], str | None]:
    """recommend's lines past the measured range: the shape law's answer where `budget` passes the largest
    measured configuration of `trials` (a trials frame) and unmeasured candidates fit in it (among them
    `outside`: splits past the space's declared ranges, explorer.space.widened); the
    one-line refusal past the law's reach; else none. Also the predicted best when it is one of `outside`."""
    done = trials[trials["state"] == "COMPLETE"]
    if "duplicate_of" in done:
        done = done[done["duplicate_of"].isna()]
    top = int(done["params"].max())
    if budget <= top:
        return [], None
    if budget > REACH * top:
        return [refusal(budget, top)], None
    if not any(top < p <= budget for _, _, p in candidates):
        return [], None
    try:
        model = fit(done, metric, higher_is_better)
    except ExplorerError as err:
        return [f"beyond the measured range: no shape law ({err})"], None
    said = answer(model, candidates, budget, top, outside=frozenset(outside))
    return said.lines(), (said.best.key if said.best is not None and said.best.key in outside else None)
