"""Pruning of hopeless trials on the per-epoch metric, fair to small models.

Optuna's pruners do not support multi-objective studies, and a plain median rule would prune every
small model early: with parameters as a second objective, a small model that is worse than a big one
can still be on the Pareto front. So a trial is compared only with trials in its own parameter bin
(quantile bins over the space's feasible configurations).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


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


@dataclass(frozen=True)
class BinnedPruner:
    """`median` or `successive-halving` within a parameter bin.

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

    def bin(self, params: int) -> int:
        return int(np.searchsorted(self.edges, params, side="right"))

    def should_prune(self, epoch: int, value: float, params: int, peers: Sequence[Peer]) -> bool:
        """`epoch` counts from 1 (epochs finished). `peers` are other trials; those in other bins are ignored."""
        if self.rule == "none" or epoch < max(1, self.warmup):
            return False
        mine = self.bin(params)
        at_epoch = np.array([p.curve[epoch - 1] for p in peers if self.bin(p.params) == mine and len(p.curve) >= epoch], dtype=float)
        at_epoch = at_epoch[np.isfinite(at_epoch)]
        sign = 1.0 if self.higher_is_better else -1.0
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
