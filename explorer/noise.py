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
digits-wide). The variances above are of a whole run (`seed_var` included); the posterior
(explorer.posterior) takes `seed_var` back out of the differences of configurations that share seeds.

A study that trains several lengths measures a configuration at each (a group per configuration and
length, `config_of` saying which groups are one configuration), and one run gives several of them (a
warmup-stable-decay run's cooldown branches, explorer.schedule): a lucky seed is lucky at every
length. `length_corr` is the correlation of a run's own noise between two lengths of one configuration,
pooled over every pair of such groups that share seeds; `seed_var` is then read off different
configurations only.

The bottom floor of the statistics: it imports no other explorer module.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special  # not scipy.stats: importing it takes ~1 s

CLIP = 1e-3  # a metric in [0, 1] is read inside [CLIP, 1 - CLIP] before its logit (1.0 has none)
MIN_TREND = 8  # replicated configurations needed to fit the slope of the variance against the level
SLOPE_MAX = 1.0  # |b|: the variance changes at most e-fold per unit of level on the model's scale
MIN_PRIOR_DOF = 1.0  # d0 never falls below this: even the noisiest configuration's variance has a floor
MAX_PRIOR_DOF = 1000.0
OUTLIER = 0.05  # a configuration's variance past its prior's 95% F quantile is its own (limma's robust idea, one-sided)  # "infinite": every configuration's variance is the trend's


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
    length_corr: float = 0.0  # a run's own noise, between two lengths of one configuration (several lengths only)

    def prior_var(self, level: np.ndarray | float) -> np.ndarray:
        """s0²: the trend's variance of one run at a latent level."""
        return np.exp(self.intercept + self.slope * (np.asarray(level, float) - self.centre))

    def moderated(self, level: np.ndarray, n: np.ndarray, own: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(variance of one run, its degrees of freedom) per configuration: its own sample variance
        `own` (NaN or anything with one seed) moderated towards the trend's at its level; a configuration
        whose own variance is improbably large under the trend (past the F(n - 1, d0) quantile at
        1 - OUTLIER: an unstable one, like digits-vit's layers=3,heads=1 at 4.8 points) keeps its own."""
        dof = np.maximum(np.asarray(n, float) - 1, 0)
        own = np.where(dof > 0, np.nan_to_num(np.asarray(own, float)), 0.0)
        d0 = np.where(self.outlier(level, n, own), 0.0, self.prior_dof)
        var = (d0 * self.prior_var(level) + dof * own) / (d0 + dof)
        return var, d0 + dof

    def outlier(self, level: np.ndarray, n: np.ndarray, own: np.ndarray) -> np.ndarray:
        """Configurations whose own variance is improbably large under the trend: an unstable one."""
        dof = np.maximum(np.asarray(n, float) - 1, 0)
        own = np.where(dof > 0, np.nan_to_num(np.asarray(own, float)), 0.0)
        with np.errstate(invalid="ignore"):
            return (dof > 0) & (own > self.prior_var(level) * special.fdtri(np.maximum(dof, 1), self.prior_dof, 1 - OUTLIER))

    def sd(self, metric: float) -> float:
        """The sd of one run, in metric units, at a configuration whose mean metric is `metric`."""
        level = float(self.scale.latent([metric])[0])
        return float(np.sqrt(self.prior_var(level)) * self.scale.slope(metric))

    def describe(self) -> str:
        shape = "constant" if self.slope == 0 else f"log-linear in the level (slope {self.slope:+.2f})"
        d0 = "infinite" if self.prior_dof >= MAX_PRIOR_DOF else f"{self.prior_dof:.1f}"
        lengths = f"; one run's noise across lengths: correlation {self.length_corr:.2f}" if self.length_corr else ""
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


def seed_variance(latent: Mapping[str, Mapping[int, float]], config_of: Mapping[str, str] | None = None) -> float:
    """The variance shared by every configuration at one seed, by the method of moments: for two
    configurations c != d at seed s, E[r_cs r_ds] = seed_var (1 - 1/n_c - 1/n_d + |S_c & S_d| / (n_c n_d)),
    r being a run's residual from its configuration's mean (pairs of groups that are one configuration,
    `config_of`, are left out). 0 where it cannot be told (or is negative)."""
    names = [k for k, g in latent.items() if len(g) >= 2]
    groups = [latent[k] for k in names]
    if len(groups) < 2:
        return 0.0
    seeds = sorted({s for g in groups for s in g})
    col = {s: i for i, s in enumerate(seeds)}
    w = np.zeros((len(groups), len(seeds)))
    r = np.zeros_like(w)
    for i, g in enumerate(groups):
        values = np.array(list(g.values()), float)
        for s, v in zip(g, values - values.mean()):
            w[i, col[s]], r[i, col[s]] = 1.0, v
    n = w.sum(axis=1)
    cross = float(np.sum(r.sum(axis=0) ** 2 - (r**2).sum(axis=0)))
    overlap = w @ w.T
    coef = 1 - 1 / n[:, None] - 1 / n[None, :] + overlap / np.outer(n, n)
    np.fill_diagonal(overlap, 0.0)
    if config_of is not None:  # the products of one configuration's groups carry its own run noise too: out
        config = np.array([config_of.get(k, k) for k in names])
        same = config[:, None] == config[None, :]
        np.fill_diagonal(same, False)
        rr = np.einsum("is,js->ij", r, r)
        cross -= float(np.sum(rr[same]))
        overlap = np.where(same, 0.0, overlap)
    weight = float(np.sum(overlap * coef))
    return max(0.0, cross / weight) if weight > 0 else 0.0


def length_correlation(latent: Mapping[str, Mapping[int, float]], config_of: Mapping[str, str]) -> float:
    """The correlation of a run's noise between two lengths of one configuration: over every pair of
    its groups with two or more seeds in common, the residuals from each group's mean over those seeds,
    pooled (sum of products over the root of the sums of squares), inside [0, 0.99]."""
    by_config: dict[str, list[str]] = {}
    for key, group in latent.items():
        if len(group) >= 2:
            by_config.setdefault(config_of.get(key, key), []).append(key)
    xy = xx = yy = 0.0
    for keys in by_config.values():
        for i, a in enumerate(keys):
            for b in keys[i + 1:]:
                shared = sorted(set(latent[a]) & set(latent[b]))
                if len(shared) < 2:
                    continue
                u = np.array([latent[a][s] for s in shared])
                v = np.array([latent[b][s] for s in shared])
                u, v = u - u.mean(), v - v.mean()
                xy, xx, yy = xy + float(u @ v), xx + float(u @ u), yy + float(v @ v)
    return float(np.clip(xy / math.sqrt(xx * yy), 0.0, 0.99)) if xx > 0 and yy > 0 else 0.0


def fit_noise(groups: Mapping[str, Mapping[int, float]], higher_is_better: bool, scale: Scale | None = None,
              config_of: Mapping[str, str] | None = None) -> NoiseModel | None:
    """The noise model of `groups` ({configuration: {seed: metric}}, or {(configuration, length) group:
    {seed: metric}} with `config_of` naming each group's configuration); None without two degrees of
    freedom of replicates (no configuration has a second seed: there is no noise estimate yet)."""
    scale = scale or scale_for([v for g in groups.values() for v in g.values()], higher_is_better)
    latent = {k: dict(zip(g, scale.latent(list(g.values())))) for k, g in groups.items() if len(g)}
    many = {k: np.array(list(g.values())) for k, g in latent.items() if len(g) >= 2}
    dof = np.array([len(v) - 1 for v in many.values()], float)
    if dof.sum() < 2:
        return None
    level = np.array([v.mean() for v in many.values()])
    var = np.array([v.var(ddof=1) for v in many.values()])
    centre = float(np.mean([np.mean(list(g.values())) for g in latent.values()]))
    seed_var = seed_variance(latent, config_of)
    corr = length_correlation(latent, config_of) if config_of is not None else 0.0
    keep = var > 0  # equal values (a collapsed run, or accuracy's steps of 1/360) say little about the log variance
    if keep.sum() < 2:
        pooled = float(np.sum(dof * var) / dof.sum()) or 1e-6
        return NoiseModel(scale, centre, math.log(pooled), 0.0, float(dof.sum()), min(seed_var, pooled / 2),
                          len(many), float(dof.sum()), corr)
    d, z, x = dof[keep], np.log(var[keep]), level[keep] - centre
    z = z - (special.digamma(d / 2) - np.log(d / 2))  # E[log chi²_d / d] taken out
    weight = 1 / special.polygamma(1, d / 2)  # 1 / var(log chi²_d / d)
    slope = 0.0
    if keep.sum() >= MIN_TREND and np.ptp(x) > 0:
        xm = np.average(x, weights=weight)
        slope = float(np.clip(np.sum(weight * (x - xm) * (z - np.average(z, weights=weight))) / np.sum(weight * (x - xm) ** 2),
                              -SLOPE_MAX, SLOPE_MAX))
    intercept = float(np.average(z - slope * x, weights=weight))
    resid = z - intercept - slope * x
    if keep.sum() < 3:  # too few to fit a spread: their pooled variance, worth its degrees of freedom
        d0 = float(d.sum())
    else:
        spread = float(np.sum(resid**2) / (len(resid) - 1 - (slope != 0)) - np.mean(special.polygamma(1, d / 2)))
        d0 = MAX_PRIOR_DOF if spread <= 0 else 2 * _trigamma_inverse(spread)
    d0 = float(np.clip(min(d0, d.sum()), MIN_PRIOR_DOF, MAX_PRIOR_DOF))  # a prior is worth no more than the runs it came from
    intercept += float(special.digamma(d0 / 2) - np.log(d0 / 2)) if d0 < MAX_PRIOR_DOF else 0.0  # the prior's log mean -> s0²
    typical = math.exp(intercept)
    return NoiseModel(scale, centre, intercept, slope, d0, min(seed_var, typical / 2), len(many), float(dof.sum()), corr)
