"""Which configurations get another seed: every one up to the maximum (`fixed`), those whose place on the
front is open (`adaptive`), or those whose comparison leaves a budget undecided (`decide`).

All but `fixed` run in rounds once every configuration the study asked for has its first seed.

`adaptive`: a round adds one seed to each configuration that is neither confidently on the Pareto front
(front probability, explorer.stats, at least `confidence`) nor settled off it. A configuration is
settled off the front only when one specific configuration with no more parameters beats it with
probability `confidence` (explorer.stats.compare's `p_better`). A front probability below `1 -
confidence` is not enough: configurations of the same parameter count (heads change no parameters)
split it, so on a plateau every sibling fell below it after one seed and the best were starved (on
digits-vit the three best got 1.4 seeds on average, cheaper ones 2.9).

`decide`: a round adds one seed to both configurations of each budget's undecided comparison
(explorer.recommend.decide: the pick against the runner-up or the baseline), at the budgets the study
names, until every budget is decided or the pair is at the seed cap.

Before any configuration has two seeds there is no noise estimate: `adaptive`'s first round gives a
second seed to the configurations on the one-seed front; `decide` asks its undecided pairs, which then
have no interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from explorer.decisions import DecisionSpec, decide
from explorer.stats import FRONT_DRAWS, compare, groups_of, summarize


class ReplicateSpec(BaseModel):
    """`replicates:` in a study: how the seeds of `budget.seeds` are spent."""

    model_config = ConfigDict(extra="forbid")
    policy: Literal["fixed", "adaptive", "decide"] = "fixed"
    confidence: float = Field(0.9, gt=0.5, lt=1)  # adaptive: membership or defeat counts as settled past this probability


def wanted(summary: pd.DataFrame, max_seeds: int, spec: ReplicateSpec, budgets: Sequence[int] = (),
           baseline: str | None = None, higher_is_better: bool = True, decision: DecisionSpec | None = None) -> list[str]:
    """Configurations of a `stats.summarize` table that should get one more seed now.

    `decide` reads `budgets` (parameter counts; none: `decision`'s default over the measured range), the
    `baseline` configuration, the metric's direction and `decision` (margin, level, seed cap).
    """
    if not len(summary):
        return []
    room = summary["n"] < max_seeds
    if spec.policy == "fixed":
        return list(summary.loc[room, "arch"])
    if spec.policy == "decide":
        return _undecided(summary, max_seeds, budgets, baseline, higher_is_better, decision or DecisionSpec())
    if summary["front_prob"].isna().all():  # no replicate yet: no noise estimate
        return list(summary.loc[room & summary["on_front"] & (len(summary) > 1), "arch"])
    sure = summary["front_prob"] >= spec.confidence
    beaten = _beaten(summary, spec.confidence, higher_is_better)
    return list(summary.loc[room & ~sure & ~beaten, "arch"])


def _beaten(summary: pd.DataFrame, confidence: float, higher_is_better: bool) -> pd.Series:
    """Whether some configuration with no more parameters beats each one with probability `confidence`."""
    groups, noise = groups_of(summary), summary.attrs["noise"]
    out = []
    for row in summary.itertuples():
        cheaper = summary.loc[(summary["params"] <= row.params) & (summary["arch"] != row.arch), "arch"]
        out.append(any(compare(groups[k], groups[row.arch], higher_is_better, prior=noise.prior(k, row.arch)).p_better
                       >= confidence for k in cheaper))
    return pd.Series(out, index=summary.index)


def _undecided(summary: pd.DataFrame, max_seeds: int, budgets: Sequence[int], baseline: str | None,
               higher_is_better: bool, decision: DecisionSpec) -> list[str]:
    """Both configurations of every undecided budget's comparison that still have room under the cap."""
    cap = min(max_seeds, decision.max_seeds or max_seeds)
    n = dict(zip(summary["arch"], summary["n"]))
    sign = 1.0 if higher_is_better else -1.0
    out: dict[str, None] = {}
    for budget in budgets or decision.budget_list(summary["params"].astype(int).tolist()):
        inside = summary[summary["params"] <= budget]
        if not len(inside):
            continue
        pick = inside.assign(_s=sign * inside["mean"]).sort_values(["_s", "params"], ascending=[False, True])["arch"].iloc[0]
        delta = decision.margin(higher_is_better, float(inside.loc[inside["arch"] == pick, "mean"].iloc[0]))
        said = decide(summary, budget, pick, baseline, higher_is_better, delta, decision.level)
        if said and not said[0].decided:
            out.update({k: None for k in (said[0].a, said[0].b) if n[k] < cap})
    return list(out)


def replay(tables: dict[str, dict[int, float]], params: dict[str, int], seeds: Sequence[int], spec: ReplicateSpec,
           objectives: Sequence[tuple[str, str]] = (("accuracy", "maximize"), ("params", "minimize")),
           draws: int = FRONT_DRAWS, budgets: Sequence[int] = (), baseline: str | None = None,
           decision: DecisionSpec | None = None) -> dict[str, list[int]]:
    """Run the policy on known results: `tables[key][seed]` is the metric a run would give.

    Returns the seeds each configuration ended with. What `bench/stability.py` and the tests use to
    measure the policy without training; studies run the same `wanted` on their stored trials.
    """
    metric = objectives[0][0]
    higher = dict(objectives)[metric] == "maximize"
    budgets = budgets or (decision or DecisionSpec()).budget_list(list(params.values()))
    got = {key: [seeds[0]] for key in tables}
    while True:
        frame = pd.DataFrame([{"state": "COMPLETE", "arch": k, "seed": s, "params": params[k], metric: tables[k][s]}
                              for k, ss in got.items() for s in ss])
        summary = summarize(frame, metric, objectives, draws=0 if spec.policy == "decide" else draws)
        more = wanted(summary, len(seeds), spec, budgets, baseline, higher, decision)
        if not more:
            return got
        for key in more:
            got[key].append(seeds[len(got[key])])


def seeds_by_rank(got: dict[str, list[int]], truth: dict[str, float], top: int = 3) -> tuple[float, float]:
    """Mean seeds of the `top` configurations by true mean, and of the rest: where a policy spends."""
    order = sorted(truth, key=truth.get, reverse=True)
    best, rest = order[:top], order[top:]
    return float(np.mean([len(got[k]) for k in best])), float(np.mean([len(got[k]) for k in rest]))
