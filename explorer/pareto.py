"""Non-dominated fronts, hypervolume, the knee, and the front's growth over a study.

Everything works on plain arrays of objective values plus a direction per objective
("maximize" | "minimize"), turned into losses (minimise all) once, so one code path serves
(accuracy up, params down) and any other objectives a study names.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from explorer.errors import ExplorerError

DEFAULT_OBJECTIVES: tuple[tuple[str, str], ...] = (("accuracy", "maximize"), ("params", "minimize"))


def _losses(values: np.ndarray, directions: Sequence[str]) -> np.ndarray:
    values = np.asarray(values, dtype=float)
    if values.ndim != 2 or values.shape[1] != len(directions):
        raise ExplorerError(
            f"values of shape {values.shape} do not match {len(directions)} directions",
            field="objectives",
        )
    signs = []
    for d in directions:
        if d not in ("maximize", "minimize"):
            raise ExplorerError(f"direction must be maximize or minimize, not {d!r}", field="objectives")
        signs.append(-1.0 if d == "maximize" else 1.0)
    return values * np.asarray(signs)


def _front_of_unique_sorted(loss: np.ndarray) -> np.ndarray:
    """Front of unique, lexicographically sorted losses: row i can only be dominated by rows < i."""
    n, m = loss.shape
    if m == 1:
        return np.arange(n) == 0
    if m == 2:
        best_before = np.minimum.accumulate(np.concatenate([[np.inf], loss[:-1, 1]]))
        return loss[:, 1] < best_before
    on_front = np.zeros(n, dtype=bool)
    remaining = np.arange(n)
    while remaining.size:
        top = remaining[0]  # nothing left before it in lex order can dominate it
        on_front[top] = True
        remaining = remaining[np.any(loss[remaining] < loss[top], axis=1)]
    return on_front


def pareto_mask(values: np.ndarray, directions: Sequence[str]) -> np.ndarray:
    """True for each non-dominated row of `values` (n points x m objectives).

    A point is dominated when another is at least as good in every objective and better in one.
    Identical points do not dominate each other, so duplicates of a front point are all on the
    front. Rows with a NaN (failed trials) are never on it. O(n log n) for two objectives.
    """
    loss = _losses(values, directions)
    mask = np.zeros(len(loss), dtype=bool)
    finite = ~np.isnan(loss).any(axis=1)
    if not finite.any():
        return mask
    unique, inverse = np.unique(loss[finite], axis=0, return_inverse=True)
    mask[finite] = _front_of_unique_sorted(unique)[inverse.reshape(-1)]
    return mask


def hypervolume(values: np.ndarray, directions: Sequence[str], reference: Sequence[float]) -> float:
    """Volume dominated by `values` and bounded by `reference` (a point worse than all of interest).

    Exact: a sort sweep for two objectives, optuna's WFG for more. Points not strictly better
    than the reference in every objective add nothing.
    """
    loss = _losses(values, directions)
    ref = _losses(np.asarray([reference], dtype=float), directions)[0]
    loss = loss[np.all(loss < ref, axis=1)]
    if loss.size == 0:
        return 0.0
    if loss.shape[1] != 2:
        from explorer.optuna_compat import hypervolume as optuna_hypervolume

        return optuna_hypervolume(loss, ref)
    front = np.unique(loss, axis=0)
    front = front[_front_of_unique_sorted(front)]  # x ascending, so y descending
    widths = np.diff(np.append(front[:, 0], ref[0]))
    return float(widths @ (ref[1] - front[:, 1]))


def reference_point(values: np.ndarray, directions: Sequence[str], margin: float = 0.1) -> np.ndarray:
    """The worst value of each objective pushed out by `margin` of its range: a stated default."""
    loss = _losses(values, directions)
    loss = loss[~np.isnan(loss).any(axis=1)]
    if loss.size == 0:
        raise ExplorerError("no completed trial to place a reference point", field="objectives")
    worst, best = loss.max(axis=0), loss.min(axis=0)
    span = np.where(worst > best, worst - best, np.maximum(np.abs(worst), 1.0))
    return _losses((worst + margin * span)[None, :], directions)[0]


def knee(front: np.ndarray) -> int:
    """Index of the front point farthest from the line through its two extremes (2 objectives).

    Each objective is scaled to [0, 1] first, so the units (params vs accuracy) do not decide it.
    Flipping an objective's direction mirrors the picture and leaves the answer unchanged.
    """
    pts = np.asarray(front, dtype=float)
    if pts.ndim != 2 or pts.shape[1] != 2:
        raise ExplorerError("the knee is defined for a front of two objectives", field="objectives")
    if len(pts) < 3:
        return 0
    lo, hi = pts.min(axis=0), pts.max(axis=0)
    pts = (pts - lo) / np.where(hi > lo, hi - lo, 1.0)
    a, b = pts[np.argmin(pts[:, 0])], pts[np.argmax(pts[:, 0])]
    direction = (b - a) / max(np.linalg.norm(b - a), 1e-12)
    rel = pts - a
    distance = np.abs(rel[:, 0] * direction[1] - rel[:, 1] * direction[0])
    return int(np.argmax(distance))


def objective_values(df: pd.DataFrame, objectives: Sequence[tuple[str, str]]) -> np.ndarray:
    """Objective columns of the completed trials' rows (others NaN, so never on a front)."""
    values = df[[name for name, _ in objectives]].to_numpy(dtype=float, na_value=np.nan, copy=True)
    values[(df["state"] != "COMPLETE").to_numpy()] = np.nan
    return values


def front_over_time(
    df: pd.DataFrame,
    objectives: Sequence[tuple[str, str]] = DEFAULT_OBJECTIVES,
    reference: Sequence[float] | None = None,
) -> pd.DataFrame:
    """Hypervolume of the front after each trial number (columns: number, hypervolume).

    Incremental: a new point only changes the volume when it is not dominated, and the front
    stays small, so 100k trials cost one short check each. The reference defaults to
    `reference_point` over all completed trials, so the curve ends at the study's full volume.
    """
    df = df.sort_values("number")
    directions = [d for _, d in objectives]
    values = objective_values(df, objectives)
    if reference is None:
        if np.isnan(values).all():
            return pd.DataFrame({"number": df["number"].to_numpy(), "hypervolume": 0.0})
        reference = reference_point(values, directions)
    ref = _losses(np.asarray([reference], dtype=float), directions)[0]
    loss = _losses(values, directions)
    front = np.empty((0, loss.shape[1]))
    volume, volumes = 0.0, np.zeros(len(loss))
    for i, point in enumerate(loss):
        if not np.isnan(point).any() and not np.all(front <= point, axis=1).any():
            front = np.vstack([front[~np.all(point <= front, axis=1)], point])
            volume = hypervolume(front, ["minimize"] * len(ref), ref)
        volumes[i] = volume
    return pd.DataFrame({"number": df["number"].to_numpy(), "hypervolume": volumes})
