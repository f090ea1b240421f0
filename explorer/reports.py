"""What `explorer status` (and `run` when it ends) prints, as tables with their titles and notes: the
answer at each of the study's budgets first (explorer.decisions), then the front of posterior means.
Strings and frames only: the numbers come from the study's posterior (explorer.stats.summarize).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from explorer.decisions import table


@dataclass(frozen=True)
class Shown:
    frame: pd.DataFrame
    title: str
    notes: tuple[str, ...] = ()


def answers(st: Any) -> Shown | None:
    """The answers at the study's budgets (an `explorer.api.Status`): use X, its bound, decided or not, the
    verdict against the baseline, where more seeds would go; None before any result."""
    if not st.answers:
        return None
    post = st.summary.attrs["posterior"]
    delta = st.answers[0][1].delta
    what, shown = ("points", 100 * delta) if st.higher_is_better else (st.metric, delta)
    at = f" at {st.epochs} epochs" if st.epochs is not None else ""
    title = (f"answers at the study's budgets{at}: use X, within ε {what} of the best configuration within the budget "
             f"(95%); decided when ε <= {shown:.2g} {what}")
    notes = tuple(n for n in (post.note, st.learning) if n)
    return Shown(table(st.answers, post, st.metric, st.higher_is_better), title, notes)


def front(st: Any, list_ties: bool = False) -> Shown:
    """The front of posterior means with n, the 95% interval and front probability, and how many configurations
    off it the posterior cannot tell from a front member (listed on request)."""
    summary, frame, metric = st.summary, st.trials, st.metric
    shown = summary[summary["on_front"]].copy()
    shown["±"] = (shown["hi"] - shown["lo"]) / 2
    if "kappa_init_mean" in frame:
        shown["kappa_init_mean"] = shown["arch"].map(frame.groupby("arch")["kappa_init_mean"].mean())
    cols = [c for c in (*st.free_dims, "params", "n", metric, "±", "front_prob", "kappa_init_mean") if c in shown]
    intervals = bool(summary["n"].gt(1).any())
    title = ("Pareto front of posterior means (± half the 95% interval, front_prob: share of posterior draws on the front)"
             if intervals else "Pareto front (one seed per configuration: no intervals)")
    tied = summary[summary["tied_with"].notna()]
    if len(tied) and list_ties:
        notes = ("tied with a front member (no evidence either is better): "
                 + "; ".join(f"{r.arch} with {r.tied_with}" for r in tied.itertuples()),)
    elif len(tied):
        notes = (f"{len(tied)} configurations off the front are tied with a front member (no evidence either is "
                 "better); `explorer status --list-ties` lists them",)
    else:
        notes = ()
    return Shown(shown[cols if intervals else [c for c in cols if c not in ("±", "front_prob")]], title, notes)
