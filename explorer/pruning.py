"""Pruning of hopeless trials on the per-epoch metric, fair to small models.

Optuna's pruners do not support multi-objective studies, and a plain median rule would prune every
small model early: with parameters as a second objective, a small model that is worse than a big one
can still be on the Pareto front. Two ways to be fair to it:

- `dominated` (explorer's own): a trial is stopped when, even with the largest gain any complete trial
  of its parameter bin made from this epoch to the end, it would still finish more than `margin` below
  a complete configuration with no more parameters, that configuration's mean over its complete seeds
  less a noise allowance: `NOISE_Z` x sd x sqrt(1 + 1/n), the one-sided 95% bound of the difference
  between one run of the trial and a mean of n. sd is `noise` where set, else the study's own noise
  model (explorer.noise, the one the posterior reads) at that configuration's level, fitted on the
  complete trials' replicate seeds (0 until a configuration has a second seed). With no allowance,
  bench/search.py's replays pruned true-front configurations 117 times in 5,166 prunes, against 9 in
  1,192 with the measured 1.8-point sd, at the same regret from 840 epochs on. Such a trial can answer no
  budget question (a cheaper configuration beats it), so only trials that cannot reach the budget front
  are stopped. Comparing single seeds instead pruned true-front configurations after one unlucky run
  of a cheaper one (12 of 253 prunes in replays); comparing metrics at the same epoch stopped the big
  models, which learn slower early (bench/search.py; see docs/benchmarks/search.md).
- `median` and `successive-halving`: a trial is compared only with trials in its own parameter bin
  (quantile bins over the space's feasible configurations).

A trial is never compared with its own configuration's other seeds (replicates). A pruned configuration
is not gone: `pruned_within` lists those within a budget, and `come_back` says which the evidence that
stopped them no longer supports (the queue runs them again).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from explorer.noise import fit_noise

NOISE_Z = 1.645  # one-sided 95%


def bin_edges(params: Sequence[int], bins: int) -> np.ndarray:
    """Inner edges of `bins` quantile bins over the feasible configurations' parameter counts."""
    if bins <= 1 or len(set(params)) <= 1:
        return np.array([], dtype=float)
    return np.unique(np.quantile(np.asarray(params, dtype=float), np.linspace(0, 1, bins + 1)[1:-1]))


@dataclass(frozen=True)
class Peer:
    """Another trial's parameter count and per-epoch metric."""

    params: int
    curve: Sequence[float]
    key: str | None = None  # its configuration: replicates of the trial's own one are not its peers


@dataclass(frozen=True)
class BinnedPruner:
    """`dominated`, or `median` or `successive-halving` within a parameter bin.

    dominated: after `warmup` epochs and once `startup` peers of its bin completed all `epochs`, prune
    a trial whose metric plus the largest gain those peers made after this epoch is still more than
    `margin` (metric units) below a configuration with no more parameters: the mean of its complete
    peers' final metrics less the noise allowance.
    median: after `warmup` epochs and once `startup` peers reached this epoch, prune a trial worse than
    the median of its peers at the same epoch. successive-halving: at rungs warmup * eta**k, keep the
    best 1/eta of the trial and its peers.
    """

    rule: str
    higher_is_better: bool
    edges: np.ndarray
    warmup: int = 1
    startup: int = 4
    eta: int = 2
    margin: float = 0.0
    epochs: int | None = None  # of a complete trial; `dominated` needs it
    noise: float | None = None  # dominated: a run's sd of the final metric (metric units); None: the study's own
    # noise model (explorer.noise) fitted on the complete peers' replicates, 0 where none has a second seed

    def _sd(self, finals: dict[object, list[float]]) -> Callable[[float], float]:
        """A run's sd at a configuration's mean (metric units): `noise`, or the noise model of the complete
        peers' seeds (signed finals, by configuration), 0 without a replicate."""
        if self.noise is not None:
            return _constant(self.noise)
        sign = 1.0 if self.higher_is_better else -1.0
        groups = {k: {i: sign * v for i, v in enumerate(vs)} for k, vs in finals.items()}
        model = fit_noise(groups, self.higher_is_better)
        return _constant(0.0) if model is None else model.sd

    def bin(self, params: int) -> int:
        return int(np.searchsorted(self.edges, params, side="right"))

    def should_prune(self, epoch: int, value: float, params: int, peers: Sequence[Peer], key: str | None = None) -> bool:
        """`epoch` counts from 1 (epochs finished). `peers` are other trials; those of configuration `key`
        (the trial's own, other seeds) are ignored, and for the binned rules those in other bins."""
        if self.rule == "none" or epoch < max(1, self.warmup):
            return False
        peers = [p for p in peers if len(p.curve) >= epoch and np.isfinite(p.curve[epoch - 1]) and (key is None or p.key != key)]
        sign = 1.0 if self.higher_is_better else -1.0
        mine = self.bin(params)
        if self.rule == "dominated":
            done = [p for p in peers if len(p.curve) == self.epochs and np.isfinite(p.curve[-1])]
            gains = [sign * (p.curve[-1] - p.curve[epoch - 1]) for p in done if self.bin(p.params) == mine]
            finals: dict[object, list[float]] = {}
            for i, p in enumerate(done):
                if p.params <= params:
                    finals.setdefault(p.key if p.key is not None else i, []).append(sign * p.curve[-1])
            sd = self._sd(finals)
            cheaper = [np.mean(v) - NOISE_Z * sd(sign * np.mean(v)) * np.sqrt(1 + 1 / len(v)) for v in finals.values()]
            return len(gains) >= self.startup and bool(cheaper) and sign * value + max(gains) + self.margin < max(cheaper)
        at_epoch = np.array([p.curve[epoch - 1] for p in peers if self.bin(p.params) == mine], dtype=float)
        if self.rule == "median":
            return len(at_epoch) >= self.startup and sign * value < sign * float(np.median(at_epoch))
        rung = max(1, self.warmup)
        while rung < epoch:
            rung *= self.eta
        if rung != epoch or len(at_epoch) + 1 < self.eta:
            return False
        better = int(np.sum(sign * at_epoch > sign * value))
        keep = max(1, (len(at_epoch) + 1) // self.eta)
        return better >= keep


def _constant(value: float) -> Callable[[float], float]:
    return lambda _: value


def pruned_within(frame: pd.DataFrame, budget: int) -> list[str]:
    """Configurations of a `trials_frame` within `budget` parameters that were pruned and never completed."""
    within = frame[frame["params"] <= budget]
    complete = set(within.loc[within["state"] == "COMPLETE", "arch"])
    return sorted(set(within.loc[within["state"] == "PRUNED", "arch"]) - complete)


def come_back(pruner: BinnedPruner, frame: pd.DataFrame) -> list[str]:
    """Pruned, never completed configurations of a `trials_frame` that `pruner` would no longer stop at
    the epoch it stopped them, given the complete trials now stored: their peers' evidence weakened
    (more seeds of a cheaper configuration lowered its mean), so they should run again."""
    peers = [Peer(int(r.params), list(r.curve), r.arch) for r in frame.itertuples() if r.state == "COMPLETE" and len(r.curve)]
    out = []
    for key in pruned_within(frame, int(frame["params"].max()) if len(frame) else 0):
        rows = frame[(frame["arch"] == key) & (frame["state"] == "PRUNED")]
        if not any(pruner.should_prune(len(r.curve), r.curve[-1], int(r.params), peers, key) for r in rows.itertuples() if len(r.curve)):
            out.append(key)
    return out
