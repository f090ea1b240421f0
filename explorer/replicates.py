"""Which configurations get another seed: every one up to the maximum (`fixed`), those whose place on the
front is open (`adaptive`), or those whose next seed most shrinks an undecided budget's regret bound
(`decide`).

All but `fixed` run in rounds once every configuration the study asked for has its first seed (or, with
several workers, has it in flight). A round reads the results stored so far and skips a configuration
whose run is still in flight: rounds overlap rather than wait for their slowest trial, as ASHA's
promotions do (explorer.study.queue).

`adaptive`: a round adds one seed to each configuration that is neither confidently on the Pareto front
(front probability at least `confidence`) nor settled off it. A configuration is settled off the front
only when one specific configuration with no more parameters beats it with probability `confidence`
(from the posterior's draws of their difference). A front probability below `1 - confidence` is not
enough: configurations of the same parameter count (heads change no parameters) split it, so on a
plateau every sibling fell below it after one seed and the best were starved.

`decide` (explorer.policy.next_seeds): a round gives one seed each to the configurations whose seed
most shrinks the regret bounds still above the margin at the study's budgets (budgets holding the same
configurations count once), until every budget is decided, no seed would shrink a bound, or the
configurations that matter are at the seed cap (`decision.max_seeds`, else `budget.seeds`). Before any
configuration has two seeds there is no noise estimate: the first round gives the two best means of
each question their second seed. The space's baseline also gets a seed per round while a verdict
against it (non-inferior, say) rests on fewer of its seeds than the pick has.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from explorer.decisions import DecisionSpec
from explorer.policy import next_seeds
from explorer.posterior import Posterior
from explorer.stats import FRONT_DRAWS, summarize


class ReplicateSpec(BaseModel):
    """`replicates:` in a study: how the seeds of `budget.seeds` are spent."""

    model_config = ConfigDict(extra="forbid")
    policy: Literal["fixed", "adaptive", "decide"] = Field(
        "fixed", description="`fixed`: every seed everywhere; `adaptive`: seeds where front membership is unsettled; "
                             "`decide`: seeds where they most shrink an undecided budget's regret bound")
    confidence: float = Field(0.9, gt=0.5, lt=1, description="`adaptive` only: membership or defeat counts as settled "
                                                             "past this probability")


def wanted(summary: pd.DataFrame, max_seeds: int, spec: ReplicateSpec, budgets: Sequence[int] = (),
           decision: DecisionSpec | None = None, baseline: str | None = None, batch: int | None = None,
           pending: Mapping[str, int] | None = None) -> list[str]:
    """Configurations of a `stats.summarize` table that should get one more seed now.

    `decide` reads the table's posterior, `budgets` (parameter counts; none: `decision`'s default over
    the space), `decision` (margin, level, seed cap) and the space's `baseline`; `batch`: at most this
    many runs (the free workers), `pending`: the runs in flight per row (queued or running), which count
    against the cap.
    """
    if not len(summary):
        return []
    room = summary["n"] < max_seeds
    if spec.policy == "fixed":
        return list(summary.loc[room, "arch"])
    post: Posterior = summary.attrs["posterior"]
    if spec.policy == "decide":
        return wanted_keys(post, max_seeds, budgets, decision or DecisionSpec(), baseline,
                           summary.attrs.get("full"), summary.attrs.get("epochs"), batch, pending)
    if summary["front_prob"].isna().all():  # no replicate yet: no noise estimate
        return list(summary.loc[room & summary["on_front"] & (len(summary) > 1), "arch"])
    sure = summary["front_prob"] >= spec.confidence
    beaten = _beaten(summary, post, spec.confidence)
    return list(summary.loc[room & ~sure & ~beaten, "arch"])


def wanted_keys(post: Posterior, max_seeds: int, budgets: Sequence[int], decision: DecisionSpec,
                baseline: str | None = None, full: Posterior | None = None, epochs: int | None = None,
                batch: int | None = None, pending: Mapping[str, int] | None = None) -> list[str]:
    """The `decide` policy on a posterior: the configurations that get one more seed now; with several
    lengths (`full`, read at `epochs`), the rows (a configuration at a length) that get one more run.
    `batch` and `pending` as in `wanted`."""
    cap = min(max_seeds, decision.max_seeds or max_seeds)
    pending = pending or {}
    measured = post.n > 0
    room = {k: int(cap - n - pending.get(k, 0)) for k, n, m in zip(post.keys, post.n, measured) if m}
    best = float(np.nanmax(post.sign() * post.mean[measured])) * post.sign() if measured.any() else \
        float(np.nanmax(post.sign() * post.mean)) * post.sign()
    delta = decision.margin(post.higher_is_better, best)
    at = budgets or decision.budget_list([int(p) for p in post.params])
    if full is not None and epochs is not None and full is not post:
        rows = {k: int(cap - n - pending.get(k, 0)) for k, n in zip(full.keys, full.n)}
        return next_seeds(full, at, delta, decision.level, rows, batch, baseline=baseline, epochs=epochs, pending=pending)
    return next_seeds(post, at, delta, decision.level, room, batch, baseline=baseline, pending=pending)


def _beaten(summary: pd.DataFrame, post: Posterior, confidence: float) -> pd.Series:
    """Whether some configuration with no more parameters beats each one with probability `confidence`."""
    if not post.has_intervals:
        return pd.Series(False, index=summary.index)
    out = []
    for row in summary.itertuples():
        cheaper = summary.loc[(summary["params"] <= row.params) & (summary["arch"] != row.arch), "arch"]
        out.append(any(float(np.mean(post.difference(k, row.arch) > 0)) >= confidence for k in cheaper))
    return pd.Series(out, index=summary.index)


def replay(tables: dict[str, dict[int, float]], params: dict[str, int], seeds: Sequence[int], spec: ReplicateSpec,
           objectives: Sequence[tuple[str, str]] = (("accuracy", "maximize"), ("params", "minimize")),
           draws: int = FRONT_DRAWS, budgets: Sequence[int] = (), decision: DecisionSpec | None = None,
           dims: dict[str, dict[str, int]] | None = None) -> dict[str, list[int]]:
    """Run the policy on known results: `tables[key][seed]` is the metric a run would give (`dims`: each
    configuration's dimensions, for the surface). Returns the seeds each configuration ended with. What
    `bench/stability.py` and the tests use to measure the policy without training; studies run the
    same `wanted` on their stored trials."""
    metric = objectives[0][0]
    budgets = budgets or (decision or DecisionSpec()).budget_list(list(params.values()))
    got = {key: [seeds[0]] for key in tables}
    while True:
        frame = pd.DataFrame([{"state": "COMPLETE", "arch": k, "seed": s, "params": params[k], metric: tables[k][s],
                               **(dims or {}).get(k, {})} for k, ss in got.items() for s in ss])
        summary = summarize(frame, metric, objectives, draws=draws)
        more = wanted(summary, len(seeds), spec, budgets, decision)
        if not more:
            return got
        for key in more:
            got[key].append(seeds[len(got[key])])


def seeds_by_rank(got: dict[str, list[int]], truth: dict[str, float], top: int = 3) -> tuple[float, float]:
    """Mean seeds of the `top` configurations by true mean, and of the rest: where a policy spends."""
    order = sorted(truth, key=truth.get, reverse=True)
    best, rest = order[:top], order[top:]
    return float(np.mean([len(got[k]) for k in best])), float(np.mean([len(got[k]) for k in rest]))
