"""What `explorer status` (and `run` when it ends) prints, as tables with their titles and notes: the
answer at each of the study's budgets first (explorer.decisions), then the front of posterior means.
Strings and frames only: the numbers come from the study's posterior (explorer.stats.summarize).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from explorer.decisions import table
from explorer.formats import epochs_words, margin, plural, same_precision, split, split_header, value
from explorer.terminal import Col
from explorer.units import format_count

ADVICE = "more seeds"  # explorer.decisions.table's column: said below the table, one line per undecided budget


@dataclass(frozen=True)
class Shown:
    frame: pd.DataFrame  # strings, under word headers
    title: str
    notes: tuple[str, ...] = ()
    layout: dict[str, Col] = field(default_factory=dict)  # how each column is laid out (explorer.terminal)


def answers(st: Any) -> Shown | None:
    """The answers at the study's budgets (an `explorer.api.Status`): use X, its bound, decided or not, the
    verdict against the baseline; below, where more seeds would go for each undecided one; None before any result."""
    if not st.answers:
        return None
    post = st.summary.attrs["posterior"]
    delta = st.answers[0][1].delta
    unit, what = (100.0, "points") if st.higher_is_better else (1.0, st.metric)
    at = f" at {epochs_words(st.epochs)}" if st.epochs is not None else ""
    title = (f"Answers at the study's budgets{at}: use X ({split_header(st.free_dims)}), within ε {what} of the best "
             f"configuration within the budget (95%); decided when ε <= {margin(delta, unit, what, exact=True)}; ± half the 95% interval")
    frame = table(st.answers, post, st.metric, st.higher_is_better)
    notes = [f"{budget}: {advice}" for budget, advice in zip(frame["budget"], frame[ADVICE]) if advice]
    lo, hi = post.interval()
    half = [same_precision((hi[i] - lo[i]) / 2, m) if post.has_intervals else ""
            for i, m in zip((post.index[a.pick] for _, a in st.answers), frame[st.metric])]
    frame = frame.drop(columns=[ADVICE, "95% interval"]).assign(params=frame["params"].map(format_count))
    frame.insert(list(frame.columns).index(st.metric) + 1, "±", half)
    frame = frame.rename(columns={f"ε ({what})": "ε"})
    layout = {"budget": Col(wrap=True), "params": Col(right=True), st.metric: Col(right=True), "±": Col(right=True),
              "ε": Col(right=True), "vs baseline": Col(wrap=True)}
    return Shown(frame, title, tuple(notes + [n for n in (post.note, st.learning) if n]), layout)


def front(st: Any, list_ties: bool = False) -> Shown:
    """The front of posterior means with its seeds, the 95% interval and front probability, and how many
    configurations off it the posterior cannot tell from a front member (listed on request, one a line)."""
    summary, frame, metric = st.summary, st.trials, st.metric
    shown = summary[summary["on_front"]]
    intervals = bool(summary["n"].gt(1).any())
    means = [value(x, st.higher_is_better) for x in shown[metric]]
    cols: dict[str, list[str]] = {
        split_header(st.free_dims): [split(a) for a in shown["arch"]],
        "params": [format_count(p) for p in shown["params"]], **_runs_column(st, shown), metric: means}
    if intervals:
        cols["±"] = [same_precision((hi - lo) / 2, m) for lo, hi, m in zip(shown["lo"], shown["hi"], means)]
        cols["P(front)"] = [f"{p:.2f}" if np.isfinite(p) else "" for p in shown["front_prob"]]
    kappa = shown["arch"].map(frame.groupby("arch")["kappa_init_mean"].mean()) if "kappa_init_mean" in frame else None
    if kappa is not None and kappa.notna().any():
        cols["κ at init"] = [f"{k:.3g}" if np.isfinite(k) else "" for k in kappa]
    at = f" at {epochs_words(st.epochs)}" if len(st.lengths) > 1 and st.epochs is not None else ""
    title = (f"Pareto front of posterior means{at} (± half the 95% interval; P(front): share of posterior draws on the front)"
             if intervals else f"Pareto front{at} (one seed per configuration: no intervals)")
    tied = summary[summary["tied_with"].notna()]
    if len(tied) and list_ties:
        notes = ("tied with a front member (no evidence either is better):",
                 *(f"  {split(r.arch)} with {split(r.tied_with)}" for r in tied.itertuples()))
    elif len(tied):
        notes = (f"{len(tied)} configuration{'s' if len(tied) != 1 else ''} off the front "
                 f"{'are' if len(tied) != 1 else 'is'} tied with a front member (no evidence either is better); "
                 "`explorer status --list-ties` lists them",)
    else:
        notes = ()
    layout = {c: Col(right=True) for c in cols if c != split_header(st.free_dims)}
    layout["κ at init"] = Col(right=True, drop=1)
    return Shown(pd.DataFrame(cols), title, notes, layout)


def _runs_column(st: Any, shown: pd.DataFrame) -> dict[str, list[str]]:
    """The seeds each front member has: at its one length, or its runs at each length of a ladder (`1 / 0`
    under `runs at 10 / 20 epochs`: a 10-epoch run and none at 20), never a count that silently means one length."""
    if len(st.lengths) < 2:
        return {"seeds": [str(n) for n in shown["n"]]}
    by = _measured(st.trials).groupby(["arch", "epochs"]).size()
    cells = [" / ".join(str(int(by.get((a, e), 0))) for e in st.lengths) for a in shown["arch"]]
    return {f"runs at {' / '.join(map(str, st.lengths))} epochs": cells}


def _measured(frame: pd.DataFrame) -> pd.DataFrame:
    """The trials that measured their run: complete, pruned, or failed by themselves."""
    if not len(frame):
        return frame.assign(epochs=pd.Series(dtype=int))
    failed = frame["fail_reason"].notna() if "fail_reason" in frame else False
    ran = frame["state"].isin(["COMPLETE", "PRUNED"]) | ((frame["state"] == "FAIL") & failed)
    done = frame[ran]
    return done.assign(epochs=done["epochs"].astype("Int64")) if "epochs" in done else done.assign(epochs=pd.NA)


def counts(st: Any) -> list[str]:
    """The study's counts in words: configurations measured (against n_trials), runs by length and by state,
    trials set aside, execution classes, and the replicate compute at each length; a count that depends on
    the length names it."""
    measured, failed = st.outcomes
    ladder = len(st.lengths) > 1
    runs = _measured(st.trials)
    per_length = runs.groupby("epochs").size() if ladder and len(runs) else pd.Series(dtype=int)
    of = f"{measured}/{st.n_trials} configurations measured"
    if measured > st.n_trials:  # verification or retries measured more than n_trials asks for
        why = ("queued by `recommend --verify`" if "verify" in st.trials and st.trials["verify"].notna().any()
               else "measured on purpose")
        of = f"{measured} configurations measured (n_trials {st.n_trials}, and {measured - st.n_trials} more {why})"
    lengths = f" ({', '.join(f'{n} at {epochs_words(e)}' for e, n in per_length.items())})" if len(per_length) else ""
    lines = [f"{st.name}: {of}" + (f" ({failed} more failed)" if failed else "") + f", {plural(st.runs, 'run')}{lengths}; "
             + ", ".join(f"{k.lower()} {v}" for k, v in sorted(st.states.items()))
             + (f"; {plural(st.duplicates, 'proposal')} of measured configurations answered from storage" if st.duplicates else "")]
    if st.set_aside:
        lines.append(f"{plural(st.set_aside, 'trial')} of an earlier version of this study (another space, task, budget or "
                     "objectives: before `run --force`) kept in the storage and set aside")
    if st.classes:
        lines.append(st.classes)
    if len(st.seeds) > 1 and st.replicate_at_max:
        policy = st.replicates
        how = f"adaptive, confidence {policy['confidence']:g}" if policy["policy"] == "adaptive" else policy["policy"]
        head = f"replicates ({how}), seeds {st.seeds}: "
        if len(per_length):
            at_max = measured * len(st.seeds)
            said = ", ".join(f"{n} at {epochs_words(e)} ({n / max(at_max, 1):.0%})" for e, n in per_length.items())
            lines.append(f"{head}of the {at_max} runs per length that every measured configuration at "
                         f"{len(st.seeds)} seeds would take, {said}")
        else:
            lines.append(f"{head}{plural(st.replicate_runs, 'run')} of the {st.replicate_at_max} that every measured "
                         f"configuration at {len(st.seeds)} seeds would take ({st.replicate_runs / max(st.replicate_at_max, 1):.0%})")
    return lines
