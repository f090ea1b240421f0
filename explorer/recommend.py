"""The split to use for a parameter budget, and how sure the study is: one answer, from one posterior.

`recommend` summarises the study once (explorer.stats.summarize: the posterior of every configuration,
measured or predicted by the surface) and asks explorer.decisions for the budget's answer: "use X:
within eps points of the best configuration within the budget (95%)", decided when eps <= delta, the
verdict of X against the baseline from the same draws, and for an undecided budget which
configurations and how many seeds would decide it. Everything it prints is about X. A configuration no
trial measured can be X only when the surface's prediction makes its bound the smallest; it is then
marked predicted, with `--verify` to measure it and its neighbours.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd

from explorer.decisions import Answer, DecisionSpec, answer
from explorer.errors import ExplorerError
from explorer.formats import dims_of, interval, margin, plural, split, split_header, value
from explorer.posterior import LEVEL, Posterior
from explorer.stats import Candidate, summarize
from explorer.units import format_count


@dataclass(frozen=True)
class Recommendation:
    """What to build for `budget`, its bound, its verdict against the baseline, and how sure the model is."""

    budget: int
    key: str
    dims: dict[str, Any]
    params: int
    metric: str
    value: float  # posterior mean of its metric
    lo: float  # its 95% interval (NaN: no noise estimate yet)
    hi: float
    kind: Literal["measured", "predicted"]
    answer: Answer
    n: int = 0  # seeds measured
    raw: float = math.nan  # plain mean over those seeds
    trial: int | None = None  # the first trial that measured it
    model: str = ""  # the posterior's model, in words
    tied: tuple[str, ...] = ()  # configurations within budget not told apart from it (95% interval of the difference holds 0)
    tied_params: tuple[int, ...] = ()
    equivalent: tuple[str, ...] = ()  # those of `tied` within delta of it (90% interval)
    list_ties: bool = False
    verify: tuple[str, ...] = ()  # study configs around it: `--verify` queues the unmeasured ones
    higher_is_better: bool = True
    space_max: int | None = None  # the space's largest configuration, when the budget is at or past it
    beyond: tuple[str, ...] = ()  # the shape law's answer past the measured range (explorer.extrapolate)
    outside: str | None = None  # its predicted best, when past the space's declared ranges (`--verify` trains it)
    pruned: tuple[str, ...] = ()  # configurations within budget pruned and never completed

    @property
    def decided(self) -> bool:
        return self.answer.decided

    @property
    def eps(self) -> float:
        return self.answer.eps

    @property
    def delta(self) -> float:
        return self.answer.delta

    @property
    def layers(self) -> int:
        return int(self.dims["layers"])

    @property
    def heads(self) -> int:
        return int(self.dims["heads"])

    def units(self) -> tuple[float, str]:
        """Points for an accuracy-like metric, the metric's own units otherwise."""
        return (100.0, "points") if self.higher_is_better else (1.0, self.metric)

    def lines(self) -> list[str]:
        """The answer first (pick, bound, decided or not), then its value, the verdict, what would decide it."""
        unit, what = self.units()
        free = dims_of(self.key)
        shape = ", ".join(f"{d} {self.dims[d]}" for d in ("mlp", "width") if self.dims.get(d) is not None and d not in free)
        said = self.answer.words(unit, what)
        pick = split(self.key)
        label = "; ".join(filter(None, (split_header(free) if free else "", shape)))
        out = [f"budget {format_count(self.budget)}: {said[0]}",
               f"{pick}{f' ({label})' if label else ''}, {format_count(self.params)} params, {self._value()}"]
        if self.model:
            out.append(f"model: {self.model}")
        out += said[1:]
        if self.tied:
            smaller = (f"; the smallest: {split(self.tied[0])}, {format_count(self.tied_params[0])} params"
                       if self.tied_params[0] < self.params else "; none of them is smaller")
            out.append(f"{plural(len(self.equivalent), 'configuration')} within budget equivalent to {pick} within "
                       f"{margin(self.delta, unit, what, exact=True)}; {len(self.tied) - len(self.equivalent)} more not told apart "
                       f"from it{smaller}")
            if self.list_ties:
                out.append("not told apart from it:")
                out += [f"  {split(k)} ({format_count(p)} params{', equivalent' if k in self.equivalent else ''})"
                        for k, p in zip(self.tied, self.tied_params)]
        around = [split(k) for k in self.verify if k != self.key]
        if self.kind == "predicted" or around:
            out.append(f"to check it, measure {'it and ' if self.kind == 'predicted' else ''}its neighbours "
                       f"(`explorer recommend ... --verify` queues them): {', '.join(around) or pick}")
        if self.pruned:
            out.append(f"pruned within budget, never completed (a pruned configuration comes back once when the "
                       f"evidence against it weakens): {', '.join(map(split, self.pruned))}")
        if self.space_max is not None:
            out.append(f"the budget binds nothing in the space: its largest configuration has {format_count(self.space_max)} "
                       "params, so within the space this is the answer at that size")
        return out + list(self.beyond)

    def _value(self) -> str:
        like = self.higher_is_better
        metric = f"{self.metric} {value(self.value, like)}"
        if not math.isfinite(self.lo):
            return (f"{metric} (measured at {plural(self.n, 'seed')}; one seed per configuration: no "
                    "interval yet, a second seed of some configurations gives one)")
        said = interval(self.lo, self.hi, like, f"{LEVEL:.0%} interval")
        if self.kind == "predicted":
            return f"{metric} ({said}; predicted by the surface, not measured)"
        return f"{metric} ({said}; measured at {plural(self.n, 'seed')}, plain mean {value(self.raw, like)}, trial {self.trial} first)"


def _neighbours(key: str, known: pd.DataFrame, budget: int) -> tuple[str, ...]:
    """Configs of `known` one step away in layers and/or heads at the same width and mlp."""
    known = known.fillna({"width": -1, "mlp": -1})
    me = known[known["arch"] == key].iloc[0]
    same = known[(known["width"] == me["width"]) & (known["mlp"] == me["mlp"]) & (known["params"] <= budget)]
    step = {}
    for dim in ("layers", "heads"):
        values = sorted(same[dim].unique())
        rank = {v: i for i, v in enumerate(values)}
        step[dim] = (same[dim].map(rank) - rank[me[dim]]).abs()
    near = same[(step["layers"] <= 1) & (step["heads"] <= 1)].sort_values(["layers", "heads"])
    return tuple(dict.fromkeys(near["arch"]))


def _known(done: pd.DataFrame, candidates: Sequence[Candidate]) -> pd.DataFrame:
    """Every config the study measured or could run: arch, dims and params."""
    cols = ["arch", "layers", "heads", "width", "mlp", "params"]
    rows = done[[c for c in cols if c in done]].to_dict("records") + [
        {"arch": k, **{d: dims.get(d) for d in cols[1:5]}, "params": p} for k, dims, p in candidates]
    return pd.DataFrame(rows, columns=cols).drop_duplicates("arch")


def _ties(post: Posterior, pick: str, keys: Sequence[str], delta: float, level: float) -> tuple[list[tuple[int, float, str]], list[str]]:
    """Configurations of `keys` the posterior does not tell from the pick (the `level` interval of the
    difference holds 0), by params then mean, and those equivalent to it within `delta` (90% interval)."""
    tied, equivalent = [], []
    for key in keys:
        if key == pick or post.n[post.index[key]] == 0:
            continue
        d = post.difference(pick, key)
        lo, hi, lo90, hi90 = np.quantile(d, [(1 - level) / 2, (1 + level) / 2, 1 - level, level])
        if lo <= 0 <= hi:
            tied.append((int(post.params[post.index[key]]), -post.sign() * float(post.mean[post.index[key]]), key))
            if -delta < lo90 and hi90 < delta:
                equivalent.append(key)
    return sorted(tied), equivalent


def describe(post: Posterior) -> str:
    """The posterior's model in one line: the surface and its check, or why there is none."""
    if post.model == "none":
        return ""
    parts = []
    if post.model == "smooth" and post.check is not None:
        parts.append(f"measured means shrunk towards a smooth surface over the free dimensions (held-out seeds inside "
                     f"their 95% intervals: {post.check.inside} of {post.check.held_out})")
    elif post.note:
        parts.append(post.note)
    else:
        parts.append("per-configuration means")
    return "; ".join(parts + [post.noise.describe()]) if post.noise is not None else "; ".join(parts)


def recommend(df: pd.DataFrame, budget: int, baseline_key: str | None, metric: str = "accuracy",
              candidates: Sequence[Candidate] = (), higher_is_better: bool = True, decision: DecisionSpec | None = None,
              list_ties: bool = False, first_seed: int = 0, cap: int | None = None) -> Recommendation:
    """The answer at `budget` from a `trials_frame`: the pick with its bound, decided or not, its verdict
    against the baseline; `candidates` (the space's feasible configurations) are predicted where
    unmeasured and count among "the configurations within the budget"; more seeds are offered only below `cap`."""
    decision = decision or DecisionSpec()
    done = df[df["state"] == "COMPLETE"].dropna(subset=[metric, "params"])
    if "duplicate_of" in done:
        done = done[done["duplicate_of"].isna()]
    direction = "maximize" if higher_is_better else "minimize"
    table = summarize(done, metric, [(metric, direction), ("params", "minimize")], level=decision.level, draws=0,
                      first_seed=first_seed, candidates=candidates)
    if not len(table):
        raise ExplorerError("no completed trial to recommend from", field="budget")
    post: Posterior = table.attrs["posterior"]
    best = float(np.nanmax(post.sign() * table["mean"])) * post.sign()
    delta = decision.margin(higher_is_better, best)
    said = answer(post, budget, baseline_key, delta, decision.level, cap=cap)
    key = said.pick
    i = post.index[key]
    lo, hi = post.interval(decision.level)
    measured = post.n[i] > 0
    dims = next((dict(d) for k, d, _ in candidates if k == key), None)
    if dims is None:
        row = table[table["arch"] == key].iloc[0]
        dims = {d: (None if pd.isna(row.get(d)) else int(row[d])) for d in ("layers", "heads", "width", "mlp") if d in row}
    first = done.groupby("arch")["number"].min() if "number" in done and len(done) else pd.Series(dtype=int)
    inside = [k for k in said.regret.keys if k != key]
    tied, equivalent = _ties(post, key, inside, delta, decision.level)
    space = max((p for _, _, p in candidates), default=None)
    return Recommendation(
        budget=int(budget), key=key, dims=dims, params=int(post.params[i]), metric=metric,
        value=float(post.mean[i]), lo=float(lo[i]), hi=float(hi[i]), kind="measured" if measured else "predicted",
        answer=said, n=int(post.n[i]), raw=float(post.raw[i]), trial=int(first[key]) if key in first else None,
        model=describe(post), tied=tuple(k for _, _, k in tied), tied_params=tuple(p for p, _, _ in tied),
        equivalent=tuple(k for _, _, k in tied if k in equivalent), list_ties=list_ties,
        verify=_neighbours(key, _known(done, candidates), budget), higher_is_better=higher_is_better,
        space_max=space if space is not None and budget >= space else None)
