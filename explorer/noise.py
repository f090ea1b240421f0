"""The noise of one run: how a configuration's seeds scatter, as a smooth function of its level, pooled.

A run's metric is modelled on a scale where its noise is nearly constant (`Scale`): the logit for a
metric that is maximized and lies in [0, 1] (accuracy-like: on digits-vit a run's sd is 3.9 points at
accuracy 0.65 and 0.9-1.7 at 0.93-0.945, close to proportional to p(1 - p), so about 0.2 on the logit
everywhere), the log for a positive metric that is minimized (a loss), the metric itself otherwise. On
that scale the variance is a log-linear function of the level, `log s0² = a + b (level - centre)`,
fitted to every replicated configuration's sample variance (a log-variance regression, as limma-trend
does for gene-wise variances; Smyth 2004, Law et al. 2014), and each configuration's own variance is
moderated towards it with `d0` prior degrees of freedom estimated from the spread of the log variances
around the trend (limma's fitFDist): `v = (d0 s0²(level) + (n - 1) s²) / (d0 + n - 1)`. So no variance
is ever zero (two seeds whose accuracies happen to be equal in steps of 1/360 still get `d0 / (d0 + 1)`
of the trend's), one noisy configuration keeps most of its own, and a configuration with one seed gets
the trend's.

Replicate `s` of every configuration trains with seed `s`, the same data order, so runs at one seed
share a part of their noise: `seed_var`, estimated by the method of moments from the products of
residuals of different configurations at the same seed (0.8 points of accuracy on digits-vit; none on
digits-wide); with several lengths its variance at each length and its correlation between lengths (it
fades as runs lengthen: on digits-vit-lengths 2.6 points at 10 epochs, 0.1 at 40). The variances above are of a whole run (`seed_var` included); the posterior
(explorer.posterior) takes `seed_var` back out of the differences of configurations that share seeds.

A study that trains several lengths measures a configuration at each (a group per configuration and
length, `config_of` saying which groups are one configuration, `length_of` their epochs), and one run gives
several of them (a warmup-stable-decay run's cooldown branches, explorer.schedule): a lucky seed is lucky at
every length, the more so the nearer the lengths (nested branches share the trajectory up to the shorter
one's cooldown). So the variance trend has a term in log epochs too (runs settle as they lengthen, beyond
what their level says: digits-vit-fidelity's sd is 0.31 on the logit at 20 epochs and 0.20 at 60), and the
correlation of a run's own noise between two of its rungs falls with their gap: `rung_corr ** (gap in
doublings)`, fitted by moments on the residuals of each (configuration, length) from its mean with each
(seed, length)'s shared effect taken out first (else the seed effect, added again as `seed_var`, would be
counted twice), shrunk towards a vague prior (0.4, a sd of 0.5 on Fisher's z) and kept with its standard
error (`rung_corr_se`, on z), which explorer.gp integrates over.

The bottom floor of the statistics: it imports no other explorer module.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special  # not scipy.stats: importing it takes ~1 s

CLIP = 1e-3  # a metric in [0, 1] is read inside [CLIP, 1 - CLIP] before its logit (1.0 has none)
MIN_TREND = 8  # replicated configurations needed to fit the slope of the variance against the level
SLOPE_MAX = (1.0, 2.0)  # the variance changes at most e-fold per unit of level on the model's scale, e²-fold per
# e-fold of epochs (a run's sd at most halves per doubling of its length)
MIN_PRIOR_DOF = 1.0  # d0 never falls below this: even the noisiest configuration's variance has a floor
MAX_PRIOR_DOF = 1000.0
OUTLIER = 0.05  # a configuration's variance past its prior's 95% F quantile is its own (limma's robust idea, one-sided)
OUTLIER_DOF = 2  # ...judged on at least this many degrees of freedom of its own: on one, 5% of sound configurations
# were called unstable by chance, and one's interval at 40 epochs spanned 0.2 to 1.0 from two runs at 0.96 and 0.99
SLOPE_PRIOR = 0.5  # the trend's slopes have a normal prior of this sd (ridge): level and length move together, and
# unpenalised the two slopes ran to their bounds in opposite directions on 24 configurations


@dataclass(frozen=True)
class Scale:
    """Where the noise is modelled: `logit` (accuracy-like), `log` (a loss) or `identity`."""

    name: str

    def latent(self, values: np.ndarray | Sequence[float]) -> np.ndarray:
        x = np.asarray(values, float)
        if self.name == "logit":
            p = np.clip(x, CLIP, 1 - CLIP)
            return np.log(p / (1 - p))
        if self.name == "log":
            return np.log(np.maximum(x, 1e-12))
        return x

    def metric(self, latent: np.ndarray, var: np.ndarray | float = 0.0) -> np.ndarray:
        """The mean metric of runs whose latent value is N(latent, var): for the logit MacKay's probit
        approximation of E[sigmoid], for the log the lognormal mean."""
        mu = np.asarray(latent, float)
        if self.name == "logit":
            return special.expit(mu / np.sqrt(1 + np.pi * np.asarray(var) / 8))
        if self.name == "log":
            return np.exp(mu + np.asarray(var) / 2)
        return mu

    def slope(self, metric: np.ndarray | float) -> np.ndarray:
        """d metric / d latent at a metric value: turns a latent sd into metric units."""
        m = np.asarray(metric, float)
        if self.name == "logit":
            p = np.clip(m, CLIP, 1 - CLIP)
            return p * (1 - p)
        if self.name == "log":
            return np.maximum(m, 1e-12)
        return np.ones_like(m)


def scale_for(values: np.ndarray | Sequence[float], higher_is_better: bool) -> Scale:
    """`logit` for a maximized metric in [0, 1], `log` for a positive minimized one, else `identity`."""
    x = np.asarray(values, float)
    x = x[np.isfinite(x)]
    if higher_is_better and len(x) and x.min() >= 0 and x.max() <= 1:
        return Scale("logit")
    if not higher_is_better and len(x) and x.min() > 0:
        return Scale("log")
    return Scale("identity")


@dataclass(frozen=True)
class NoiseModel:
    """A run's variance on the model's scale as a function of the configuration's level, pooled."""

    scale: Scale
    centre: float
    intercept: float  # log s0² at the centre
    slope: float  # of log s0² per unit of level
    prior_dof: float  # d0
    seed_var: float  # the part of a run's variance shared by every configuration at that seed
    replicated: int  # configurations with two seeds or more it was fitted on
    dof: float  # their residual degrees of freedom, summed
    seed_by_length: tuple[tuple[float, float], ...] = ()  # (log epochs, the seed effect's variance there), several lengths
    seed_corr: float = 1.0  # the seed effect's correlation between two lengths
    length_centre: float = 0.0  # log epochs the trend's length term is centred on
    length_slope: float = 0.0  # of log s0² per unit of log epochs (several lengths only)
    rung_corr: float = 0.0  # a run's own noise between two of its rungs a doubling apart (several lengths only)
    rung_corr_se: float = 0.0  # its standard error on Fisher's z (0: known, as for one length)

    def prior_var(self, level: np.ndarray | float, log_epochs: np.ndarray | float | None = None) -> np.ndarray:
        """s0²: the trend's variance of one run at a latent level (and length, in log epochs)."""
        out = self.intercept + self.slope * (np.asarray(level, float) - self.centre)
        if log_epochs is not None:
            out = out + self.length_slope * (np.asarray(log_epochs, float) - self.length_centre)
        return np.exp(out)

    def sd(self, metric: float, log_epochs: float | None = None) -> float:
        """The sd of one run, in metric units, at a configuration whose mean metric is `metric` (explorer.pruning's allowance)."""
        level = float(self.scale.latent([metric])[0])
        return float(np.sqrt(self.prior_var(level, log_epochs)) * self.scale.slope(metric))

    def seed_cov(self, log_epochs: np.ndarray | None, n: int = 1) -> np.ndarray:
        """(rows, rows) the covariance of the seed effect between rows at `log_epochs` (None: one length, `n`
        rows): its variance at each length (read off the nearest measured length), `seed_corr` between lengths."""
        if log_epochs is None or not self.seed_by_length:
            return np.full((n if log_epochs is None else len(log_epochs),) * 2, self.seed_var)
        at, var = np.array(self.seed_by_length).T
        v = np.interp(log_epochs, at, var)
        same = np.isclose(log_epochs[:, None], log_epochs[None, :])
        return np.sqrt(np.outer(v, v)) * np.where(same, 1.0, self.seed_corr)

    def corr(self, gap: np.ndarray | float, rung_corr: float | None = None) -> np.ndarray:
        """The correlation of a run's own noise between two of its rungs `gap` apart in log epochs."""
        rho = self.rung_corr if rung_corr is None else rung_corr
        return np.where(np.asarray(gap, float) > 0, rho ** (np.abs(np.asarray(gap, float)) / math.log(2.0)), 1.0)

    def moderated(self, level: np.ndarray, n: np.ndarray, own: np.ndarray,
                  log_epochs: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(variance of one run, its degrees of freedom) per configuration: its own sample variance
        `own` (NaN or anything with one seed) moderated towards the trend's at its level; a configuration
        whose own variance is improbably large under the trend (past the F(n - 1, d0) quantile at
        1 - OUTLIER: an unstable one, like digits-vit's layers=3,heads=1 at 4.8 points) keeps its own."""
        dof = np.maximum(np.asarray(n, float) - 1, 0)
        own = np.where(dof > 0, np.nan_to_num(np.asarray(own, float)), 0.0)
        d0 = np.where(self.outlier(level, n, own, log_epochs), 0.0, self.prior_dof)
        var = (d0 * self.prior_var(level, log_epochs) + dof * own) / (d0 + dof)
        return var, d0 + dof

    def outlier(self, level: np.ndarray, n: np.ndarray, own: np.ndarray, log_epochs: np.ndarray | None = None) -> np.ndarray:
        """Configurations whose own variance is improbably large under the trend: an unstable one."""
        dof = np.maximum(np.asarray(n, float) - 1, 0)
        own = np.where(dof > 0, np.nan_to_num(np.asarray(own, float)), 0.0)
        with np.errstate(invalid="ignore"):
            return (dof >= OUTLIER_DOF) & (own > self.prior_var(level, log_epochs)
                                           * special.fdtri(np.maximum(dof, 1), self.prior_dof, 1 - OUTLIER))

    def describe(self) -> str:
        shape = "constant" if self.slope == 0 else f"log-linear in the level (slope {self.slope:+.2f})"
        shape += f" and in log epochs (slope {self.length_slope:+.2f})" if self.length_slope else ""
        d0 = "infinite" if self.prior_dof >= MAX_PRIOR_DOF else f"{self.prior_dof:.1f}"
        lengths = (f"; one run's noise across its rungs: correlation {self.rung_corr:.2f} a doubling apart (± "
                   f"{self.rung_corr_se:.2f} on Fisher's z)") if self.rung_corr_se else ""
        return (f"run noise on the {self.scale.name} scale: variance {shape}, fitted on {self.replicated} replicated "
                f"configurations ({self.dof:g} degrees of freedom), each moderated towards it with {d0} prior degrees "
                f"of freedom; shared per seed: sd {math.sqrt(self.seed_var):.3g}{lengths}")


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


def seed_variance(latent: Mapping[str, Mapping[int, float]], config_of: Mapping[str, str] | None = None,
                  length_of: Mapping[str, float] | None = None) -> tuple[float, dict[float, float], float]:
    """The variance shared by every configuration at one seed, by the method of moments: for two groups g, h of
    different configurations at seed s, E[r_gs r_hs] = C (1 - 1/n_g - 1/n_h + |S_g & S_h| / (n_g n_h)), r being a
    run's residual from its group's mean (pairs of groups that are one configuration, `config_of`, left out).
    Returns (pooled variance, {length: its variance from the pairs at that length}, the correlation between
    lengths from the pairs across them); 0 where it cannot be told (or is negative). The seed effect changes with
    length: on digits-vit-lengths 2.6 points at 10 epochs, 0.8 at 20, 0.1 at 40."""
    names = [k for k, g in latent.items() if len(g) >= 2]
    groups = [latent[k] for k in names]
    if len(groups) < 2:
        return 0.0, {}, 1.0
    seeds = sorted({s for g in groups for s in g})
    col = {s: i for i, s in enumerate(seeds)}
    w = np.zeros((len(groups), len(seeds)))
    r = np.zeros_like(w)
    for i, g in enumerate(groups):
        values = np.array(list(g.values()), float)
        for s, v in zip(g, values - values.mean()):
            w[i, col[s]], r[i, col[s]] = 1.0, v
    n = w.sum(axis=1)
    overlap = w @ w.T
    coef = 1 - 1 / n[:, None] - 1 / n[None, :] + overlap / np.outer(n, n)
    config = np.array([(config_of or {}).get(k, k) for k in names])
    use = (config[:, None] != config[None, :]) & (overlap > 0)
    cross, weight = np.where(use, r @ r.T, 0.0), np.where(use, overlap * coef, 0.0)
    pooled = max(0.0, float(cross.sum() / weight.sum())) if weight.sum() > 0 else 0.0
    if length_of is None:
        return pooled, {}, 1.0
    at = np.array([float(length_of[k]) for k in names])
    by: dict[float, float] = {}
    for e in np.unique(at):
        m = np.outer(at == e, at == e)
        if weight[m].sum() > 0:
            by[float(e)] = max(0.0, float(cross[m].sum() / weight[m].sum()))
    across = at[:, None] != at[None, :]
    scale = np.sqrt(np.outer([by.get(float(e), pooled) for e in at], [by.get(float(e), pooled) for e in at]))
    corr = float(np.clip(cross[across].sum() / (weight * scale)[across].sum(), 0.0, 1.0)) \
        if (weight * scale)[across].sum() > 0 else 1.0
    return pooled, by, corr


RUNG_PRIOR = (math.atanh(0.4), 0.5)  # a vague prior on a run's rung correlation a doubling apart: Fisher's z, its sd


def rung_correlation(latent: Mapping[str, Mapping[int, float]], config_of: Mapping[str, str],
                     length_of: Mapping[str, float]) -> tuple[float, float]:
    """(correlation a doubling apart, its standard error on Fisher's z) of a run's own noise between two of its
    rungs: residuals of each group (a configuration at a length) with two seeds or more from its mean, less each
    (seed, length)'s mean residual over configurations (the shared seed effect, counted on its own); over every
    pair of one configuration's groups with two or more seeds in common, per gap (in doublings) the pooled
    correlation of those residuals; `rho ** gap` fitted to them by least squares on Fisher's z weighted by their
    degrees of freedom, then shrunk towards RUNG_PRIOR as a normal prior on z."""
    groups = {k: g for k, g in latent.items() if len(g) >= 2}
    resid = {k: {s: v - float(np.mean(list(g.values()))) for s, v in g.items()} for k, g in groups.items()}
    shared: dict[tuple[int, float], list[float]] = {}
    for k, r in resid.items():
        for s, v in r.items():
            shared.setdefault((s, length_of[k]), []).append(v)
    effect = {key: float(np.mean(v)) if len(v) > 1 else 0.0 for key, v in shared.items()}
    clean = {k: {s: v - effect[(s, length_of[k])] for s, v in r.items()} for k, r in resid.items()}
    by_config: dict[str, list[str]] = {}
    for k in clean:
        by_config.setdefault(config_of.get(k, k), []).append(k)
    sums: dict[float, np.ndarray] = {}  # gap -> (xy, xx, yy, dof)
    for keys in by_config.values():
        for i, a in enumerate(keys):
            for b in keys[i + 1:]:
                common = sorted(set(clean[a]) & set(clean[b]))
                if len(common) < 2 or length_of[a] == length_of[b]:
                    continue
                u = np.array([clean[a][s] for s in common])
                v = np.array([clean[b][s] for s in common])
                u, v = u - u.mean(), v - v.mean()
                gap = round(abs(math.log(length_of[a] / length_of[b])) / math.log(2.0), 6)
                sums[gap] = sums.get(gap, np.zeros(4)) + [u @ v, u @ u, v @ v, len(common) - 1]
    z0, sd0 = RUNG_PRIOR
    pairs = [(gap, t[0] / math.sqrt(t[1] * t[2]), t[3]) for gap, t in sums.items() if t[1] > 0 and t[2] > 0]
    dof = sum(d for _, _, d in pairs)
    if dof < 1:
        return float(math.tanh(z0)), sd0
    grid = np.linspace(0.0, 0.98, 99)
    z = lambda r: np.arctanh(np.clip(r, -0.98, 0.98))  # noqa: E731
    loss = [sum(d * (z(r) - z(rho**gap)) ** 2 for gap, r, d in pairs) for rho in grid]
    zhat, precision = float(z(grid[int(np.argmin(loss))])), max(dof - 2.0, 1.0)
    post_z = (z0 / sd0**2 + zhat * precision) / (1 / sd0**2 + precision)
    return float(max(math.tanh(post_z), 0.0)), float(1 / math.sqrt(1 / sd0**2 + precision))


def fit_noise(groups: Mapping[str, Mapping[int, float]], higher_is_better: bool, scale: Scale | None = None,
              config_of: Mapping[str, str] | None = None, length_of: Mapping[str, float] | None = None) -> NoiseModel | None:
    """The noise model of `groups` ({configuration: {seed: metric}}, or {(configuration, length) group:
    {seed: metric}} with `config_of` naming each group's configuration and `length_of` its epochs); None
    without two degrees of freedom of replicates (no configuration has a second seed: no noise estimate yet)."""
    scale = scale or scale_for([v for g in groups.values() for v in g.values()], higher_is_better)
    latent = {k: dict(zip(g, scale.latent(list(g.values())))) for k, g in groups.items() if len(g)}
    many = {k: np.array(list(g.values())) for k, g in latent.items() if len(g) >= 2}
    dof = np.array([len(v) - 1 for v in many.values()], float)
    if dof.sum() < 2:
        return None
    level = np.array([v.mean() for v in many.values()])
    var = np.array([v.var(ddof=1) for v in many.values()])
    centre = float(np.mean([np.mean(list(g.values())) for g in latent.values()]))
    lengths = config_of is not None and length_of is not None and len({length_of[k] for k in latent}) > 1
    seed_var, seed_by, seed_corr = seed_variance(latent, config_of, length_of if lengths else None)
    rho, rho_se = rung_correlation(latent, config_of, length_of) if lengths else (0.0, 0.0)  # type: ignore[arg-type]
    log_e = np.log([float(length_of[k]) for k in many]) if lengths else np.zeros(len(many))  # type: ignore[index]
    length_centre = float(np.mean(np.log([float(length_of[k]) for k in latent]))) if lengths else 0.0  # type: ignore[index]
    common = dict(length_centre=length_centre, rung_corr=rho, rung_corr_se=rho_se, seed_corr=seed_corr)
    keep = var > 0  # equal values (a collapsed run, or accuracy's steps of 1/360) say little about the log variance
    if keep.sum() < 2:
        pooled = float(np.sum(dof * var) / dof.sum()) or 1e-6
        return NoiseModel(scale, centre, math.log(pooled), 0.0, float(dof.sum()), min(seed_var, pooled / 2),
                          len(many), float(dof.sum()), _by_length(seed_by, lambda e: pooled), **common)
    d, z = dof[keep], np.log(var[keep])
    z = z - (special.digamma(d / 2) - np.log(d / 2))  # E[log chi²_d / d] taken out
    weight = 1 / special.polygamma(1, d / 2)  # 1 / var(log chi²_d / d)
    x = np.column_stack([level[keep] - centre, log_e[keep] - length_centre])
    used = [j for j in range(2) if keep.sum() >= MIN_TREND and np.ptp(x[:, j]) > 0]
    slopes = np.zeros(2)
    if used:
        design = np.column_stack([np.ones(len(z)), x[:, used]])
        penalty = np.diag([0.0] + [1 / SLOPE_PRIOR**2] * len(used))
        coef = np.linalg.solve(design.T @ (weight[:, None] * design) + penalty, design.T @ (weight * z))
        slopes[used] = np.clip(coef[1:], -np.array(SLOPE_MAX)[used], np.array(SLOPE_MAX)[used])
    intercept = float(np.average(z - x @ slopes, weights=weight))
    resid = z - intercept - x @ slopes
    if keep.sum() < 3:  # too few to fit a spread: their pooled variance, worth its degrees of freedom
        d0 = float(d.sum())
    else:
        spread = float(np.sum(resid**2) / max(len(resid) - 1 - len(used), 1) - np.mean(special.polygamma(1, d / 2)))
        d0 = MAX_PRIOR_DOF if spread <= 0 else 2 * _trigamma_inverse(spread)
    d0 = float(np.clip(min(d0, d.sum()), MIN_PRIOR_DOF, MAX_PRIOR_DOF))  # a prior is worth no more than the runs it came from
    intercept += float(special.digamma(d0 / 2) - np.log(d0 / 2)) if d0 < MAX_PRIOR_DOF else 0.0  # the prior's log mean -> s0²
    typical = math.exp(intercept)
    at_length = lambda e: math.exp(intercept + slopes[1] * (math.log(e) - length_centre))  # noqa: E731
    return NoiseModel(scale, centre, intercept, float(slopes[0]), d0, min(seed_var, typical / 2), len(many), float(dof.sum()),
                      _by_length(seed_by, at_length), length_slope=float(slopes[1]), **common)


def _by_length(seed_by: Mapping[float, float], run_var: Callable[[float], float]) -> tuple[tuple[float, float], ...]:
    """The seed effect's variance per length as the model holds it: (log epochs, variance), each at most half the
    trend's run variance there (a run is more than its data order)."""
    return tuple((math.log(e), min(v, run_var(e) / 2)) for e, v in sorted(seed_by.items()))
