"""A study's trials as one pandas row each: what pareto, recommend and the dashboard read."""

from __future__ import annotations

import math
from typing import Any

import optuna
import pandas as pd

DIMS = ("layers", "heads", "width", "mlp")
AFTER_METRIC = (
    "kappa_init_mean",
    "kappa_final_mean",
    "train_time_s",
    "device",
    "fail_reason",
    "datetime_start",
    "datetime_complete",
    "curve",
    "config",
    "rungs",
)


def columns(metric: str = "accuracy") -> list[str]:
    """The frame's leading columns, in order; other scalar user attrs follow them."""
    return ["number", "state", "arch", *DIMS, "params", "flops", metric, *AFTER_METRIC]


def _scalar(value: Any) -> bool:
    return isinstance(value, (int, float, str, bool)) and not (
        isinstance(value, float) and math.isnan(value)
    )


def trials_frame(study: optuna.Study, duplicates: bool = False) -> pd.DataFrame:
    """One row per trial; the metric column is named by the study's `metric` user attr.

    Trials a sampler proposed again and explorer answered from storage (`duplicate_of`) are left out
    unless `duplicates`: they are no new measurement, and every consumer (status, export, fronts,
    recommendations, dashboards) counts distinct measurements.

    `curve` is the per-epoch metric: the trial's intermediate values by step, else its `curve`
    user attr (a study without a pruner may store only that). `rungs` is a trial of a ladder's metric
    at each length it measured ({epochs: metric}; empty otherwise).

    Missing values (a failed trial has no accuracy) are NaN/None, so every trial of the storage
    has a row and a failed one still shows its `fail_reason`.
    """
    metric = str(study.user_attrs.get("metric", "accuracy"))
    head = columns(metric)
    rows = []
    for trial in study.get_trials(deepcopy=False):
        attrs = trial.user_attrs
        if "duplicate_of" in attrs and not duplicates:
            continue
        row: dict[str, Any] = {name: attrs.get(name) for name in head}
        row.update(
            number=trial.number,
            state=trial.state.name,
            arch=trial.params.get("arch", attrs.get("arch")),
            datetime_start=trial.datetime_start,
            datetime_complete=trial.datetime_complete,
            curve=list(attrs.get("curve") or [trial.intermediate_values[s] for s in sorted(trial.intermediate_values)]),
            config=dict(attrs.get("config") or {}),
            rungs={int(e): v for e, v in (attrs.get("rungs") or {}).items()},
        )
        row.update((k, v) for k, v in attrs.items() if k not in row and _scalar(v))
        rows.append(row)
    frame = pd.DataFrame(rows, columns=None if rows else head)
    extra = sorted(c for c in frame.columns if c not in head)
    frame = frame[head + extra]
    numeric = [*DIMS, "params", "flops", metric, "kappa_init_mean", "kappa_final_mean", "train_time_s"]
    frame[numeric] = frame[numeric].apply(pd.to_numeric, errors="coerce")
    return nullable_ints(frame, ["number", *DIMS, "params", "flops"]).sort_values("number", ignore_index=True)


def nullable_ints(frame: pd.DataFrame, names: list[str]) -> pd.DataFrame:
    """`frame` with the named columns as pandas' nullable Int64 where every value present is whole.

    A WAITING or failed trial has no parameter count; with NaN the whole column would turn float
    (`69120.0` in CSV, `6.912e+04` in tables). Int64 keeps the counts integers and the gap empty.
    """
    out = frame.copy()
    for name in names:
        values = out[name].dropna()
        if pd.api.types.is_numeric_dtype(out[name]) and ((values % 1) == 0).all():
            out[name] = out[name].astype("Int64")
    return out
