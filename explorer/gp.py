"""A smooth surface over configurations: a Gaussian-process prior fitted by marginal likelihood.

A configuration's true mean (on the noise model's scale, explorer.noise) is a constant, plus a smooth
function of its free dimensions (squared-exponential kernel over their logs, one length scale each:
ARD), plus a deviation of its own (`tau`: how far a configuration may sit off the surface). The
measured means carry known noise (their covariance from the noise model, seeds shared included). The
amplitude, length scales and `tau` maximise the marginal likelihood (L-BFGS-B, analytic gradient,
two starts); the constant has a vague normal prior (`CONSTANT_VAR` x the spread of the means) and is
integrated out. Rasmussen and Williams (2006), chapters 2 and 5.

A study that trains several lengths has one row per (configuration, length) (`Rows`): the training
length is one more dimension of the surface (its log, with a length scale of its own, so how far the
ranking moves with length is fitted, not assumed), the mean also has a linear term in log epochs with
a vague prior, integrated out like the constant (R&W section 2.7: learning curves rise with log
length, and past the longest length the surface follows that slope rather than falling back to the
constant), and a configuration's own deviation changes with length as the surface does (`tau`² times the
length kernel between its rows, `Rows.same` and `Rows.time`): a configuration that is lucky in its
architecture at 10 epochs need not be at 40. With one length none of this is there and the surface is
the one above.

No setting is a point estimate (`integrated`). On the default study the likelihood of the length scale
in log epochs was flat from 1 to 9 (0.69 measured: a likelihood ratio of 2.4 moved the answer from
decided to not), and the maximum made the 10- and 20-epoch surfaces correlate 0.997. So the amplitude
and the length scales are integrated over a prior flat in their logs within the fit's bounds, by
importance sampling from a Student-t (4 degrees of freedom) around the maximum with the likelihood's
curvature (Laplace), its spread held between `SPREAD`; `tau` over a uniform prior on the sd (Gelman
2006: the likelihood is flat from 0 to a few tenths of a run's sd early on, and its maximum at 0 made
the bound 3x too sure, bench/decide.py), stratified; and the noise's own uncertain settings (a run's
rung correlation, explorer.noise) as the caller draws them. The mixture of the posteriors is summarised
by its mean and covariance. A configuration may have a deviation of its own beyond `tau` (`deviations`:
explorer.posterior says which and how much).

Past the measured rows (a split larger than any measured, a length longer than any trained) a smooth
surface with long length scales stays sure of itself: on a synthetic surface whose best depth turns
(bench/extrapolate.py) its 95% intervals there held the truth at none of the budgets. So the surface
forgets past the data (`Rows.taper`): a row's correlation with the rest fades with its distance beyond
the measured range (`FORGET`), its prior variance stays, and its prediction falls back towards the
constant (and the length trend) with an interval to match.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import linalg, optimize, special

CONSTANT_VAR = 4.0  # the constant's prior variance, in units of the means' variance (at least 0.1)
JITTER = 1e-9
SAMPLES = 48  # draws of the settings the posterior is integrated over (their likelihoods only: cheap)
KEEP = 0.01  # a draw with less than this share of the heaviest one's weight is left out of the mixture
SPREAD = (0.1, 1.5)  # the proposal's sd along each of its axes, in log units: at least, at most
FREE = 1e4  # a free configuration's deviation variance, in units of the means' spread: no pull to the surface
FORGET = 0.5  # past the measured rows the surface's correlation fades over this share of their range (bench/extrapolate.py)


@dataclass(frozen=True)
class Rows:
    """The rows the surface describes: their features, which rows are one configuration (at other
    lengths: they share its deviation), and the centred basis of the mean's linear terms (log epochs)."""

    x: np.ndarray  # (n, d)
    same: np.ndarray | None  # (n, n): 1 where two rows are one configuration; None: each row its own
    basis: np.ndarray  # (n, q)
    taper: np.ndarray | None = None  # (n,): how much of the surface a row past the data keeps (1 within it)
    spans: np.ndarray | None = None  # (q,): each basis term's variance over every row, measured or not
    time: int | None = None  # the column of `x` that is log epochs: a configuration's deviation changes along it

    @classmethod
    def of(cls, x: np.ndarray, group: np.ndarray | None = None, basis: np.ndarray | None = None,
           reach: np.ndarray | None = None, seen: np.ndarray | None = None, time: int | None = None) -> Rows:
        """`reach`: (n, m) the log of the sizes a row lies past the data along (parameters, epochs)."""
        same = None
        if group is not None and len(set(group)) < len(group):
            same = (np.asarray(group)[:, None] == np.asarray(group)[None, :]).astype(float)
        taper = None if reach is None or seen is None else _taper(np.asarray(reach, float).reshape(len(x), -1), seen)
        basis = np.zeros((len(x), 0)) if basis is None else np.asarray(basis, float).reshape(len(x), -1)
        spans = np.maximum(np.var(basis, axis=0), np.log(2.0) ** 2 / 4) if basis.shape[1] else None
        return cls(x, same, basis, taper, spans, time if same is not None else None)

    def take(self, idx: np.ndarray) -> Rows:
        return Rows(self.x[idx], None if self.same is None else self.same[np.ix_(idx, idx)], self.basis[idx],
                    None if self.taper is None else self.taper[idx], self.spans, self.time)

    def deviation(self, ell: Sequence[float]) -> np.ndarray | None:
        """(n, n) the correlation of a configuration's own deviation between its rows: 1 between one
        configuration's rows, fading along log epochs as the surface does (length scale `ell[time]`); None:
        every row its own configuration."""
        if self.same is None:
            return None
        if self.time is None:
            return self.same
        d = self.x[:, self.time]
        return self.same * np.exp(-0.5 * (d[:, None] - d[None, :]) ** 2 / ell[self.time] ** 2)


def _taper(x: np.ndarray, seen: np.ndarray) -> np.ndarray | None:
    """exp(-d² / 2 FORGET²), d how far a row lies past the largest measured row (in log parameters, log
    epochs: whichever is farther), in units of the measured range (at least a doubling); None when none does."""
    if not x.shape[1] or not len(seen):
        return None
    lo, hi = x[seen].min(axis=0), x[seen].max(axis=0)
    d = np.maximum(x - hi, 0) / np.maximum(hi - lo, np.log(2.0))
    far = d.max(axis=1)
    return np.exp(-0.5 * (far / FORGET) ** 2) if far.max() > 0 else None



@dataclass(frozen=True)
class Mean:
    """The mean's vague prior: a constant's variance and each linear basis term's (integrated out)."""

    constant: float
    slopes: np.ndarray  # (q,)

    def cov(self, a: Rows, b: Rows) -> np.ndarray:
        return self.constant + (a.basis * self.slopes) @ b.basis.T


@dataclass(frozen=True)
class Hyper:
    """Fitted kernel settings: amplitude `sf`, length scales `ell` (log units per dimension), deviation `tau`."""

    sf: float
    ell: tuple[float, ...]
    tau: float

    def theta(self) -> np.ndarray:
        return np.log([self.sf, *self.ell, max(self.tau, 1e-3)])


def features(dims: list[dict[str, float]]) -> tuple[np.ndarray, tuple[str, ...]]:
    """(configurations x dimensions) inputs: the log of every numeric dimension that varies among them."""
    names = sorted({k for d in dims for k, v in d.items() if isinstance(v, (int, float, np.integer, np.floating))
                    and not isinstance(v, (bool, np.bool_))})
    cols, used = [], []
    for name in names:
        values = np.array([float(d.get(name, np.nan)) for d in dims])
        if np.isnan(values).any() or np.ptp(values) == 0:
            continue
        cols.append(np.log(values) if values.min() > 0 else values)
        used.append(name)
    return (np.column_stack(cols) if cols else np.zeros((len(dims), 0))), tuple(used)


def _sq(x: np.ndarray, z: np.ndarray) -> np.ndarray:
    """(dims, len(x), len(z)) squared differences per dimension."""
    return (x.T[:, :, None] - z.T[:, None, :]) ** 2


def _shape(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's correlation at scaled squared distance q = sum (dx / ell)², and -2 d(corr)/dq (for the
    length scales' gradient): squared exponential (a Matérn 5/2 kernel covered no better on digits-vit)."""
    c = np.exp(-0.5 * q)
    return c, c


def kernel(hyper: Hyper, rows: Rows, mean: Mean, extra: np.ndarray | None = None) -> np.ndarray:
    """The prior covariance between `rows`: the mean's, the surface's, and the deviation (`tau`² between
    rows of one configuration, plus `extra` per row on the diagonal)."""
    ell2 = np.square(hyper.ell)
    x = rows.x
    surface = hyper.sf**2 * _shape(np.tensordot(1 / ell2, _sq(x, x), axes=1))[0] if len(ell2) else \
        np.full((len(x), len(x)), hyper.sf**2)
    if rows.taper is not None:  # past the data the surface forgets: its correlation fades, its variance stays
        t = rows.taper
        surface = surface * np.outer(t, t) + np.diag(np.diag(surface) * (1 - t**2))
    k = mean.cov(rows, rows) + surface
    dev = rows.deviation(hyper.ell)
    if dev is None:
        return k + np.diag(np.full(len(x), hyper.tau**2) if extra is None else hyper.tau**2 + extra)
    return k + hyper.tau**2 * dev + (0.0 if extra is None else np.diag(extra))


def _nll(theta: np.ndarray, d2: np.ndarray, y: np.ndarray, noise: np.ndarray, prior: np.ndarray,
         same: np.ndarray | None, gradient: bool = True, time: int | None = None) -> tuple[float, np.ndarray | None]:
    """Negative log marginal likelihood and its gradient in (log sf, log ell..., log tau); `prior` is the
    mean's covariance (explorer.gp.Mean), `noise` holds any deviation of a configuration's own beyond
    `tau` (explorer.gp.deviations) too; a deviation fades along the column `time` (log epochs) as the surface
    does. Without `gradient` no inverse is formed (most of the cost)."""
    sf2, ell2, tau2 = np.exp(2 * theta[0]), np.exp(2 * theta[1:-1]), np.exp(2 * theta[-1])
    r, dr = _shape(np.tensordot(1 / ell2, d2, axes=1)) if len(ell2) else (np.ones((len(y), len(y))), None)
    fade = same * np.exp(-0.5 * d2[time] / ell2[time]) if same is not None and time is not None else same
    k = prior + sf2 * r + (tau2 * np.eye(len(y)) if fade is None else tau2 * fade) + noise
    try:
        chol = linalg.cho_factor(k, lower=True, check_finite=False)
    except linalg.LinAlgError:
        return 1e10, np.zeros_like(theta)
    alpha = linalg.cho_solve(chol, y, check_finite=False)
    nll = 0.5 * y @ alpha + np.log(np.diag(chol[0])).sum()
    if not gradient:
        return float(nll), None
    w = linalg.cho_solve(chol, np.eye(len(y)), check_finite=False) - np.outer(alpha, alpha)
    grad = np.empty_like(theta)
    grad[0] = np.sum(w * sf2 * r)
    for i in range(len(ell2)):
        grad[1 + i] = 0.5 * np.sum(w * sf2 * dr * d2[i] / ell2[i])
    if fade is not None and time is not None:
        grad[1 + time] += 0.5 * np.sum(w * tau2 * fade * d2[time] / ell2[time])
    grad[-1] = (np.trace(w) if fade is None else np.sum(w * fade)) * tau2
    return float(nll), grad


def _bounds(rows: Rows) -> tuple[np.ndarray, np.ndarray]:
    """The support of (log sf, log ell..., log tau): the fit's bounds, and the prior's (flat in the logs)."""
    ranges = np.maximum(np.ptp(rows.x, axis=0), 0.1) if rows.x.shape[1] else np.zeros(0)
    return (np.log(np.concatenate([[1e-3], 0.1 * ranges, [1e-3]])),
            np.log(np.concatenate([[10.0], 20 * ranges, [5.0]])))


def _mean(y: np.ndarray, rows: Rows) -> Mean:
    constant = CONSTANT_VAR * max(float(np.var(y)), 0.1)
    return Mean(constant, constant / rows.spans if rows.spans is not None else np.zeros(0))


def fit(rows: Rows, y: np.ndarray, noise: np.ndarray, warm: Hyper | None = None) -> tuple[Hyper, Mean]:
    """The hyperparameters maximising the marginal likelihood of means `y` at `rows` with noise covariance
    `noise`, and the mean's prior; from a default start and from `warm` (an earlier fit)."""
    spread = max(float(np.var(y)), 1e-4)
    mean = _mean(y, rows)
    x = rows.x
    lower, upper = _bounds(rows)
    sd = np.sqrt(spread)
    ranges = np.maximum(np.ptp(x, axis=0), 0.1) if x.shape[1] else np.zeros(0)
    start = np.log(np.concatenate([[sd], ranges, [0.3 * sd]]))
    if warm is not None and len(warm.ell) == x.shape[1]:  # an earlier fit of the same study: it alone (one more seed moves it little)
        start = warm.theta()
    args = (_sq(x, x), y - y.mean(), noise, mean.cov(rows, rows), rows.same, True, rows.time)
    res = optimize.minimize(_nll, np.clip(start, lower, upper), args=args, jac=True, method="L-BFGS-B",
                            bounds=list(zip(lower, upper)), options={"maxiter": 200})
    best = res.x
    return Hyper(float(np.exp(best[0])), tuple(np.exp(best[1:-1]).tolist()), float(np.exp(best[-1]))), mean


def _proposal(hyper: Hyper, mean: Mean, rows: Rows, y: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """The covariance of (log sf, log ell...) to draw them from: the inverse of the likelihood's curvature at
    the maximum (Laplace; central differences of the gradient, `tau` held), each axis' sd inside SPREAD."""
    args = (_sq(rows.x, rows.x), y - y.mean(), noise, mean.cov(rows, rows), rows.same, True, rows.time)
    theta, m, h = hyper.theta(), len(hyper.ell) + 1, 1e-3
    hess = np.empty((m, m))
    for i in range(m):
        step = np.zeros_like(theta)
        step[i] = h
        hess[:, i] = ((_nll(theta + step, *args)[1] - _nll(theta - step, *args)[1]) / (2 * h))[:m]  # type: ignore[operator]
    w, v = np.linalg.eigh(0.5 * (hess + hess.T))
    var = np.clip(1 / np.maximum(w, 1e-12), SPREAD[0] ** 2, SPREAD[1] ** 2)
    return (v * var) @ v.T


def posterior(hyper: Hyper, mean: Mean, rows: Rows, seen: np.ndarray, y: np.ndarray,
              noise: np.ndarray, extra: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mean and covariance of every row's true mean, given the measured means `y` of the rows
    `seen` with noise covariance `noise`; `extra`: each row's deviation variance beyond `tau`²
    (explorer.gp.deviations)."""
    k_all = kernel(hyper, rows, mean, extra)
    k_seen = k_all[np.ix_(seen, seen)] + noise
    chol = linalg.cho_factor(k_seen + JITTER * np.eye(len(seen)), lower=True, check_finite=False)
    cross = k_all[:, seen]
    prior = y.mean()
    centre = prior + cross @ linalg.cho_solve(chol, y - prior, check_finite=False)
    cov = k_all - cross @ linalg.cho_solve(chol, cross.T, check_finite=False)
    return centre, 0.5 * (cov + cov.T)


def evidence(hyper: Hyper, mean: Mean, rows: Rows, y: np.ndarray, noise: np.ndarray) -> float:
    """The log marginal likelihood of means `y` at `rows` (up to a constant; `noise` as in `_nll`)."""
    nll, _ = _nll(np.log([hyper.sf, *hyper.ell, max(hyper.tau, 1e-12)]), _sq(rows.x, rows.x), y - y.mean(), noise,
                  mean.cov(rows, rows), rows.same, gradient=False, time=rows.time)
    return -nll


def deviations(hyper: Hyper, y: np.ndarray, noise: np.ndarray, free: np.ndarray, floor: np.ndarray) -> np.ndarray:
    """Each measured configuration's deviation variance beyond `tau`²: at least `floor` (explorer.posterior
    sets it: how far the surface may pull a configuration), unbounded for `free` ones (not pulled at all)."""
    big = FREE * max(float(np.var(y)), float(np.max(np.diag(noise))), 1e-4)
    return np.where(free, big, np.maximum(hyper.tau**2, floor)) - hyper.tau**2


@dataclass(frozen=True)
class Mixture:
    """The posterior integrated over the settings: its mean and covariance (moment-matched), and the draws of
    the settings with their weights (`hypers`, `noise` the index of each one's noise, `weights`)."""

    mean: np.ndarray
    cov: np.ndarray
    hypers: tuple[Hyper, ...]
    noise: tuple[int, ...]
    weights: np.ndarray

    def typical(self) -> Hyper:
        """The settings' posterior mean in their logs (`tau` at its root mean square)."""
        logs = np.array([np.log([h.sf, *h.ell]) for h in self.hypers])
        mid = np.exp(self.weights @ logs)
        tau = float(np.sqrt(self.weights @ np.square([h.tau for h in self.hypers])))
        return Hyper(float(mid[0]), tuple(mid[1:].tolist()), tau)


def integrated(hyper: Hyper, mean: Mean, rows: Rows, seen: np.ndarray, y: np.ndarray, noises: Sequence[np.ndarray],
               tau_max: float, free: np.ndarray, floor: np.ndarray, samples: int = SAMPLES, seed: int = 0) -> Mixture:
    """The posterior with its settings integrated (see the module's docstring): `samples` draws of (sf, ell...)
    from a defensive mixture (half a Student-t around the maximum `hyper` with the likelihood's curvature,
    `_proposal`; half the prior, flat in the logs within the bounds, stratified: where the likelihood is flat the
    t alone put all the weight on one far draw), `tau` stratified over [0, `tau_max`] (its prior) and a noise
    covariance from `noises` (draws of the noise's settings, equally likely a priori) in turn, each weighted by
    its likelihood times the prior over the proposal; the maximum itself is one of the draws. The posterior is
    computed for the draws that carry weight (KEEP)."""
    rng = np.random.default_rng(seed + 11)
    measured = rows.take(seen)
    lower, upper = _bounds(measured)
    m = len(hyper.ell) + 1
    lo, hi = lower[:m], upper[:m]
    centre = np.clip(hyper.theta()[:m], lo, hi)
    cov = _proposal(hyper, mean, measured, y, noises[0])
    root = np.linalg.cholesky(cov + 1e-12 * np.eye(m))
    nu, half = 4.0, samples // 2
    near = centre + rng.standard_normal((half, m)) @ root.T / np.sqrt(rng.chisquare(nu, (half, 1)) / nu)
    strata = np.column_stack([rng.permutation(samples - half) for _ in range(m)])  # a Latin hypercube over the prior
    wide = lo + (hi - lo) * (strata + rng.uniform(size=strata.shape)) / (samples - half)
    thetas = np.vstack([centre, near, wide])
    taus = tau_max * (rng.permutation(len(thetas)) + rng.uniform(size=len(thetas))) / len(thetas)
    which = rng.permutation(np.arange(len(thetas)) % len(noises))
    inv, logdet = np.linalg.inv(cov), np.linalg.slogdet(cov)[1]
    t = special.gammaln((nu + m) / 2) - special.gammaln(nu / 2) - 0.5 * (m * np.log(nu * np.pi) + logdet) \
        - 0.5 * (nu + m) * np.log1p(np.einsum("ij,jk,ik->i", thetas - centre, inv, thetas - centre) / nu)
    inside = np.all((thetas >= lo) & (thetas <= hi), axis=1)
    box = -np.sum(np.log(hi - lo))  # the prior's log density inside the bounds
    logq = np.logaddexp(np.log(0.5) + t, np.log(0.5) + box)
    hypers, logw = [], []
    d2, yc, prior = _sq(measured.x, measured.x), y - y.mean(), mean.cov(measured, measured)
    for theta, tau, k, ok in zip(thetas, taus, which, inside):
        h = Hyper(float(np.exp(theta[0])), tuple(np.exp(theta[1:]).tolist()), float(tau))
        hypers.append(h)
        extra = deviations(h, y, noises[k], free, floor)
        nll, _ = _nll(np.append(theta, np.log(max(tau, 1e-12))), d2, yc, noises[k] + np.diag(extra), prior, measured.same,
                      gradient=False, time=measured.time)
        logw.append(box - nll if ok else -np.inf)
    logw = np.array(logw) - logq
    w = np.exp(logw - logw.max())
    w /= w.sum()
    parts, kept = [], w >= KEEP * w.max()
    full = np.zeros(len(rows.x))
    for h, k, keep in zip(hypers, which, kept):
        if keep:
            full[seen] = deviations(h, y, noises[k], free, floor)
            parts.append(posterior(h, mean, rows, seen, y, noises[k], full.copy()))
    ws = w[kept] / w[kept].sum()
    mu = sum(wk * mk for wk, (mk, _) in zip(ws, parts))
    sigma = sum(wk * (ck + np.outer(mk - mu, mk - mu)) for wk, (mk, ck) in zip(ws, parts))
    return Mixture(mu, 0.5 * (sigma + sigma.T), tuple(hypers), tuple(int(k) for k in which), w)
