"""How a space is shown to Optuna: ordered parameters, feasible configurations only.

A space's free dimensions become Optuna parameters of their own kind: depth an integer, heads,
widths and MLP widths integers on a log scale, anything else categorical. Samplers then see that
4 layers lies between 3 and 5 and that 8 heads is twice 4, so TPE, GP and NSGA-II can model the
space (and optuna-dashboard's slice and importance plots mean something).

Sampling stays feasible-only by a repair step (`FeasibleSampler`): a sampler's joint proposal is
moved to the nearest feasible configuration (in the encoding's unit cube) that no trial has taken
yet, complete, running, queued or failed by itself, so a proposal is never infeasible, never a
duplicate, and parallel workers never propose what another is training. `bench/search.py` measured
this against Optuna's `constraints_func` (infeasible proposals told as infeasible): see docs/benchmarks/search.md.

`BudgetSampler` is explorer's own strategy. Parameters are known before training, so the question
is the best metric within each parameter budget: it fits a Gaussian process to the measured metrics
over the ordered encoding and trains next the untaken configuration with the largest expected
improvement of the budget front, summed over budgets in log parameters (the expected hypervolume
improvement when one objective is known exactly).

Each trial also stores its configuration's key as the categorical parameter `arch` (set from the
ordered ones, never sampled: no model sees it), which grid queues, executors, exports and dashboards
read as before. Studies stored before this change sample `arch` alone; they keep that encoding
(`ArchEncoding`), so they load, resume and render as they were, and still never repeat a configuration.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from explorer.identity import current_trials, per_trial
from explorer.space import Config, SearchSpace

LOG_SCALE = ("heads", "width", "mlp")  # multiplicative dimensions: 8 heads is to 4 as 4 is to 2
ARCH = "arch"


class Encoding:
    """The ordered encoding of a space's feasible configurations as Optuna parameters."""

    name = "ordered"

    def __init__(self, space: SearchSpace):
        self.space = space
        self.configs: list[Config] = space.configs()
        self.keys: list[str] = [c.key for c in self.configs]
        self.dims = space.free_dims
        values = {d: sorted({c[d] for c in self.configs}, key=_order) for d in self.dims}
        self.ordered: dict[str, BaseDistribution] = {d: _distribution(d, v) for d, v in values.items()}
        self.modelled: dict[str, BaseDistribution] = self.ordered  # the parameters a sampler models
        self.distributions: dict[str, BaseDistribution] = {**self.ordered, ARCH: CategoricalDistribution(self.keys)}
        self._by_params = {tuple(c[d] for d in self.dims): c for c in self.configs}
        self._by_key = dict(zip(self.keys, self.configs))
        # (configs, dims) in [0, 1], for the repair step's distances and the GP's features
        self.unit = np.array([self.to_unit(c.dims) for c in self.configs])

    def params(self, cfg: Config) -> dict[str, Any]:
        """The Optuna parameters of a configuration."""
        return {**{d: cfg[d] for d in self.dims}, ARCH: cfg.key}

    def config(self, params: dict[str, Any]) -> Config | None:
        """The feasible configuration with these parameters (its `arch`, or all ordered ones), or None."""
        if ARCH in params:
            return self._by_key.get(params[ARCH])
        try:
            return self._by_params.get(self._tuple(params))
        except KeyError:
            return None

    def _tuple(self, params: dict[str, Any]) -> tuple:
        return tuple(params[d] for d in self.dims)

    def to_unit(self, params: dict[str, Any]) -> list[float]:
        """Each parameter in [0, 1] on its own scale (log for log-scaled ones); categorical: its index."""
        out = []
        for d in self.dims:
            dist, v = self.ordered[d], params[d]
            if isinstance(dist, IntDistribution):
                lo, hi, v = (math.log(x) for x in (dist.low, dist.high, v)) if dist.log else (dist.low, dist.high, v)
                out.append((v - lo) / (hi - lo) if hi > lo else 0.0)
            else:
                out.append(float(dist.choices.index(v)) if v in dist.choices else -1.0)
        return out

    def nearest(self, params: dict[str, Any], allowed: np.ndarray) -> Config:
        """The allowed configuration nearest to `params` (which may name only some dimensions)."""
        if ARCH in params:
            params = self._by_key[params[ARCH]].dims
        given = [i for i, d in enumerate(self.dims) if d in params]
        full = {d: params.get(d, self.configs[0][d]) for d in self.dims}
        point = np.array(self.to_unit(full))[given]
        unit = self.unit[:, given]
        categorical = [j for j, i in enumerate(given) if not isinstance(self.ordered[self.dims[i]], IntDistribution)]
        diff = unit - point
        diff[:, categorical] = (diff[:, categorical] != 0).astype(float)
        dist = np.where(allowed, (diff**2).sum(axis=1), np.inf)
        return self.configs[int(np.argmin(dist))]

    def key_of(self, trial: FrozenTrial) -> str | None:
        """The configuration key of a trial, queued (fixed params), running or finished."""
        key = trial.params.get(ARCH)
        if key is not None and key in self._by_key:  # what `config` finds from its `arch` (every stored trial has one)
            return key
        cfg = self.config({**trial.system_attrs.get("fixed_params", {}), **trial.params})
        return cfg.key if cfg is not None else None

    def suggest(self, trial: optuna.Trial) -> Config:
        """Ask the trial for each parameter; the sampler guarantees a feasible, consistent combination."""
        params = {}
        for d, dist in self.distributions.items():
            if isinstance(dist, IntDistribution):
                params[d] = trial.suggest_int(d, dist.low, dist.high, step=dist.step, log=dist.log)
            else:
                params[d] = trial.suggest_categorical(d, dist.choices)
        cfg = self._by_key[params[ARCH]]
        if any(cfg[d] != params[d] for d in self.dims):  # only a sampler that bypasses FeasibleSampler gets here
            raise ValueError(f"sampled {params}, which is not one feasible configuration")
        return cfg


class ArchEncoding(Encoding):
    """The encoding of studies stored before the ordered one: a categorical over configuration keys."""

    name = "arch"

    def __init__(self, space: SearchSpace):
        super().__init__(space)
        self.distributions = {ARCH: self.distributions[ARCH]}
        self.modelled = self.distributions

    def params(self, cfg: Config) -> dict[str, Any]:
        return {ARCH: cfg.key}

    def suggest(self, trial: optuna.Trial) -> Config:
        return self._by_key[trial.suggest_categorical(ARCH, self.distributions[ARCH].choices)]


def encoding_of(space: SearchSpace, study: optuna.Study | None = None) -> Encoding:
    """The ordered encoding, or `arch` for a study recorded (its `identity` stored) before the ordered
    encoding existed: studies record their `encoding` when they are created."""
    attrs = study.user_attrs if study is not None else {}
    if attrs.get("encoding", ARCH if "identity" in attrs else Encoding.name) == ARCH:
        return ArchEncoding(space)
    return Encoding(space)


def _taken(encoding: Encoding, study: optuna.Study, number: int | None = None) -> set[str]:
    """Keys of configurations no new trial should take: complete, pruned, running, queued, or failed by
    the trial itself (a trial failed by its worker's death is retried: it does not count)."""
    trials = current_trials(study)
    keys = per_trial(study, trials, f"taken-{encoding.name}", lambda t: None if t.state == TrialState.FAIL and "fail_reason"
                     not in t.user_attrs else encoding.key_of(t))
    return {key for t, key in zip(trials, keys, strict=True) if key is not None and t.number != number}


class FeasibleSampler(BaseSampler):
    """Wraps any Optuna sampler: its joint proposal is repaired to the nearest untaken feasible configuration.

    The wrapped sampler sees the ordered search space whole from the first trial; where it proposes
    nothing (startup trials, RandomSampler), a feasible configuration is drawn uniformly among the
    untaken ones. When every configuration is taken, the nearest one is returned (a duplicate:
    the study answers it from storage). `avoid_taken=False` repairs to the nearest feasible
    configuration, taken or not (measured worse in bench/search.py; kept for that comparison).
    """

    def __init__(self, encoding: Encoding, inner: BaseSampler, seed: int | None = None, avoid_taken: bool = True):
        self.encoding = encoding
        self.inner = inner
        self.avoid_taken = avoid_taken
        self._rng = np.random.default_rng(seed)

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return dict(self.encoding.distributions)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        enc = self.encoding
        fixed = enc.config(trial.system_attrs.get("fixed_params", {}))
        if fixed is not None:  # a queued configuration (grid, retry, `recommend --verify`): the rest follows it
            return enc.params(fixed)
        modelled = {k: v for k, v in search_space.items() if k in enc.modelled}
        proposal = self.inner.sample_relative(study, trial, modelled) if modelled else {}
        allowed = _untaken(enc, study, trial.number) if self.avoid_taken else np.ones(len(enc.configs), dtype=bool)
        if proposal:
            cfg = enc.nearest(proposal, allowed)
        else:
            cfg = enc.configs[int(self._rng.choice(np.flatnonzero(allowed)))]
        return enc.params(cfg)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution) -> Any:
        return self.inner.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.inner.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None) -> None:
        self.inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()
        self._rng = np.random.default_rng()


def _untaken(encoding: Encoding, study: optuna.Study, number: int) -> np.ndarray:
    """A mask over the encoding's configurations: untaken ones, or all when every one is taken."""
    used = _taken(encoding, study, number)
    allowed = np.array([k not in used for k in encoding.keys])
    return allowed if allowed.any() else np.ones(len(allowed), dtype=bool)


class BudgetSampler(BaseSampler):
    """explorer's strategy: the expected improvement of the best metric at every parameter budget.

    `metric` is the objective index of the task's metric and `maximize` its direction; `cost` is each
    configuration's known-before-training cost (parameters), on whose log the budgets lie. The first
    `n_startup` configurations are spread over cost quantiles, one per bin, so every budget is seen early.
    Pruned trials count too, at a guessed final metric (see `_observations`).
    """

    def __init__(self, encoding: Encoding, metric: int, maximize: bool, n_startup: int = 5, seed: int | None = None):
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

        self.encoding = encoding
        self.metric = metric
        self.sign = 1.0 if maximize else -1.0
        self.n_startup = n_startup
        self._rng = np.random.default_rng(seed)
        cost = np.log([c.params for c in encoding.configs])
        span = cost.max() - cost.min() or 1.0
        self.cost = (cost - cost.min()) / span  # in [0, 1]
        self.features = np.column_stack([encoding.unit, self.cost])
        n = self.features.shape[1]
        kernel = ConstantKernel(1.0, (1e-2, 1e2)) * Matern(np.full(n, 0.5), (0.05, 20.0), nu=2.5) + WhiteKernel(0.1, (1e-4, 1.0))
        self._gp = GaussianProcessRegressor(kernel, normalize_y=True, random_state=seed)
        self._fitted_at = 0  # observations when the kernel's hyperparameters were last fitted
        grid = np.unique(self.cost)
        self._budgets = grid  # a budget at each configuration's cost; each weighs the log-cost span up to the next
        self._weights = np.diff(np.append(grid, 1.0 + 1.0 / max(len(grid), 1)))

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return dict(self.encoding.distributions)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        enc = self.encoding
        fixed = enc.config(trial.system_attrs.get("fixed_params", {}))
        if fixed is not None:  # a queued configuration: the rest follows it
            return enc.params(fixed)
        allowed = _untaken(enc, study, trial.number)
        seen = self._observations(study)
        if len({i for i, _ in seen}) < self.n_startup:
            return enc.params(enc.configs[self._startup(allowed, {i for i, _ in seen})])
        rows = np.array([i for i, _ in seen])
        y = self.sign * np.array([v for _, v in seen], dtype=float)
        with np.errstate(all="ignore"), warnings.catch_warnings(action="ignore"):
            self._fit(self.features[rows], y)
            mean, sd = self._gp.predict(self.features, return_std=True)
        score = self._acquisition(mean, np.maximum(sd, 1e-9), rows)
        return enc.params(enc.configs[int(np.argmax(np.where(allowed, score, -np.inf)))])

    def _observations(self, study: optuna.Study) -> list[tuple[int, float]]:
        """(configuration index, metric) of complete trials, and of pruned ones at a guessed final metric;
        a trial answered from storage (`duplicate_of`) repeats a measurement and is not counted again.

        A pruned trial's guess is its last per-epoch metric plus the median gain complete trials made
        from that epoch to their end: without it the GP never learns that the pruned region is poor
        and keeps proposing its neighbours."""
        index = {k: i for i, k in enumerate(self.encoding.keys)}
        done, cut = [], []
        for t in current_trials(study, states=(TrialState.COMPLETE, TrialState.PRUNED)):
            i, curve = index.get(self.encoding.key_of(t)), t.user_attrs.get("curve") or []
            if i is None or "duplicate_of" in t.user_attrs:  # answered from storage: no new observation
                continue
            if t.state == TrialState.COMPLETE and t.values is not None and math.isfinite(t.values[self.metric]):
                done.append((i, t.values[self.metric], curve))
            elif t.state == TrialState.PRUNED and curve and math.isfinite(curve[-1]):
                cut.append((i, curve))
        out = [(i, v) for i, v, _ in done]
        for i, curve in cut:
            gains = [v - c[len(curve) - 1] for _, v, c in done if len(c) > len(curve) and math.isfinite(c[len(curve) - 1])]
            if gains:
                out.append((i, curve[-1] + float(np.median(gains))))
        return out

    def _fit(self, x: np.ndarray, y: np.ndarray) -> None:
        """Fit the GP; its hyperparameters are re-optimised once the data grew by a quarter (cheap otherwise)."""
        refit = len(y) >= 1.25 * self._fitted_at
        if refit:
            self._fitted_at = len(y)
        else:
            self._gp.kernel = self._gp.kernel_
        self._gp.optimizer = "fmin_l_bfgs_b" if refit else None
        self._gp.fit(x, y)

    def _startup(self, allowed: np.ndarray, seen: set[int]) -> int:
        """An untaken configuration in the lowest cost bin that has none measured yet (random within it)."""
        edges = np.quantile(self.cost, np.linspace(0, 1, self.n_startup + 1)[1:-1])
        bins = np.searchsorted(edges, self.cost, side="right")
        covered = {bins[i] for i in seen}
        for b in range(self.n_startup):
            pool = np.flatnonzero(allowed & (bins == b))
            if b not in covered and len(pool):
                return int(self._rng.choice(pool))
        return int(self._rng.choice(np.flatnonzero(allowed)))

    def _acquisition(self, mean: np.ndarray, sd: np.ndarray, measured: np.ndarray) -> np.ndarray:
        """Σ over budgets b ≥ cost(x) of weight(b) · EI(x; best posterior mean among measured within b)."""
        from scipy.stats import norm  # here, beside the GP that needs it: scipy.stats takes ~1 s to import

        believed = mean[measured]
        costs = self.cost[measured]
        floor = believed.min()
        best = np.array([believed[costs <= b].max() if (costs <= b).any() else floor for b in self._budgets])
        z = (mean[:, None] - best[None, :]) / sd[:, None]
        ei = sd[:, None] * (z * norm.cdf(z) + norm.pdf(z))
        within = self.cost[:, None] <= self._budgets[None, :]
        return (ei * within * self._weights[None, :]).sum(axis=1)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution) -> Any:
        return optuna.samplers.RandomSampler().sample_independent(study, trial, param_name, param_distribution)

    def reseed_rng(self) -> None:
        self._rng = np.random.default_rng()


def _order(value: Any) -> tuple:
    return (0, value, "") if isinstance(value, (int, float)) and not isinstance(value, bool) else (1, 0, str(value))


def _distribution(dim: str, values: list[Any]) -> BaseDistribution:
    """Integers as an ordered IntDistribution (log scale for multiplicative dims); anything else categorical."""
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        lo, hi = values[0], values[-1]
        if dim in LOG_SCALE and lo > 0:
            return IntDistribution(lo, hi, log=True)
        steps = {b - a for a, b in zip(values, values[1:])}
        return IntDistribution(lo, hi, step=steps.pop() if len(steps) == 1 else 1)
    return CategoricalDistribution(values)
