"""Which configurations get another seed: every one up to the maximum (`fixed`), or only where it can
change the answer (`adaptive`).

Adaptive replicates run in rounds once every configuration the study asked for has its first seed. A
round adds one seed to each configuration whose Pareto-front membership is still uncertain: its front
probability (explorer.stats) lies strictly between `1 - confidence` and `confidence`. A configuration
on the front is a budget's answer, so this is also where the ranking within a parameter budget is
uncertain. Rounds end when none is uncertain or each uncertain one has the maximum seeds. Before any
configuration has two seeds there is no noise estimate: the first round gives a second seed to the
configurations on the one-seed front, the ones the answer rests on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from explorer.stats import FRONT_DRAWS, summarize


class ReplicateSpec(BaseModel):
    """`replicates:` in a study: how the seeds of `budget.seeds` are spent."""

    model_config = ConfigDict(extra="forbid")
    policy: Literal["fixed", "adaptive"] = "fixed"
    confidence: float = Field(0.9, gt=0.5, lt=1)  # adaptive: front membership counts as settled past this probability


def wanted(summary: pd.DataFrame, max_seeds: int, spec: ReplicateSpec) -> list[str]:
    """Configurations of a `stats.summarize` table that should get one more seed now."""
    if not len(summary):
        return []
    room = summary["n"] < max_seeds
    if spec.policy == "fixed":
        return list(summary.loc[room, "arch"])
    if summary["front_prob"].isna().all():  # no replicate yet: no noise estimate
        return list(summary.loc[room & summary["on_front"] & (len(summary) > 1), "arch"])
    p = summary["front_prob"]
    open_ = (p > 1 - spec.confidence) & (p < spec.confidence)
    return list(summary.loc[room & open_, "arch"])


def replay(tables: dict[str, dict[int, float]], params: dict[str, int], seeds: Sequence[int], spec: ReplicateSpec,
           objectives: Sequence[tuple[str, str]] = (("accuracy", "maximize"), ("params", "minimize")),
           draws: int = FRONT_DRAWS) -> dict[str, list[int]]:
    """Run the policy on known results: `tables[key][seed]` is the metric a run would give.

    Returns the seeds each configuration ended with. What `bench/stability.py` and the tests use to
    measure the policy without training; studies run the same `wanted` on their stored trials.
    """
    metric = objectives[0][0]
    got = {key: [seeds[0]] for key in tables}
    while True:
        frame = pd.DataFrame([{"state": "COMPLETE", "arch": k, "seed": s, "params": params[k], metric: tables[k][s]}
                              for k, ss in got.items() for s in ss])
        more = wanted(summarize(frame, metric, objectives, draws=draws), len(seeds), spec)
        if not more:
            return got
        for key in more:
            got[key].append(seeds[len(got[key])])
