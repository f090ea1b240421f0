"""What the report reads from a study: its metric and objectives, its completed measurements, and
each configuration's statistics (`explorer.stats.summarize`).

Every figure and table that speaks of a configuration reads it from `summaries`; nothing in the
dashboard averages trials. This module must not draw or write HTML, and must not compute a statistic
itself: intervals, front probabilities and ties are `explorer.stats`'s.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from explorer.decisions import Answer, DecisionSpec, answer, distinct
from explorer.pareto import DEFAULT_OBJECTIVES
from explorer.posterior import at_length
from explorer.stats import summarize


def objectives(meta: dict[str, Any]) -> list[tuple[str, str]]:
    """(column, direction) pairs from pairs, {"name":, "direction":} mappings (the study's user
    attr) or "maximize accuracy" strings (the study YAML)."""
    out = []
    for item in meta.get("objectives") or DEFAULT_OBJECTIVES:
        if isinstance(item, str):
            direction, name = item.split(None, 1)
        elif isinstance(item, dict):
            name, direction = item["name"], item["direction"]
        else:
            name, direction = item
        out.append((str(name), str(direction)))
    return out


def metric_of(meta: dict[str, Any]) -> tuple[str, bool]:
    """The study's metric and whether higher is better."""
    metric = str(meta.get("metric", "accuracy"))
    higher = meta.get("higher_is_better", dict(objectives(meta)).get(metric, "maximize") == "maximize")
    return metric, bool(higher)


def first_seed(meta: dict[str, Any]) -> int:
    """The seed of a trial stored without one: it trained with the study's first seed (`meta["first_seed"]`)."""
    return int(meta.get("first_seed", 0))


def completed(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The completed trials that measured the metric and counted their parameters."""
    return df[df["state"] == "COMPLETE"].dropna(subset=[metric, "params"])


def measurements(done: pd.DataFrame, meta: dict[str, Any]) -> pd.DataFrame:
    """The completed measurements, one per configuration and seed, as `stats.summarize` counts them."""
    if "duplicate_of" in done:
        done = done[done["duplicate_of"].isna()]
    first = first_seed(meta)
    seeds = done["seed"] if "seed" in done else pd.Series(first, index=done.index)
    return done.assign(seed=seeds.fillna(first).astype(int)).drop_duplicates(["arch", "seed"])


def _study_objectives(meta: dict[str, Any], df: pd.DataFrame) -> list[tuple[str, str]]:
    """The study's objectives that its frame holds, the metric always among them."""
    metric, higher = metric_of(meta)
    objs = [(name, direction) for name, direction in objectives(meta) if name in df]
    if metric not in dict(objs):
        objs.insert(0, (metric, "maximize" if higher else "minimize"))
    return objs


def length_options(meta: dict[str, Any]) -> dict[str, Any]:
    """What `summarize` needs of a study that trains several lengths (`meta["epochs"]`, `lengths`, `budget`, `seeds`)."""
    return {k: meta[k] for k in ("epochs", "lengths", "budget", "seeds") if meta.get(k)}


def summaries(frames: dict[str, pd.DataFrame], meta: dict[str, dict]) -> dict[str, pd.DataFrame]:
    """Each study's `stats.summarize` table (one row per configuration): what the front, the heatmap,
    the learning curves, the summary and the tables read; raw trials are never averaged here."""
    out = {}
    for name, df in frames.items():
        metric, _ = metric_of(meta[name])
        done = completed(df, metric) if metric in df else df.iloc[0:0]
        out[name] = (summarize(done, metric, _study_objectives(meta[name], df), first_seed=first_seed(meta[name]),
                               candidates=meta[name].get("candidates") or (), **length_options(meta[name]))
                     if len(done) else pd.DataFrame())
    return out


def is_replicated(summary: pd.DataFrame) -> bool:
    """Whether any configuration has more than one seed (else there is no interval anywhere)."""
    return bool(len(summary)) and bool((summary["n"] > 1).any())


def answers(summary: pd.DataFrame, meta: dict[str, Any], epochs: int | None = None) -> list[tuple[list[int], Answer]]:
    """The study's answer at each of its budgets (`meta["budgets"]`, else the decision defaults over its
    configurations), budgets holding the same configurations once, from the summary's posterior (read at
    `epochs` where the study trains several lengths; default the summary's own)."""
    if not len(summary):
        return []
    post = summary.attrs["posterior"] if epochs is None else at_length(summary.attrs["full"], epochs)
    decision = meta.get("decision") or DecisionSpec()
    _, higher = metric_of(meta)
    budgets = meta.get("budgets") or decision.budget_list([int(p) for p in post.params])
    best = float(post.sign() * (post.sign() * summary["mean"]).max())
    delta = decision.margin(higher, best)
    return [(at, answer(post, at[-1], meta.get("baseline"), delta, decision.level, cap=meta.get("seed_cap"))) for at in distinct(post, budgets).values()]
