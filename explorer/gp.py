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
constant), and a configuration's own deviation is one at every length (`same`). With one length none
of this is there and the surface is the one above.

`tau` is not left at its maximum-likelihood value: early in a study most configurations have one seed,
the likelihood is flat from 0 to a few tenths of a run's sd, and its maximum sits at 0 (every
configuration exactly on the surface), which in simulated studies made the bound 3x too sure
(bench/decide.py: 14% false decisions). Instead `tau` is integrated over a uniform prior on the sd
(Gelman 2006, for the variance of a hierarchical component) on a grid, and the mixture of the
posteriors is summarised by its mean and covariance (`mixed`). A configuration may have a deviation
of its own beyond `tau` (`deviations`: explorer.posterior says which and how much).

Past the measured rows (a split larger than any measured, a length longer than any trained) a smooth
surface with long length scales stays sure of itself: on a synthetic surface whose best depth turns
(bench/extrapolate.py) its 95% intervals there held the truth at none of the budgets. So the surface
forgets past the data (`Rows.taper`): a row's correlation with the rest fades with its distance beyond
the measured range (`FORGET`), its prior variance stays, and its prediction falls back towards the
constant (and the length trend) with an interval to match.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import linalg, optimize

CONSTANT_VAR = 4.0  # the constant's prior variance, in units of the means' variance (at least 0.1)
JITTER = 1e-9
TAU_GRID = 8  # points of the grid over tau, from 0 to `tau_max`
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

    @classmethod
    def of(cls, x: np.ndarray, group: np.ndarray | None = None, basis: np.ndarray | None = None,
           reach: np.ndarray | None = None, seen: np.ndarray | None = None) -> Rows:
        """`reach`: (n, m) the log of the sizes a row lies past the data along (parameters, epochs)."""
        same = None
        if group is not None and len(set(group)) < len(group):
            same = (np.asarray(group)[:, None] == np.asarray(group)[None, :]).astype(float)
        taper = None if reach is None or seen is None else _taper(np.asarray(reach, float).reshape(len(x), -1), seen)
        basis = np.zeros((len(x), 0)) if basis is None else np.asarray(basis, float).reshape(len(x), -1)
        spans = np.maximum(np.var(basis, axis=0), np.log(2.0) ** 2 / 4) if basis.shape[1] else None
        return cls(x, same, basis, taper, spans)

    def take(self, idx: np.ndarray) -> Rows:
        return Rows(self.x[idx], None if self.same is None else self.same[np.ix_(idx, idx)], self.basis[idx],
                    None if self.taper is None else self.taper[idx], self.spans)


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
    if rows.same is None:
        return k + np.diag(np.full(len(x), hyper.tau**2) if extra is None else hyper.tau**2 + extra)
    return k + hyper.tau**2 * rows.same + (0.0 if extra is None else np.diag(extra))


def _nll(theta: np.ndarray, d2: np.ndarray, y: np.ndarray, noise: np.ndarray, prior: np.ndarray,
         same: np.ndarray | None, gradient: bool = True) -> tuple[float, np.ndarray | None]:
    """Negative log marginal likelihood and its gradient in (log sf, log ell..., log tau); `prior` is the
    mean's covariance (explorer.gp.Mean), `noise` holds any deviation of a configuration's own beyond
    `tau` (explorer.gp.deviations) too. Without `gradient` no inverse is formed (most of the cost)."""
    sf2, ell2, tau2 = np.exp(2 * theta[0]), np.exp(2 * theta[1:-1]), np.exp(2 * theta[-1])
    r, dr = _shape(np.tensordot(1 / ell2, d2, axes=1)) if len(ell2) else (np.ones((len(y), len(y))), None)
    k = prior + sf2 * r + (tau2 * np.eye(len(y)) if same is None else tau2 * same) + noise
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
    grad[-1] = (np.trace(w) if same is None else np.sum(w * same)) * tau2
    return float(nll), grad


def fit(rows: Rows, y: np.ndarray, noise: np.ndarray, warm: Hyper | None = None) -> tuple[Hyper, Mean]:
    """The hyperparameters maximising the marginal likelihood of means `y` at `rows` with noise covariance
    `noise`, and the mean's prior; from a default start and from `warm` (an earlier fit)."""
    spread = max(float(np.var(y)), 1e-4)
    constant = CONSTANT_VAR * max(spread, 0.1)
    mean = Mean(constant, constant / rows.spans if rows.spans is not None else np.zeros(0))
    x = rows.x
    d2 = _sq(x, x)
    ranges = np.maximum(np.ptp(x, axis=0), 0.1) if x.shape[1] else np.zeros(0)
    lower = np.log(np.concatenate([[1e-3], 0.1 * ranges, [1e-3]]))
    upper = np.log(np.concatenate([[10.0], 20 * ranges, [5.0]]))
    sd = np.sqrt(spread)
    starts = [np.log(np.concatenate([[sd], ranges, [0.3 * sd]]))]
    if warm is not None and len(warm.ell) == x.shape[1]:  # an earlier fit of the same study: it alone (one more seed moves it little)
        starts = [np.clip(warm.theta(), lower, upper)]
    best, value = starts[0], np.inf
    yc = y - y.mean()
    prior = mean.cov(rows, rows)
    for start in starts:
        res = optimize.minimize(_nll, np.clip(start, lower, upper), args=(d2, yc, noise, prior, rows.same), jac=True,
                                method="L-BFGS-B", bounds=list(zip(lower, upper)), options={"maxiter": 200})
        if res.fun < value:
            best, value = res.x, res.fun
    return Hyper(float(np.exp(best[0])), tuple(np.exp(best[1:-1]).tolist()), float(np.exp(best[-1]))), mean


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
    nll, _ = _nll(hyper.theta(), _sq(rows.x, rows.x), y - y.mean(), noise, mean.cov(rows, rows), rows.same, gradient=False)
    return -nll


def deviations(hyper: Hyper, y: np.ndarray, noise: np.ndarray, free: np.ndarray, floor: np.ndarray) -> np.ndarray:
    """Each measured configuration's deviation variance beyond `tau`²: at least `floor` (explorer.posterior
    sets it: how far the surface may pull a configuration), unbounded for `free` ones (not pulled at all)."""
    big = FREE * max(float(np.var(y)), float(np.max(np.diag(noise))), 1e-4)
    return np.where(free, big, np.maximum(hyper.tau**2, floor)) - hyper.tau**2


def mixed(hyper: Hyper, mean: Mean, rows: Rows, seen: np.ndarray, y: np.ndarray, noise: np.ndarray,
          tau_max: float, free: np.ndarray, floor: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The posterior with `tau` integrated over a uniform prior on [0, `tau_max`] (a grid of TAU_GRID
    points, the other settings held, each with its `deviations`): its mean and covariance
    (moment-matched), the grid and its weights."""
    taus = np.linspace(0.0, tau_max, TAU_GRID)
    hypers = [Hyper(hyper.sf, hyper.ell, float(t)) for t in taus]
    extras = [deviations(h, y, noise, free, floor) for h in hypers]
    measured = rows.take(seen)
    logw = np.array([evidence(h, mean, measured, y, noise + np.diag(e)) for h, e in zip(hypers, extras)])
    w = np.exp(logw - logw.max())
    w /= w.sum()
    full = np.zeros((len(extras), len(rows.x)))  # the predicted rows: the scale tau alone
    full[:, seen] = extras
    parts = [posterior(h, mean, rows, seen, y, noise, f) for h, f, wk in zip(hypers, full, w) if wk > 1e-4]
    ws = w[w > 1e-4] / w[w > 1e-4].sum()
    centre = sum(wk * m for wk, (m, _) in zip(ws, parts))
    cov = sum(wk * (c + np.outer(m - centre, m - centre)) for wk, (m, c) in zip(ws, parts))
    return centre, 0.5 * (cov + cov.T), taus, w

