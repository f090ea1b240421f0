"""How far a study's answers carry: past its largest measured configuration, past its longest length,
and whether short runs' order holds in long ones.

The one posterior (explorer.posterior) predicts splits past the space and lengths past the ladder,
with intervals that widen with the distance; how far those intervals were checked out of sample is
`SIZE_REACH` (bench/extrapolate.py) and `LENGTH_REACH` (bench/lengths.py). Past them an answer is
refused in one line that says what to measure. `order_held` compares short runs' means with long
runs' (`recommend --verify --epochs`, bench/fidelity.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from explorer.units import format_count

SIZE_REACH = 2.0  # budget / largest measured configuration the answer past it is validated to (bench/extrapolate.py)
LENGTH_REACH = 2.0  # epochs / longest length measured the answer at it is validated to (bench/lengths.py)


def times(ratio: float, reach: float) -> str:
    """A ratio past `reach` written so that it never reads as the reach itself: 2.5x, 2.05x, not 2.0x."""
    for digits in (1, 2, 3):
        if round(ratio, digits) > reach:
            return f"{ratio:.{digits}f}x"
    return f"more than {reach:g}x"


def size_refusal(budget: int, top: int) -> str:
    """The one line past SIZE_REACH: no split larger than the measured ones is predicted there."""
    return (f"budget {format_count(budget)} is {times(budget / top, SIZE_REACH)} the largest measured configuration "
            f"({format_count(top)}); predictions past it are validated to {SIZE_REACH:g}x (bench/extrapolate.py): "
            f"measure configurations up to {format_count(int(budget / SIZE_REACH))} params first")


def length_refusal(epochs: int, longest: int) -> str:
    """The one line past LENGTH_REACH."""
    return (f"{epochs} epochs is {times(epochs / longest, LENGTH_REACH)} the longest length measured ({longest}); answers are "
            f"validated to {LENGTH_REACH:g}x it (bench/lengths.py): add a rung of at least "
            f"{math.ceil(epochs / LENGTH_REACH)} epochs to budget.epochs first")


@dataclass(frozen=True)
class Fidelity:
    """Do the short runs' answers hold at the long budget? Kendall's tau and per-budget verdicts."""

    tau: float
    p_value: float
    budgets: tuple[int, ...]  # those with a configuration inside
    short_picks: tuple[str, ...]
    long_picks: tuple[str, ...]
    held: tuple[bool, ...]  # same pick, or the short pick's long metric within `margin` of the long best
    floor: float  # the share a random pick within each budget would hold
    margin: float
    gaps: tuple[float, ...] = field(default=())  # long best - long metric of the short pick, per budget

    @property
    def share(self) -> float:
        return float(np.mean(self.held)) if self.held else math.nan

    def lines(self) -> list[str]:
        return [f"Kendall's tau {self.tau:.3f} (p {self.p_value:.2g})",
                f"the answer held at {sum(self.held)} of {len(self.held)} budgets ({self.share:.0%}; same pick at "
                f"{sum(a == b for a, b in zip(self.short_picks, self.long_picks))}; a random pick holds "
                f"{self.floor:.0%}); largest loss {max(self.gaps, default=0.0):.4f}"]


def order_held(short: Mapping[str, float], long: Mapping[str, float], params: Mapping[str, int],
               budgets: Sequence[int], margin: float, higher_is_better: bool = True) -> Fidelity:
    """Compare configurations' short-run and long-run means: rank agreement and the best-within-budget answers.

    At each budget the short runs pick the best configuration within it; the answer holds when the long
    runs' best is the same configuration, or the short pick's long mean is within `margin` of it.
    """
    keys = [k for k in short if k in long]
    sign = 1.0 if higher_is_better else -1.0
    tau, p_value = (stats.kendalltau([short[k] for k in keys], [long[k] for k in keys]) if len(keys) > 1
                    else (float("nan"), float("nan")))  # one configuration has no order (scipy would warn)
    used, picks_s, picks_l, held, gaps, floor = [], [], [], [], [], []
    for budget in budgets:
        inside = [k for k in keys if params[k] <= budget]
        if not inside:
            continue
        used.append(int(budget))
        ps = max(inside, key=lambda k: (sign * short[k], -params[k]))
        pl = max(inside, key=lambda k: (sign * long[k], -params[k]))
        gap = sign * (long[pl] - long[ps])
        picks_s.append(ps)
        picks_l.append(pl)
        gaps.append(gap)
        held.append(ps == pl or gap <= margin)
        floor.append(np.mean([sign * (long[pl] - long[k]) <= margin for k in inside]))
    return Fidelity(float(tau), float(p_value), tuple(used), tuple(picks_s), tuple(picks_l),
                    tuple(held), float(np.mean(floor)) if floor else math.nan, margin, tuple(gaps))
