"""Whether a study's runs were still learning when they stopped, beyond the noise: the figure, and what a
longer rung would cost. `run`, `status`, `recommend` and the dashboard say it where it is so.

Measured within each run, so that neither a configuration's level nor its seed's luck enters: for a
ladder, the metric at its longest rung against the one before, both branches of one run (explorer.schedule);
for one length, the mean of the last fifth of the epochs against the fifth before (on the default
study: epochs 17-20 against 13-16). Over the runs, the mean rise and its 95% t interval; the runs are
still learning when that interval lies above 0. The price of a longer rung (twice the longest) comes from
the runs' own seconds per epoch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import special

from explorer.budget import Budget
from explorer.formats import epochs_words

MIN_RUNS = 3


@dataclass(frozen=True)
class StillLearning:
    """The mean rise over the runs' last stretch (metric units, > 0: better), its 95% interval, and a longer rung's price."""

    gain: float
    lo: float
    hi: float
    runs: int
    before: str  # "epochs 13-16", or "20 epochs"
    after: str
    longer: int  # the rung that would say more: twice the longest
    seconds: float  # what one run of it costs here

    @property
    def learning(self) -> bool:
        return self.lo > 0

    def words(self, unit: float = 100.0, what: str = "points", metric: str = "accuracy") -> str:
        rise = "rises" if self.gain > 0 else "falls"
        return (f"runs are still learning: {metric} {rise} {unit * abs(self.gain):.1f} {what} from {self.before} to "
                f"{self.after} (95% interval {unit * self.lo:+.1f} to {unit * self.hi:+.1f}, {self.runs} runs); a "
                f"rung of {self.longer} epochs costs {_duration(self.seconds)} a run here (add it to budget.epochs)")


def still_learning(frame: pd.DataFrame, metric: str, higher_is_better: bool, budget: Budget) -> StillLearning | None:
    """The runs' rise over their last stretch, from a `trials_frame`; None with fewer than MIN_RUNS runs."""
    done = frame[frame["state"] == "COMPLETE"]
    if "duplicate_of" in done:
        done = done[done["duplicate_of"].isna()]
    sign = 1.0 if higher_is_better else -1.0
    ladder = budget.ladder
    if len(ladder) > 1 and "rungs" in done:
        low, high = ladder[-2], ladder[-1]
        pairs = [r for r in done["rungs"] if isinstance(r, dict) and low in r and high in r]
        rise = np.array([sign * (r[high] - r[low]) for r in pairs])
        before, after = epochs_words(low), epochs_words(high)
    else:
        length = ladder[-1]
        curves = [list(c) for c in done["curve"] if isinstance(c, (list, tuple)) and len(c) == length]
        w = max(1, length // 5)
        if length < 2 * w:
            return None
        rise = np.array([sign * (np.mean(c[-w:]) - np.mean(c[-2 * w:-w])) for c in curves])
        before = f"epochs {length - 2 * w + 1}-{length - w}" if w > 1 else f"epoch {length - 1}"
        after = f"{length - w + 1}-{length}" if w > 1 else f"epoch {length}"
    if len(rise) < MIN_RUNS:
        return None
    mean, se = float(rise.mean()), float(rise.std(ddof=1) / math.sqrt(len(rise)))
    half = float(special.stdtrit(len(rise) - 1, 0.975)) * se
    longer = 2 * ladder[-1]
    return StillLearning(mean, mean - half, mean + half, len(rise), before, after, longer,
                         _per_epoch(done, budget) * budget.model_copy(update={"epochs": [*ladder, longer]}).compute(longer))


def said(frame: pd.DataFrame, metric: str, higher_is_better: bool, budget: Budget) -> str | None:
    """In words, when the runs of a `trials_frame` were still learning as they stopped; else None."""
    found = still_learning(frame, metric, higher_is_better, budget)
    if found is None or not found.learning:
        return None
    unit, what = (100.0, "points") if higher_is_better else (1.0, metric)
    return found.words(unit, what, metric)


def _per_epoch(done: pd.DataFrame, budget: Budget) -> float:
    """The runs' median seconds per epoch trained (a ladder's run trains its cooldown branches too)."""
    if "train_time_s" not in done or not done["train_time_s"].notna().any():
        return math.nan
    lengths = done["epochs"] if "epochs" in done else pd.Series(budget.ladder[-1], index=done.index)
    trained = lengths.fillna(budget.ladder[-1]).map(lambda e: budget.compute(int(e)))
    return float((done["train_time_s"] / trained).median())


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "an unmeasured time"
    if seconds < 0.5:  # "about 0 s" read as free
        return "under a second"
    return "about " + (f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h")
