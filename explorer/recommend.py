"""The split to use for a parameter budget, and how sure the study is: one answer, from one posterior.

`recommend` summarises the study once (explorer.stats.summarize: the posterior of every configuration,
measured or predicted by the surface) and asks explorer.decisions for the budget's answer: "use X:
within eps points of the best configuration within the budget (95%)", decided when eps <= delta, the
verdict of X against the baseline from the same draws, and for an undecided budget which
configurations and how many seeds would decide it. Everything it prints is about X. A configuration no
trial measured can be X only when the surface's prediction makes its bound the smallest; it is then
marked predicted, with `--verify` to measure it and its neighbours.

The answer is at one training length: the study's target (`decision.epochs`, default the longest it
trains) or any other (`epochs`), read off the same posterior, which spans the lengths a ladder trains.
Past the space the same posterior answers too: the splits past its declared ranges that fit the
budget (`outside`, explorer.space.widened) are candidates like the space's unmeasured ones, predicted by
the surface with an interval that widens with distance, so the answer is one "use" line; it names a
split past the space only when the surface shows it better, and otherwise says which to measure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd

from explorer.budget import Budget
from explorer.decisions import Answer, DecisionSpec, answer, within
from explorer.errors import ExplorerError
from explorer.formats import dims_of, epochs_words, interval, margin, plural, split, split_header, value
from explorer.learning import said as learning_words
from explorer.posterior import LEVEL, Posterior
from explorer.pruning import pruned_within
from explorer.space import widened
from explorer.stats import Candidate, summarize
from explorer.transfer import LENGTH_REACH, SIZE_REACH, length_refusal, size_refusal
from explorer.units import format_count

if TYPE_CHECKING:
    from explorer.study import Study


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
    outside: str | None = None  # the pick, when it is past the space's declared ranges (`--verify` trains it)
    past: tuple[str, ...] = ()  # splits past the space that may be better than the pick (the next to measure)
    pruned: tuple[str, ...] = ()  # configurations within budget pruned and never completed
    epochs: int | None = None  # the length the answer is for, where the study trains several
    shorter: tuple[tuple[int, int], ...] = ()  # predicted at `epochs`: its runs at other lengths, (epochs, seeds)
    notes: tuple[str, ...] = ()  # what else the reader must know (a refusal past the reach)
    learning: str | None = None  # the runs were still learning when they stopped, in words (`--explain`)
    ladder: tuple[int, ...] = ()  # the lengths the study trains

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

    def lines(self, explain: bool = False) -> list[str]:
        """The answer in a few lines: the pick with its bound (decided or not) and its value, the verdict against
        the baseline, and what would decide it or what to do next (for a decided, measured pick, nothing: at
        most 6 lines at 80 columns). `explain` adds the posterior's model, what lies past the space, the ties,
        the neighbours to measure, pruned configurations and whether the runs still learn; without it, a last
        line names what it would add."""
        unit, what = self.units()
        said = self.answer.words(unit, what)
        at = f" at {epochs_words(self.epochs)}" if self.epochs is not None else ""
        out = [f"budget {format_count(self.budget)}{at}: {said[0]}", self._value()]
        if explain:
            out += [line for line in (self._detail(), f"model: {self.model}" if self.model else "") if line]
        rest = said[1:]
        off = bool(rest) and self._off_ladder() and rest[-1] == self.answer.seeds_words()
        if off:  # not the cap: no run of the study is at this length
            rest[-1] = (f"{epochs_words(self.epochs)} is not a length the study trains ({', '.join(map(str, self.ladder))} "
                        f"epochs): `explorer recommend ... --verify --epochs {self.epochs}` trains the pick and its "
                        "rivals there, or add it to budget.epochs")
        out += rest
        steps = self._next_steps(checked=off)  # a decided, measured pick needs none of them to be acted on
        details = [("past the space", steps if self.decided and self.kind == "measured" else []), *self._details(unit, what)]
        out += [] if details[0][1] else steps
        out += [line for name, lines in details if explain or (name == "ties" and self.list_ties) for line in lines]
        hidden = [name for name, lines in details if lines and not explain and not (name == "ties" and self.list_ties)]
        hidden = ["the model", *hidden] if self.model and not explain else hidden
        return out + ([f"--explain says more: {', '.join(hidden)}"] if hidden else [])

    def _off_ladder(self) -> bool:
        """Undecided at a length the study does not train, with no run of it to buy."""
        return (self.epochs is not None and bool(self.ladder) and self.epochs not in self.ladder and not self.decided
                and not self.answer.advice)

    def _next_steps(self, checked: bool = False) -> list[str]:
        """What the reader must know to act on the answer: a refusal, a pick past the space or predicted (unless
        `checked`: a line above said how to measure it), the splits past the space to measure next, a budget
        that binds nothing."""
        pick, out = split(self.key), []
        if self.outside is not None:
            out.append(f"{pick} is past the space's declared ranges (its fixed dimensions and constraints kept): "
                       "`explorer recommend ... --verify` trains it at the study's budget, in a study of its own")
        elif self.past:
            out.append(f"splits past the space that the surface cannot tell from it yet (measure the first: add it to "
                       f"the space): {', '.join(map(split, self.past))}")
        if not checked:
            out += self._to_measure()
        if self.space_max is not None and not self.past and self.outside is None:
            out.append(f"the budget binds nothing in the space: its largest configuration has {format_count(self.space_max)} "
                       "params, so within the space this is the answer at that size")
        return out + list(self.notes)

    def _to_measure(self) -> list[str]:
        """How to measure a predicted pick: at a length the study does not train, a study of its own at it; else
        it and its neighbours, queued in the study."""
        if self.kind != "predicted" or self.outside is not None:
            return []
        if self.shorter and self.epochs not in self.ladder:
            return [f"to check it at {epochs_words(self.epochs)}: `explorer recommend ... --verify --epochs "
                    f"{self.epochs}` trains it and its rivals there"]
        around = [split(k) for k in self.verify if k != self.key]
        return [f"to check it, measure it{' and its neighbours' if around else ''} (`explorer recommend ... "
                f"--verify` queues {'them' if around else 'it'}){': ' + ', '.join(around) if around else ''}"]

    def _details(self, unit: float, what: str) -> list[tuple[str, list[str]]]:
        """What `--explain` adds, by name: the ties, the neighbours of a measured pick, pruned configurations, how
        the runs learn (`--list-ties` shows the ties without it)."""
        pick, ties, near = split(self.key), [], []
        if self.tied:
            smaller = (f"; the smallest: {split(self.tied[0])}, {format_count(self.tied_params[0])} params"
                       if self.tied_params[0] < self.params else "; none of them is smaller")
            ties.append(f"{plural(len(self.equivalent), 'configuration')} within budget equivalent to {pick} within "
                        f"{margin(self.delta, unit, what, exact=True)}; {len(self.tied) - len(self.equivalent)} more not "
                        f"told apart from it{smaller}")
            if self.list_ties:
                ties.append("not told apart from it:")
                ties += [f"  {split(k)} ({format_count(p)} params{', equivalent' if k in self.equivalent else ''})"
                         for k, p in zip(self.tied, self.tied_params)]
        around = [split(k) for k in self.verify if k != self.key]
        if around and self.kind == "measured" and self.outside is None:
            near.append(f"to check it, measure its neighbours (`explorer recommend ... --verify` queues them): "
                        f"{', '.join(around)}")
        pruned = [f"pruned within budget, never completed (a pruned configuration comes back once when the evidence "
                  f"against it weakens): {', '.join(map(split, self.pruned))}"] if self.pruned else []
        return [("ties", ties), ("neighbours", near), ("pruned", pruned), ("learning", [self.learning] if self.learning else [])]

    def _value(self) -> str:
        """The pick's size and value with its interval and where it comes from, in one line where it fits."""
        like = self.higher_is_better
        head = f"{split(self.key)}: {format_count(self.params)} params, {self.metric} {value(self.value, like)}"
        if not math.isfinite(self.lo):
            return f"{head} ({plural(self.n, 'seed')}; no interval yet: a second seed of some configurations gives one)"
        said = interval(self.lo, self.hi, like, f"{LEVEL:.0%} interval")
        if self.kind == "predicted" and self.shorter:
            runs = ", ".join(f"{plural(n, 'seed')} at {epochs_words(e)}" for e, n in self.shorter)
            return f"{head} ({said}; predicted at {epochs_words(self.epochs)} from its runs: {runs})"
        if self.kind == "predicted":
            where = "past the space" if self.outside is not None else "not measured"
            return f"{head} ({said}; predicted by the surface, {where})"
        return f"{head} ({said}; {plural(self.n, 'seed')})"

    def _detail(self) -> str:
        """The pick's dimensions in words and its plain mean (`--explain`)."""
        free = dims_of(self.key)
        shape = ", ".join(f"{d} {self.dims[d]}" for d in ("mlp", "width") if self.dims.get(d) is not None and d not in free)
        label = "; ".join(filter(None, (split_header(free) if free else "", shape)))
        measured = (f": plain mean {value(self.raw, self.higher_is_better)} of {plural(self.n, 'seed')}, first "
                    f"measured by trial {self.trial}" if self.kind == "measured" and self.trial is not None else "")
        return f"{split(self.key)}{f' ({label})' if label else ''}{measured}" if label or measured else ""


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
        parts += [post.note] if post.note else []
    elif post.note:
        parts.append(post.note)
    else:
        parts.append("per-configuration means")
    return "; ".join(parts + [post.noise.describe()]) if post.noise is not None else "; ".join(parts)


def recommend(df: pd.DataFrame, budget: int, baseline_key: str | None, metric: str = "accuracy",
              candidates: Sequence[Candidate] = (), higher_is_better: bool = True, decision: DecisionSpec | None = None,
              list_ties: bool = False, first_seed: int = 0, cap: int | None = None, epochs: int | None = None,
              lengths: Sequence[int] = (), training: Budget | None = None, seeds: Sequence[int] = (),
              outside: Sequence[Candidate] = ()) -> Recommendation:
    """The answer at `budget` from a `trials_frame`: the pick with its bound, decided or not, its verdict
    against the baseline; `candidates` (the space's feasible configurations) and `outside` (splits past
    its declared ranges) are predicted where unmeasured and count among "the configurations within the
    budget"; more seeds are offered only below `cap`. With runs at several `lengths`, the answer is at `epochs`."""
    decision = decision or DecisionSpec()
    done = df[df["state"] == "COMPLETE"].dropna(subset=[metric, "params"])
    if "duplicate_of" in done:
        done = done[done["duplicate_of"].isna()]
    direction = "maximize" if higher_is_better else "minimize"
    everything = [*candidates, *outside]
    table = summarize(done, metric, [(metric, direction), ("params", "minimize")], level=decision.level, draws=0,
                      first_seed=first_seed, candidates=everything, epochs=epochs, lengths=lengths, budget=training, seeds=seeds)
    if not len(table):
        raise ExplorerError("no completed trial to recommend from", field="budget")
    post: Posterior = table.attrs["posterior"]
    at = table.attrs.get("epochs")
    measured = post.n > 0
    best = float(np.nanmax(post.sign() * post.mean[measured] if measured.any() else post.sign() * table["mean"])) * post.sign()
    delta = decision.margin(higher_is_better, best)
    past = {k for k, _, _ in outside}
    if not within(post, budget):
        raise ExplorerError(_nothing_within(budget, candidates, done), field="budget")
    said = answer(post, budget, baseline_key, delta, decision.level, cap=cap, full=table.attrs.get("full"), epochs=at,
                  past=past)
    key = said.pick
    i = post.index[key]
    lo, hi = post.interval(decision.level)
    dims = next((dict(d) for k, d, _ in everything if k == key), None)
    if dims is None:
        row = table[table["arch"] == key].iloc[0]
        dims = {d: (None if pd.isna(row.get(d)) else int(row[d])) for d in ("layers", "heads", "width", "mlp") if d in row}
    first = done.groupby("arch")["number"].min() if "number" in done and len(done) else pd.Series(dtype=int)
    inside = [k for k in said.regret.keys if k != key]
    tied, equivalent = _ties(post, key, inside, delta, decision.level)
    space = max((p for _, _, p in candidates), default=None)
    full = table.attrs["full"]
    shorter = tuple((e, int(n)) for e in sorted(lengths) if e != at and (r := f"{key}@{e}") in full.index
                    and (n := full.n[full.index[r]]) > 0) if at is not None else ()
    return Recommendation(
        budget=int(budget), key=key, dims=dims, params=int(post.params[i]), metric=metric,
        value=float(post.mean[i]), lo=float(lo[i]), hi=float(hi[i]), kind="measured" if measured[i] else "predicted",
        answer=said, n=int(post.n[i]), raw=float(post.raw[i]), trial=int(first[key]) if key in first else None,
        model=describe(post), tied=tuple(k for _, _, k in tied), tied_params=tuple(p for p, _, _ in tied),
        equivalent=tuple(k for _, _, k in tied if k in equivalent), list_ties=list_ties,
        verify=_neighbours(key, _known(done, candidates), budget) if key not in past else (), higher_is_better=higher_is_better,
        space_max=space if space is not None and budget >= space else None, outside=key if key in past else None,
        past=said.rivals, epochs=at, shorter=shorter)


def _nothing_within(budget: int, candidates: Sequence[Candidate], done: pd.DataFrame) -> str:
    """Why no configuration answers `budget`: none of the space fits it (the smallest named), or those that fit
    are not measured yet (and too few runs for the surface to predict them)."""
    fits = [(p, k) for k, _, p in candidates if p <= budget]
    if candidates and not fits:
        p, k = min((p, k) for k, _, p in candidates)
        return (f"no configuration of the space has at most {format_count(budget)} parameters: the smallest, "
                f"{split(k)}, has {format_count(p)}")
    if fits:
        return (f"none of the {plural(len(fits), 'configuration')} within {format_count(budget)} parameters is measured "
                f"yet ({plural(done['arch'].nunique(), 'configuration')} measured, the smallest with "
                f"{format_count(int(done['params'].min()))}): `explorer run` with a larger n_trials measures more")
    return f"no configuration within {format_count(budget)} parameters"



def for_study(study: Study, trials: pd.DataFrame, limit: int, list_ties: bool = False, epochs: int | None = None) -> Recommendation:
    """`recommend` for a study's current trials at its target length (or `epochs`): past the space among its
    splits and those past its ranges (within SIZE_REACH of the largest measured, however large the budget: a
    budget past the reach is no surer than one at it), with the pruned
    configurations within the budget, and what the reader must know besides (a refusal, runs still learning)."""
    base, budget = study.space.baseline, study.spec.budget
    target, ladder = epochs or study.target_epochs, budget.ladder
    if target not in ladder and len(ladder) == 1:
        raise ExplorerError(f"this study trains one length ({ladder[0]} epochs), which says nothing of how the answer moves "
                            f"with length: train a ladder (budget.epochs: [{ladder[0]}, {target}]), or check the pick "
                            f"with `recommend --verify --epochs {target}`", field="--epochs")
    if not len(trials) or not trials["state"].eq("COMPLETE").any():
        raise ExplorerError(f"no completed trial to recommend from ({len(trials)} stored; `explorer status` says why)",
                            source=str(study.source))
    done = trials[trials["state"] == "COMPLETE"]
    longest = int(done["epochs"].max()) if "epochs" in done and done["epochs"].notna().any() else ladder[-1]
    if target > longest * LENGTH_REACH:
        raise ExplorerError(length_refusal(target, longest), field="--epochs")
    top = int(done["params"].max())
    space = [(c.key, c.dims, c.params) for c in study.space.configs()]
    notes, outside = [], []
    if limit > max(p for _, _, p in space):  # splits past the space fit the budget: the bound covers those within reach
        if limit > SIZE_REACH * top:
            notes.append(size_refusal(limit, top))
        outside = [(c.key, c.dims, c.params) for c in widened(study.space, min(limit, int(SIZE_REACH * top)))]
    rec = recommend(trials, limit, base.key if base else None, study.task.metric, space, study.task.higher_is_better,
                    decision=study.spec.decision, list_ties=list_ties, first_seed=study.seeds[0], cap=study.seed_cap, epochs=target,
                    lengths=ladder, training=budget, seeds=study.seeds, outside=outside)
    learning = learning_words(trials, study.task.metric, study.task.higher_is_better, budget)
    return replace(rec, pruned=tuple(pruned_within(trials, limit)), notes=tuple(notes), learning=learning,
                   ladder=tuple(ladder))
