"""The study's answers as a tracker's summary run: at each of its budgets the configuration to use, its
posterior mean and 95% interval, its bound ε and whether it is decided (tags to read, metrics to plot
against the runs finished), and the answers and per-configuration tables as CSV."""

from __future__ import annotations

from typing import Any

import numpy as np

from explorer.decisions import table
from explorer.tracking.base import Summary, finite
from explorer.units import format_count

CONFIG_COLUMNS = ("arch", "params", "n", "mean", "lo", "hi", "front_prob", "on_front", "tied_with")


def summary_of(st: Any) -> Summary:
    """The summary of an `explorer.api.Status`: step = its runs finished, so a resumed study's answers go on one line."""
    metric, tags, metrics, tables = st.metric, {}, {"runs": st.runs, "configurations": st.outcomes[0]}, {}
    if len(st.summary):
        post = st.summary.attrs["posterior"]
        lo, hi = post.interval()
        for at, a in st.answers:
            i, budget = post.index[a.pick], format_count(at[-1])
            interval = f", 95% interval {lo[i]:.4g} to {hi[i]:.4g}" if post.has_intervals else ""
            verdict = f", vs baseline: {a.verdict.kind}" if a.verdict is not None else ""
            bound = f", ε {a.eps:.3g}" if np.isfinite(a.eps) else ""
            tags[f"answer at {budget}"] = (f"use {a.pick}: {metric} {post.mean[i]:.4g}{interval}{bound}, "
                                           f"{'decided' if a.decided else 'undecided'}{verdict}")
            metrics.update({f"answer/{budget}/{metric}": post.mean[i], f"answer/{budget}/eps": a.eps,
                            f"answer/{budget}/decided": float(a.decided)})
        if st.answers:
            tables["answers.csv"] = table(st.answers, post, metric, st.higher_is_better).to_csv(index=False)
        front = st.summary[st.summary["on_front"]]
        tags["front"] = "; ".join(front.sort_values("params")["arch"].astype(str))
        columns = [c for c in (*st.free_dims, *CONFIG_COLUMNS) if c in st.summary]
        tables["configurations.csv"] = st.summary[columns].to_csv(index=False)
    return Summary(tags, finite(metrics), int(st.runs), tables)
