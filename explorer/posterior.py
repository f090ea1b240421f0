"""One posterior over every configuration's true mean: what the pick, its regret bound, the intervals,
the front probabilities, the verdicts against the baseline and the seed policy all read.

Fitted once per read of a study (`fit`), from the measured runs ({configuration: {seed: metric}}),
each configuration's dimensions, and the space's unmeasured configurations (predicted, with their
uncertainty). The runs' noise is explorer.noise's model (level-dependent, pooled, seeds shared); the
configurations' true means have the smooth prior of explorer.gp. The posterior is Gaussian on the noise
model's scale (the logit for accuracy), so its draws, mapped back to the metric, stay inside [0, 1]:
an accuracy interval never passes 1. Each measured configuration's noise variance is widened by
(t(d, 0.975) / z(0.975))², d its moderated degrees of freedom, so that an estimated variance counts
as one (as a t interval does).

How far the surface may pull a measured configuration: an unstable one (its own variance an outlier
under the noise model's trend, explorer.noise) is not pulled at all, and its mean maps back with its
own variance; one noisier than the trend at its level is pulled at most halfway (`_floor`). Pooling
is for the configurations the surface describes; these two kinds it described badly (bench/coverage.py).

The smooth model is checked before it is used: each replicated configuration's k-th seed is held out
in turn (one fold per k), predicted from the rest, and the model is kept when the held-out seeds fall
inside their 95% predictive intervals about as often as they should (more misses than Binomial(n,
0.05) gives with probability `CHECK_P` fail it). Where it fails, or with fewer than `MIN_SMOOTH`
measured configurations, the posterior is per configuration (each its own mean with the pooled noise
model, no surface) and `note` says so. With no replicate at all there is no noise estimate: `model`
is "none", the means are the runs, and nothing has an interval.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import special

from explorer import gp
from explorer.noise import NoiseModel, Scale, fit_noise, scale_for
from explorer.rows import AT, split_row

LEVEL = 0.95
DRAWS = 2000
MIN_SMOOTH = 6  # measured configurations needed to fit the smooth surface
CHECK_P = 0.01
LIMIT = 1.0  # a noisy configuration's deviation variance, at least this many times its mean's noise variance
TAU_RANGE = 2.0  # the prior on a configuration's deviation from the surface: uniform up to this many run sds
Z = float(special.ndtri(0.975))


@dataclass(frozen=True)
class Check:
    """Held-out seeds inside their 95% predictive intervals, smooth model and per-configuration model."""

    held_out: int
    inside: int
    inside_flat: int

    @property
    def passed(self) -> bool:
        misses = self.held_out - self.inside
        return misses == 0 or float(special.bdtrc(misses - 1, self.held_out, 1 - LEVEL)) >= CHECK_P or self.inside >= self.inside_flat


@dataclass(frozen=True)
class Regret:
    """The pick among a set of configurations and its regret bound: with probability `level` the best
    of the set is at most `eps` better (metric units) than `pick`."""

    pick: str
    eps: float  # NaN without a noise model
    expected: float
    keys: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class Posterior:
    """Joint posterior draws of the configurations' true means (metric units), and what they came from."""

    keys: tuple[str, ...]
    params: np.ndarray
    n: np.ndarray  # seeds measured (0: predicted)
    raw: np.ndarray  # plain mean over the seeds (NaN: unmeasured)
    higher_is_better: bool
    model: str  # "smooth", "per-configuration" or "none"
    note: str | None
    noise: NoiseModel | None
    scale: Scale
    latent_mean: np.ndarray
    latent_cov: np.ndarray | None
    run_var: np.ndarray  # the trend's run variance at each configuration's level: maps the latent mean back to the
    # metric's mean (a configuration's own variance is too noisy for it: one run at 0.997 made a mean of 0.944 read 0.88)
    obs_var: np.ndarray  # the same, widened for its estimate's degrees of freedom (what a new seed adds)
    check: Check | None = None
    hyper: gp.Hyper | None = None
    seed: int = 0
    size: int = DRAWS
    level_dof: float = float("inf")  # degrees of freedom of the noise level every configuration shares
    cost: np.ndarray | None = None  # seconds a run of each row takes (the seed policy's price), where known
    _cache: dict = field(default_factory=dict, repr=False)

    def __deepcopy__(self, memo: dict) -> Posterior:
        return self  # immutable: pandas copies a table's attrs on every operation

    @property
    def index(self) -> dict[str, int]:
        if "index" not in self._cache:
            self._cache["index"] = {k: i for i, k in enumerate(self.keys)}
        return self._cache["index"]

    @property
    def latent_draws(self) -> np.ndarray:
        """(draws, configurations) centred draws on the latent scale (common random numbers: one seed)."""
        if "latent" not in self._cache:
            rng = np.random.default_rng(self.seed)
            if self.latent_cov is None:
                self._cache["latent"] = np.zeros((self.size, len(self.keys)))
            else:
                cov = self.latent_cov + 1e-10 * np.eye(len(self.keys))
                w, v = np.linalg.eigh(cov)
                root = v * np.sqrt(np.clip(w, 0, None))
                self._cache["latent"] = rng.standard_normal((self.size, len(self.keys))) @ root.T
        return self._cache["latent"]

    @property
    def level_draws(self) -> np.ndarray:
        """Per draw, sqrt(w) with w ~ nu / chi²(nu): the shared noise level is an estimate on nu degrees of
        freedom, common to every configuration (a multivariate t): a study whose first seeds happened to
        agree must not read every configuration as sure at once."""
        if "level" not in self._cache:
            rng = np.random.default_rng(self.seed + 3)
            nu = self.level_dof
            self._cache["level"] = (np.ones(self.size) if not np.isfinite(nu) or nu >= 1000
                                    else np.sqrt(nu / rng.chisquare(nu, self.size)))
        return self._cache["level"]

    def metric_draws(self, cols: Sequence[int] | None = None, latent: np.ndarray | None = None) -> np.ndarray:
        """Draws of the true means in metric units (columns `cols`; all by default)."""
        cols = np.arange(len(self.keys)) if cols is None else np.asarray(cols, int)
        d = (self.latent_draws if latent is None else latent)[:, cols]
        return self.scale.metric(self.latent_mean[cols] + self.level_draws[:, None] * d, self.run_var[cols])

    @property
    def draws(self) -> np.ndarray:
        if "draws" not in self._cache:
            self._cache["draws"] = self.metric_draws()
        return self._cache["draws"]

    @property
    def has_intervals(self) -> bool:
        return self.latent_cov is not None

    @property
    def mean(self) -> np.ndarray:
        """Posterior means (metric units); the plain means where there is no noise model."""
        return self.draws.mean(axis=0) if self.has_intervals else self.raw.copy()

    def interval(self, level: float = LEVEL) -> tuple[np.ndarray, np.ndarray]:
        """Central `level` intervals of the true means (NaN without a noise model)."""
        if not self.has_intervals:
            return np.full(len(self.keys), np.nan), np.full(len(self.keys), np.nan)
        lo, hi = np.quantile(self.draws, [(1 - level) / 2, (1 + level) / 2], axis=0)
        return lo, hi

    def sd(self) -> np.ndarray:
        return self.draws.std(axis=0) if self.has_intervals else np.full(len(self.keys), np.nan)

    def sign(self) -> float:
        return 1.0 if self.higher_is_better else -1.0

    def priced(self, cost: np.ndarray) -> Posterior:
        """The same posterior with each row's cost, in seconds a run (the seed policy's price)."""
        return _replace(self, cost=cost)

    def regret(self, keys: Sequence[str], level: float = LEVEL, latent: np.ndarray | None = None,
               among: Sequence[str] | None = None) -> Regret:
        """The pick among `keys` (those this posterior knows; `among` them only, if given) that minimises the
        `level` quantile of its regret, max over the whole set minus its own true mean (ties: the smaller
        expected regret, then fewer parameters); `latent` imagines other draws (explorer.policy)."""
        keys = tuple(k for k in keys if k in self.index)
        cols = [self.index[k] for k in keys]
        allowed = np.array([among is None or k in among for k in keys])
        if not self.has_intervals:
            raw = np.where(allowed, self.sign() * self.raw[cols], -np.inf)
            i = int(np.lexsort((self.params[cols], -raw))[0])
            return Regret(keys[i], float("nan"), float("nan"), keys)
        x = self.sign() * self.metric_draws(cols, latent)
        r = x.max(axis=1, keepdims=True) - x
        k = min(len(r) - 1, int(np.ceil(level * len(r))) - 1)  # the draw at the quantile, rounded up: no interpolation
        eps = np.partition(r, k, axis=0)[k]
        expected = r.mean(axis=0)
        i = int(np.lexsort((self.params[cols], np.round(expected, 9), np.round(np.where(allowed, eps, np.inf), 9)))[0])
        return Regret(keys[i], float(eps[i]), float(expected[i]), keys)

    def difference(self, a: str, b: str) -> np.ndarray:
        """Draws of a's true mean minus b's, signed so that > 0 means a is better."""
        i, j = self.index[a], self.index[b]
        return self.sign() * (self.draws[:, i] - self.draws[:, j])

    def imagine(self, extra: Mapping[str, int], latent: np.ndarray | None = None, cov: np.ndarray | None = None,
                rng: np.random.Generator | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(latent draws, covariance) as they would be after `extra[key]` more seeds of each key, the mean
        held where it is: Matheron's rule for all of them at once, d' = d - (d_J + e) G, G = (S_JJ + V)^-1 S_J,
        V the new runs' noise (v_j / k_j)."""
        d = self.latent_draws if latent is None else latent
        s = self.latent_cov if cov is None else cov
        rng = rng or np.random.default_rng(self.seed + 1)
        cols = np.array([self.index[key] for key in extra], int)
        noise = self.obs_var[cols] / np.array(list(extra.values()), float)
        gain = np.linalg.solve(s[np.ix_(cols, cols)] + np.diag(noise), s[cols])
        e = np.sqrt(noise) * rng.standard_normal((len(d), len(cols)))
        return d - (d[:, cols] + e) @ gain, s - s[:, cols] @ gain


def subset(p: Posterior, keys: Sequence[str]) -> Posterior:
    """The same posterior restricted to `keys` (the same draws of them): what the seed policy imagines on."""
    cols = np.array([p.index[k] for k in keys], int)
    out = _replace(p, keys=tuple(keys), params=p.params[cols], n=p.n[cols], raw=p.raw[cols],
                   latent_mean=p.latent_mean[cols], run_var=p.run_var[cols], obs_var=p.obs_var[cols],
                   latent_cov=None if p.latent_cov is None else p.latent_cov[np.ix_(cols, cols)])
    out._cache["latent"] = p.latent_draws[:, cols]
    out._cache["level"] = p.level_draws
    return out


def lengths(p: Posterior) -> list[int]:
    """The lengths a posterior of several lengths holds rows at (none for one length)."""
    return sorted({e for e in (split_row(k)[1] for k in p.keys) if e is not None})


def at_length(p: Posterior, epochs: int | None) -> Posterior:
    """The posterior of every configuration at `epochs`, keyed by configuration (the same draws); `p`
    itself for a study of one length."""
    if epochs is None or not lengths(p):
        return p
    rows = [k for k in p.keys if split_row(k)[1] == epochs]
    out = subset(p, rows)
    out = _replace(out, keys=tuple(split_row(k)[0] for k in rows), cost=None if p.cost is None else p.cost[[p.index[k] for k in rows]])
    out._cache["latent"] = p.latent_draws[:, [p.index[k] for k in rows]]
    out._cache["level"] = p.level_draws
    return out


def _groups_latent(groups: Mapping[str, Mapping[int, float]], scale: Scale) -> dict[str, dict[int, float]]:
    return {k: dict(zip(g, scale.latent(list(g.values())))) for k, g in groups.items()}


def _noise_cov(keys: Sequence[str], latent: Mapping[str, Mapping[int, float]], var: np.ndarray, seed: np.ndarray,
               config: np.ndarray | None = None, corr: np.ndarray | None = None) -> np.ndarray:
    """Covariance of the measured means: each run's variance over n, and the shared seeds' part between
    rows: `seed` (rows x rows: the seed effect's covariance between their lengths) x |S_c & S_d| / (n_c n_d);
    between two lengths of one configuration (same `config`) also the run's own noise at the seeds they share,
    `corr` (rows x rows: the correlation of one run's noise between their lengths) x its sd at each."""
    seeds = sorted({s for k in keys for s in latent[k]})
    w = np.array([[1.0 if s in latent[k] else 0.0 for s in seeds] for k in keys]).reshape(len(keys), len(seeds))
    n = w.sum(axis=1)
    own = np.maximum(var, np.diag(seed) * 1.01) - np.diag(seed)
    shared = seed * (w @ w.T) / np.outer(n, n)
    if config is not None and corr is not None:
        same = (config[:, None] == config[None, :]) & ~np.eye(len(keys), dtype=bool)
        shared = shared + np.where(same, corr * np.sqrt(np.outer(own, own)) * (w @ w.T) / np.outer(n, n), 0.0)
    return shared + np.diag(own / n)


NOISE_DRAWS = (0.125, 0.375, 0.625, 0.875)  # quantiles of a run's rung correlation the posterior is integrated over


def _rung_corrs(noise: NoiseModel, log_epochs: np.ndarray | None) -> list[np.ndarray | None]:
    """The correlation of one run's noise between the measured rows' lengths, at NOISE_DRAWS of its
    uncertainty (Fisher's z, explorer.noise.rung_correlation); [None] for one length."""
    if log_epochs is None or not noise.rung_corr_se:
        return [None]
    gap = np.abs(log_epochs[:, None] - log_epochs[None, :])
    z = np.arctanh(min(noise.rung_corr, 0.98)) + noise.rung_corr_se * special.ndtri(np.array(NOISE_DRAWS))
    return [noise.corr(gap, float(max(np.tanh(q), 0.0))) for q in z]


def _floor(noise: NoiseModel, level: np.ndarray, run_var: np.ndarray, cov_noise: np.ndarray) -> np.ndarray:
    """The least deviation variance of each measured configuration: a configuration noisier than the trend
    at its level may be pulled at most halfway onto the surface (limited translation, Efron and Morris
    1972): its deviation's prior variance is at least its measured mean's noise variance. Such noisy
    configurations sit further off the surface than the rest (digits-wide: 0.22 on the logit against
    0.14), and the surface held their intervals to 79% coverage (bench/coverage.py)."""
    return np.where(run_var > noise.prior_var(level), LIMIT * np.diag(cov_noise), 0.0)


def _widen(dof: np.ndarray) -> np.ndarray:
    """(t(dof, 0.975) / z(0.975))²: a variance estimated on `dof` degrees of freedom counts as a t would."""
    return (special.stdtrit(np.clip(dof, 1.0, 1e6), 0.975) / Z) ** 2


def fit(groups: Mapping[str, Mapping[int, float]], params: Mapping[str, int], higher_is_better: bool = True,
        dims: Mapping[str, Mapping[str, float]] | None = None, seed: int = 0, size: int = DRAWS,
        warm: gp.Hyper | None = None, check: bool = True) -> Posterior:
    """The posterior of every configuration in `params` (measured: those of `groups` with a run; the
    others predicted from the surface); `dims` are their dimensions (none: no surface)."""
    measured = [k for k in params if len(groups.get(k, {}))]
    values = [v for k in measured for v in groups[k].values()]
    scale = scale_for(values, higher_is_better)
    config_of = {k: split_row(k)[0] for k in params} if any(AT in k for k in params) else None
    length_of = {k: float(split_row(k)[1] or 1) for k in params} if config_of is not None else None
    noise = fit_noise({k: groups[k] for k in measured}, higher_is_better, scale, config_of, length_of)
    latent = _groups_latent({k: groups[k] for k in measured}, scale)
    ybar = np.array([np.mean(list(latent[k].values())) for k in measured])
    n = np.array([len(latent[k]) for k in measured], float)
    own = np.array([np.var(list(latent[k].values()), ddof=1) if len(latent[k]) > 1 else np.nan for k in measured])
    raw = np.array([np.mean(list(groups[k].values())) for k in measured])
    common = dict(higher_is_better=higher_is_better, scale=scale, noise=noise, seed=seed, size=size,
                  level_dof=float(noise.dof) if noise is not None else float("inf"))
    if noise is None:
        return Posterior(tuple(measured), np.array([params[k] for k in measured]), n, raw, model="none",
                         note="one seed per configuration: no noise estimate yet (a second seed of some configurations gives one)",
                         latent_mean=ybar, latent_cov=None, run_var=np.zeros(len(measured)), obs_var=np.zeros(len(measured)), **common)
    log_e = None if length_of is None else np.log([length_of[k] for k in measured])
    run_var, dof = noise.moderated(ybar, n, own, log_e)
    free = noise.outlier(ybar, n, own, log_e)  # unstable: its own mean and variance, not pulled onto the surface
    shared_dof = float(noise.dof)  # the noise level is common to all: its uncertainty is in `level_draws`
    obs_var = run_var * np.maximum(_widen(dof) / _widen(np.array([shared_dof]))[0], 1.0)  # beyond it, a configuration's own
    config = None if config_of is None else np.array([config_of[k] for k in measured])
    corr = None if log_e is None else noise.corr(np.abs(log_e[:, None] - log_e[None, :]))
    seed_cov = noise.seed_cov(log_e, len(measured))
    cov_noise = _noise_cov(measured, latent, obs_var, seed_cov, config, corr)
    flat = Posterior(tuple(measured), np.array([params[k] for k in measured]), n, raw, model="per-configuration",
                     note=None, latent_mean=ybar, latent_cov=cov_noise, run_var=np.where(free, run_var, noise.prior_var(ybar, log_e)),
                     obs_var=obs_var, **common)
    if dims is None or len(measured) < MIN_SMOOTH:
        why = f"{len(measured)} measured configurations (a smooth surface needs {MIN_SMOOTH})" if dims is not None else None
        return _replace(flat, note=f"per-configuration intervals: {why}" if why else None)
    keys = measured + [k for k in params if k not in groups or not len(groups[k])]
    rows = _rows(keys, dims, config_of, seen := np.arange(len(measured)), params)
    hyper, prior = gp.fit(rows.take(seen), ybar, cov_noise, warm)
    tau_max = max(TAU_RANGE * float(np.sqrt(noise.prior_var(noise.centre))), 2 * hyper.tau)
    floor = _floor(noise, ybar, run_var, cov_noise)
    noises = [_noise_cov(measured, latent, obs_var, seed_cov, config, c) for c in _rung_corrs(noise, log_e)]
    mix = gp.integrated(hyper, prior, rows, seen, ybar, noises, tau_max, free, floor, seed=seed)
    mean, cov = mix.mean, mix.cov
    unmeasured = len(keys) - len(measured)
    level = mean[len(measured):]
    log_all = None if length_of is None else np.log([length_of[k] for k in keys])
    run_all = noise.prior_var(mean, log_all)
    run_all[:len(measured)][free] = run_var[free]
    obs_all = np.concatenate([obs_var, noise.prior_var(level, None if log_all is None else log_all[len(measured):])
                              * _widen(np.full(unmeasured, noise.prior_dof))])
    typical = mix.typical()  # the settings' posterior mean; the check holds the deviation at its root mean square
    smooth = Posterior(tuple(keys), np.array([params[k] for k in keys]), np.concatenate([n, np.zeros(unmeasured)]),
                       np.concatenate([raw, np.full(unmeasured, np.nan)]), model="smooth", note=None, latent_mean=mean,
                       latent_cov=cov, run_var=run_all, obs_var=obs_all, hyper=typical, **common)
    if not check:
        return smooth
    extra = gp.deviations(typical, ybar, cov_noise, free, floor)
    result = held_out(typical, prior, rows.take(seen), latent, measured, run_var, obs_var, seed_cov, extra,
                      config, corr)
    smooth = _replace(smooth, check=result)
    if result.passed:
        return smooth
    return _replace(flat, check=result, note=(
        f"the smooth model fits badly (held-out seeds inside their 95% intervals: {result.inside} of {result.held_out}, "
        f"per configuration {result.inside_flat}): per-configuration intervals"))


def _rows(keys: Sequence[str], dims: Mapping[str, Mapping[str, float]], config_of: Mapping[str, str] | None,
          seen: np.ndarray, params: Mapping[str, int]) -> gp.Rows:
    """The surface's rows: features (log epochs among them when lengths vary), configurations, the mean's
    basis, log epochs centred on the measured rows' (none for one length), and how far each row lies past
    the data (log parameters, log epochs)."""
    x, names = gp.features([dict(dims[k]) for k in keys])
    size = np.log([max(float(params[k]), 1.0) for k in keys])
    if config_of is None or "epochs" not in names:
        return gp.Rows.of(x, reach=size, seen=seen)
    config = np.unique([config_of[k] for k in keys], return_inverse=True)[1]
    time = names.index("epochs")
    log_epochs = x[:, time]
    return gp.Rows.of(x, config, log_epochs - log_epochs[seen].mean(), np.column_stack([size, log_epochs]), seen, time)


def _replace(p: Posterior, **changes: object) -> Posterior:
    fields = {f: getattr(p, f) for f in p.__dataclass_fields__ if f != "_cache"}
    return Posterior(**{**fields, **changes})


def held_out(hyper: gp.Hyper, prior: gp.Mean, rows: gp.Rows, latent: Mapping[str, Mapping[int, float]],
             keys: Sequence[str], run_var: np.ndarray, obs_var: np.ndarray, seed: np.ndarray, extra: np.ndarray,
             config: np.ndarray | None = None, corr: np.ndarray | None = None) -> Check:
    """Hold out each replicated configuration's k-th seed (fold k; with several lengths, fold s holds out
    seed s at every length, so no other length of a held-out run stays), predict it from the rest under
    the smooth model and under the per-configuration one, and count those inside their 95% intervals."""
    runs = [list(latent[k].items()) for k in keys]
    folds = sorted({s for r in runs for s, _ in r}) if config is not None else range(max(len(r) for r in runs))
    inside = inside_flat = total = 0
    for fold in folds:
        at = [next((j for j, (s, _) in enumerate(r) if s == fold), None) if config is not None else
              (fold if fold < len(r) else None) for r in runs]
        held = [i for i, r in enumerate(runs) if len(r) >= 2 and at[i] is not None]
        if not held:
            continue
        out = held if config is None else [i for i in range(len(runs)) if at[i] is not None]  # seed s everywhere
        kept = {k: dict(r[:at[i]] + r[at[i] + 1:]) if i in out else dict(r) for i, (k, r) in enumerate(zip(keys, runs))}
        seen = np.array([i for i, k in enumerate(keys) if kept[k]])  # a row whose one run is held out is predicted
        names = [keys[i] for i in seen]
        ybar = np.array([np.mean(list(kept[k].values())) for k in names])
        noise = _noise_cov(names, kept, obs_var[seen], seed[np.ix_(seen, seen)], None if config is None else config[seen],
                           None if corr is None else corr[np.ix_(seen, seen)])
        mean, cov = gp.posterior(hyper, prior, rows, seen, ybar, noise, extra)
        flat_mean = np.full(len(keys), np.nan)
        flat_var = np.full(len(keys), np.nan)
        flat_mean[seen], flat_var[seen] = ybar, np.diag(noise)
        y = np.array([runs[i][at[i]][1] for i in held])
        for m, v, counter in ((mean[held], np.diag(cov)[held], "smooth"), (flat_mean[held], flat_var[held], "flat")):
            z = np.abs(y - m) / np.sqrt(v + run_var[held])
            if counter == "smooth":
                inside += int(np.sum(z <= Z))
            else:
                inside_flat += int(np.sum(z <= Z))
        total += len(held)
    return Check(total, inside, inside_flat)


def front_share(draws: np.ndarray, cost: np.ndarray, metric_up: bool, cost_up: bool = False) -> np.ndarray:
    """Each configuration's share of draws in which it is on the Pareto front of (drawn metric, fixed
    cost): the best of its cost and better than everything cheaper."""
    x = draws if metric_up else -draws
    c = -np.asarray(cost, float) if cost_up else np.asarray(cost, float)
    levels, group = np.unique(c, return_inverse=True)
    best = np.full((len(x), len(levels)), -np.inf)
    for g in range(len(levels)):
        best[:, g] = x[:, group == g].max(axis=1)
    before = np.concatenate([np.full((len(x), 1), -np.inf), np.maximum.accumulate(best, axis=1)[:, :-1]], axis=1)
    on = (x >= best[:, group]) & (x > before[:, group])
    return on.mean(axis=0)
