"""Pareto fronts and hypervolume of 100k trials: explorer.pareto against Optuna's own code, side by side.

    python bench/pareto.py [--points 100000] [--repeat 5]

Optuna computes a study's front (`Study.best_trials`) with `_is_pareto_front` and its hypervolume
with `compute_hypervolume` (WFG); explorer's `pareto_mask` and `hypervolume` answer the same
questions on plain arrays with directions. Both run on the same points; the results are checked
equal, and the fastest of `--repeat` runs of each is reported as a ratio.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from explorer.pareto import hypervolume, pareto_mask  # noqa: E402
from explorer.optuna_compat import hypervolume as compute_hypervolume  # noqa: E402  (Optuna's own, WFG)
from explorer.optuna_compat import pareto_mask as optuna_pareto_mask  # noqa: E402


def best(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return min(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"{args.points:,} points, fastest of {args.repeat}:            explorer      optuna   explorer/optuna")
    for m in (2, 3):
        # accuracy-like (maximize) and params-like (minimize, with ties as real counts have)
        values = np.column_stack([rng.random(args.points), rng.integers(1, 200, args.points).astype(float),
                                  *[rng.random(args.points) for _ in range(m - 2)]])
        directions = ["maximize"] + ["minimize"] * (m - 1)
        loss = values * np.where(np.array(directions) == "maximize", -1.0, 1.0)
        ours_t, ours = best(lambda: pareto_mask(values, directions), args.repeat)
        theirs_t, theirs = best(lambda: optuna_pareto_mask(loss), args.repeat)
        assert np.array_equal(ours, theirs), "fronts differ"
        print(f"  front, {m} objectives ({int(ours.sum()):>4} on it)        {ours_t * 1e3:8.1f} ms {theirs_t * 1e3:8.1f} ms   {ours_t / theirs_t:6.2f}")
        ref = loss.max(axis=0) + 1.0
        ref_values = ref * np.where(np.array(directions) == "maximize", -1.0, 1.0)
        ours_t, ours_hv = best(lambda: hypervolume(values, directions, ref_values), args.repeat)
        theirs_t, theirs_hv = best(lambda: compute_hypervolume(loss, ref), args.repeat)  # all points, as ours
        assert np.isclose(ours_hv, theirs_hv), "hypervolumes differ"
        print(f"  hypervolume, {m} objectives               {ours_t * 1e3:8.1f} ms {theirs_t * 1e3:8.1f} ms   {ours_t / theirs_t:6.2f}")


if __name__ == "__main__":
    main()
