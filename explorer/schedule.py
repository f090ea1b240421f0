"""The learning-rate schedules a trial trains under, and where a ladder of lengths branches off a run.

`cosine` (one length, the default): linear warmup over `warmup_frac` of the run, then cosine decay to
0 at its end, so the schedule of a run depends on its length and a run gives one result.

`wsd` (warmup-stable-decay; a ladder of lengths, e.g. `budget.epochs: [10, 20, 40]`): linear warmup,
a constant learning rate, then a `1 - sqrt` decay to 0 over the last `cooldown` share of the run's
epochs (Hägele et al. 2024, "Scaling Laws and Compute-Optimal Training Beyond Fixed Training
Durations": with a 20% cooldown it matches cosine, and `1 - sqrt` beat a linear cooldown). The warmup
is the same number of steps at every length (`warmup_frac` of the shortest rung), so every run of a
ladder follows one trajectory until its cooldown: the 10-epoch run *is* the 40-epoch run's first 8
epochs plus a 2-epoch cooldown. A run of the longest length therefore gives each shorter rung's result
by branching off at that rung's cooldown start, decaying, evaluating, and going back (`Rungs`): three
lengths for 40 + 2 + 4 = 46 epochs of compute instead of 10 + 20 + 40 = 70.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass


def warmup_cosine(warmup: int, total: int) -> Callable[[int], float]:
    """LR factor: linear from 1/warmup to 1 over `warmup` steps, then cosine down to 0 at `total`."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(total - warmup, 1)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))

    return factor


def cooldown_epochs(epochs: int, cooldown: float) -> int:
    """Epochs of a `epochs`-long WSD run spent decaying: `cooldown` of them, at least one, at most all."""
    return min(epochs, max(1, round(cooldown * epochs)))


class WSD:
    """LR factor of warmup-stable-decay towards `target` epochs (a callable object, so LambdaLR's
    state_dict keeps `target`: a checkpoint taken inside a branch resumes inside it)."""

    def __init__(self, warmup: int, steps_per_epoch: int, cooldown: float, target: int):
        self.warmup, self.steps_per_epoch, self.cooldown, self.target = warmup, steps_per_epoch, cooldown, target

    def decay_start(self, epochs: int) -> int:
        """The epoch at which a run of `epochs` starts its cooldown: where a rung branches off."""
        return epochs - cooldown_epochs(epochs, self.cooldown)

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        start, end = self.decay_start(self.target) * self.steps_per_epoch, self.target * self.steps_per_epoch
        if step < start:
            return 1.0
        return max(0.0, 1.0 - math.sqrt(min(1.0, (step - start) / max(end - start, 1))))


@dataclass(frozen=True)
class Rungs:
    """Where a WSD run of a ladder branches: each shorter rung at its cooldown's first epoch."""

    ladder: tuple[int, ...]  # sorted lengths, the run's own last
    wsd: WSD

    @classmethod
    def of(cls, ladder: Sequence[int], wsd: WSD) -> Rungs:
        return cls(tuple(sorted(ladder)), wsd)

    def branches_at(self, epoch: int) -> list[int]:
        """The shorter rungs whose cooldown starts before main epoch `epoch` trains."""
        return [r for r in self.ladder[:-1] if self.wsd.decay_start(r) == epoch]
