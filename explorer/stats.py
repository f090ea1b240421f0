"""Per-configuration statistics of a study's trials, read off the one posterior (explorer.posterior).

Fronts, recommendations, status, export and dashboards read per-configuration statistics from here,
never raw trials. `summarize` fits the posterior once (the noise model, the smooth surface, its
held-out check) and puts it in the table's `attrs["posterior"]`, so that the decisions, the seed
policy and the verdicts read the same one. Replicate `s` of every configuration trains with seed `s`,
the same data order: the posterior counts what configurations sharing seeds share.

Each row: the plain mean over the configuration's seeds (`raw`), the posterior mean (`mean`, also under
the metric's name: the measured mean moved towards the surface by as much as its noise allows), its 95%
interval (`lo`, `hi`: quantiles of the posterior draws, inside [0, 1] for an accuracy), the posterior
sd (`se`), the probability of being on the Pareto front (its share of the draws in which it is), on
the front of posterior means (`on_front`), and for a configuration off that front the front member
dominating it that the posterior cannot tell from it (`tied_with`). With one seed per configuration
there is no noise estimate: `mean` is the run, and the interval columns and `front_prob` are NaN.

A study that trains several lengths (`budget.epochs: [10, 20, 40]`) is summarised at one of them
(`epochs`: the length the answer is for): a trial of a warmup-stable-decay ladder gives one measurement
per rung it reached (`rungs`), the posterior holds every (configuration, length) row, the space's
unmeasured ones and each rung of `lengths` predicted, and the table reads it at `epochs`: a
configuration measured only at shorter lengths has n = 0 there and a predicted mean. The whole
posterior is in `attrs["full"]`, with each row's cost in seconds (the seed policy's price).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from explorer.budget import Budget
from explorer.pareto import pareto_mask
from explorer.posterior import LEVEL, Posterior, at_length, fit, front_share
from explorer.rows import row_key, split_row

FRONT_DRAWS = 2000
DIMS = ("layers", "heads", "width", "mlp")
Candidate = tuple[str, dict[str, Any], int]  # (config key, complete dims, exact params)


def measured_groups(frame: pd.DataFrame, metric: str, first_seed: int = 0) -> pd.DataFrame:
    """The completed measurements of a `trials_frame`, one per configuration, seed and length (a trial stored
    before seeds existed trained with the study's first seed: it reads as `first_seed`; a trial of a
    ladder gives a row per rung it reached, `rungs`, its metric and `epochs` that rung's)."""
    done = frame[frame["state"] == "COMPLETE"].dropna(subset=[metric])
    if "duplicate_of" in done:
        done = done[done["duplicate_of"].isna()]
    seed_of = done["seed"] if "seed" in done else pd.Series(first_seed, index=done.index)
    done = done.assign(seed=seed_of.fillna(first_seed).astype(int))
    if "rungs" in done and done["rungs"].map(bool).any():
        done = done.assign(rung=done["rungs"].map(lambda r: sorted(r.items()) if r else [(None, None)])).explode("rung")
        at = done["rung"].map(lambda r: r[0])
        done = done.assign(epochs=at.where(at.notna(), done.get("epochs")).astype(float),
                           **{metric: done["rung"].map(lambda r: r[1]).where(at.notna(), done[metric]).astype(float)})
    subset = ["arch", "seed", "epochs"] if "epochs" in done else ["arch", "seed"]
    return done.drop_duplicates(subset)


def _records(frame: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """A frame's rows by index label, values as the frame holds them (missing ones stay `pd.NA`, as
    `to_dict` would not keep them): a `.loc` per configuration took most of a summary."""
    columns = {c: frame[c].tolist() for c in frame.columns}
    return {k: {c: v[i] for c, v in columns.items()} for i, k in enumerate(frame.index)}


def _by_seed(rows: Sequence[str], seeds: pd.Series, values: pd.Series) -> dict[str, dict[int, float]]:
    """Each row's value by seed (in the frame's order), in one pass: a groupby's per-group frames cost
    a summary a third of its time."""
    groups: dict[str, dict[int, float]] = {}
    for row, seed, value in zip(rows, seeds.astype(int), values.astype(float)):
        groups.setdefault(row, {})[seed] = value
    return groups


def _dims(row: Mapping[str, Any]) -> dict[str, Any]:
    """A configuration's dimensions: its stored `config`, else the frame's dimension columns."""
    config = row.get("config")
    if isinstance(config, dict) and config:
        return dict(config)
    return {d: row[d] for d in DIMS if d in row and pd.notna(row[d])}


def summarize(frame: pd.DataFrame, metric: str, objectives: Sequence[tuple[str, str]], level: float = LEVEL,
              draws: int = FRONT_DRAWS, seed: int = 0, first_seed: int = 0, candidates: Sequence[Candidate] = (),
              epochs: int | None = None, lengths: Sequence[int] = (), budget: Budget | None = None,
              seeds: Sequence[int] = ()) -> pd.DataFrame:
    """One row per measured configuration of a `trials_frame`, and the posterior in `attrs["posterior"]`.

    Columns: arch, the dimensions, params (and any other objective, averaged), n, seeds, values (by seed),
    raw, mean (also under the metric's name), std (of the runs), se, lo, hi, on_front, front_prob (NaN
    with `draws=0`, for callers that do not need it), tied_with. `candidates` (the space's feasible
    configurations) are in the posterior too, predicted where unmeasured. With runs at several lengths:
    read at `epochs` (default the longest of `lengths` and those measured), every rung of `lengths` in
    the posterior, each row priced by `budget` (a run continuing a seed's shorter run, `seeds` the ones a
    configuration may take: explorer.budget.Budget.continues) from the trials' own seconds.
    """
    done = measured_groups(frame, metric, first_seed)
    if not len(done):
        empty = pd.DataFrame(columns=["arch", "params", "n", "mean", "std", "lo", "hi", "front_prob", "on_front", "tied_with"])
        return empty
    directions = dict(objectives)
    higher = directions.get(metric, "maximize") == "maximize"
    firsts = _records(done.groupby("arch", sort=False).first())
    params = {**{k: int(p) for k, _, p in candidates}, **{k: int(first["params"]) for k, first in firsts.items()}}
    dims = {**{k: dict(d) for k, d, _ in candidates}, **{k: _dims(first) for k, first in firsts.items()}}
    measured_lengths = sorted({int(e) for e in done["epochs"].dropna()}) if "epochs" in done else []
    ladder = sorted({*lengths, *measured_lengths, *([epochs] if epochs else [])})
    if len(ladder) < 2 or not measured_lengths:
        groups = _by_seed(done["arch"], done["seed"], done[metric])
        post = full = fit(groups, params, higher, dims, seed=seed, size=draws or FRONT_DRAWS)
        at, target = done, None
    else:
        target = epochs or ladder[-1]
        timed = done.dropna(subset=["epochs"])
        groups = _by_seed([row_key(k, e) for k, e in zip(timed["arch"], timed["epochs"])], timed["seed"], timed[metric])
        rows = {row_key(k, e): k for k in params for e in ladder}
        row_params, row_dims = {r: params[k] for r, k in rows.items()}, {r: {**dims[k], "epochs": split_row(r)[1]} for r, k in rows.items()}
        full = fit(groups, row_params, higher, row_dims, seed=seed, size=draws or FRONT_DRAWS)
        full = _priced(full, frame, budget or Budget(epochs=ladder), seeds or sorted({int(s) for s in done["seed"]}))
        post = at_length(full, target)
        if len(post.keys) < len(firsts):  # no surface yet to predict a length a configuration did not run at:
            target = max(measured_lengths, key=lambda e: (len(at_length(full, e).keys), e))  # the best-covered length
            post = at_length(full, target)
        groups = {k: groups.get(row_key(k, target), {}) for k in firsts if k in post.index}
        at = done[done["epochs"] == target]
    mean, (lo, hi), sd = post.mean, post.interval(level), post.sd()
    rows = []
    # each configuration's mean of the other objectives over its own runs (at the length read, else at any), one
    # groupby for all: a mask of the whole frame per configuration cost every summary (a policy's, after each trial)
    others = [name for name in directions if name != metric]
    at_own, done_own = (f[["arch", *others]].astype({n: float for n in others}).groupby("arch", sort=False).mean().to_dict("index")
                        for f in (at, done))
    for key, first in firsts.items():
        if key not in groups:
            continue
        values, i = groups[key], post.index[key]
        own = at_own[key] if key in at_own else done_own[key]
        rows.append({"arch": key, **{d: first[d] for d in DIMS if d in first},
                     **{name: own[name] for name in others},
                     "params": int(first["params"]), "n": len(values), "seeds": sorted(values),
                     "values": [values[s] for s in sorted(values)], "raw": float(post.raw[i]),
                     "mean": float(mean[i]), metric: float(mean[i]),
                     "std": float(np.std(list(values.values()), ddof=1)) if len(values) > 1 else float("nan"),
                     "se": float(sd[i]), "lo": float(lo[i]), "hi": float(hi[i])})
    table = pd.DataFrame(rows)
    names, dirs = [n for n, _ in objectives], [d for _, d in objectives]
    table["on_front"] = pareto_mask(table[names].to_numpy(float), dirs)
    cols = [post.index[k] for k in table["arch"]]
    table["front_prob"] = _front_probability(table, post, cols, metric, objectives) if post.has_intervals and draws else np.nan
    table["tied_with"] = _ties(table, post, metric, objectives, level)
    table.attrs["posterior"], table.attrs["full"] = post, full
    table.attrs["epochs"] = target
    return table.sort_values(["params", "arch"], ignore_index=True)


def _priced(full: Posterior, frame: pd.DataFrame, budget: Budget, seeds: Sequence[int]) -> Posterior:
    """`full` with each row's cost: the seconds of the run the queue would start for it now (a seed's shorter run
    continued where one can be: `budget.continues`), at the configuration's seconds per epoch trained (a trial
    that continued trained `budget.compute(epochs, after=resumed_from)` epochs); a configuration not timed yet at
    the timed ones' median seconds per epoch and parameter."""
    done = frame[frame["state"].eq("COMPLETE")] if "state" in frame else frame.iloc[:0]
    timed = done.dropna(subset=["train_time_s", "epochs"]) if {"train_time_s", "epochs"} <= set(done.columns) else done.iloc[:0]
    after = timed["resumed_from"] if "resumed_from" in timed else pd.Series(np.nan, index=timed.index)
    trained = [budget.compute(int(e), None if pd.isna(a) else int(a)) for e, a in zip(timed["epochs"], after)]
    per_epoch = (timed["train_time_s"].astype(float) / np.maximum(trained, 1)).groupby(timed["arch"]).median()
    params = {split_row(k)[0]: p for k, p in zip(full.keys, full.params)}
    per_param = np.median([v / params[k] for k, v in per_epoch.items() if k in params]) if len(per_epoch) else 1e-6
    runs: dict[str, dict[int, list[int]]] = {}
    if {"arch", "seed", "epochs"} <= set(done.columns):
        for key, seed, length in zip(done["arch"], done["seed"], done["epochs"]):
            if pd.notna(seed) and pd.notna(length):
                runs.setdefault(key, {}).setdefault(int(seed), []).append(int(length))
    cost = []
    for key, p in zip(full.keys, full.params):
        config, length = split_row(key)
        took = budget.continues(int(length), runs.get(config, {}), list(seeds)) if length is not None else None
        epochs = budget.compute(int(length), took[1] if took else None) if length is not None else 1
        cost.append(float(per_epoch.get(config, per_param * p)) * epochs)
    return full.priced(np.array(cost))


def _front_probability(table: pd.DataFrame, post: Posterior, cols: list[int], metric: str,
                       objectives: Sequence[tuple[str, str]]) -> np.ndarray:
    """Each configuration's share of the posterior draws in which it is on the Pareto front."""
    names, dirs = [n for n, _ in objectives], [d for _, d in objectives]
    drawn = post.draws[:, cols]
    col = names.index(metric)
    base = table[names].to_numpy(float)
    if len(names) == 2:
        return front_share(drawn, base[:, 1 - col], dirs[col] == "maximize", dirs[1 - col] == "maximize")
    hits = np.zeros(len(table))
    for row in drawn:
        values = base.copy()
        values[:, col] = row
        hits += pareto_mask(values, dirs)
    return hits / len(drawn)


def _dominates(a: Mapping[str, Any], b: Mapping[str, Any], metric: str, objectives: Sequence[tuple[str, str]]) -> bool:
    """Whether `a` is at least as good as `b` in every objective but the metric (means)."""
    for name, direction in objectives:
        if name == metric:
            continue
        if (a[name] > b[name]) if direction == "minimize" else (a[name] < b[name]):
            return False
    return True


def _ties(table: pd.DataFrame, post: Posterior, metric: str, objectives: Sequence[tuple[str, str]], level: float) -> list[str | None]:
    """For each off-front configuration, the cheapest front member dominating it (its mean at least as
    good, and every other objective) that the posterior does not tell apart from it: P(member better) < level."""
    front = table[table["on_front"]].sort_values("params").to_dict("records")  # records: iterrows took seconds at 500 rows
    out: list[str | None] = []
    for row in table.to_dict("records"):
        tied = None
        if not row["on_front"] and post.has_intervals:
            for f in front:
                better = post.sign() * (f["mean"] - row["mean"]) >= 0
                if better and _dominates(f, row, metric, objectives) and np.mean(post.difference(f["arch"], row["arch"]) > 0) < level:
                    tied = f["arch"]
                    break
        out.append(tied)
    return out

