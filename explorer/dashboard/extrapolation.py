"""The answer past the measured range: the posterior's pick within each budget up to SIZE_REACH x the
largest measured configuration (among the space's splits and those past its declared ranges, predicted
by the surface), with its 95% interval, and the surface's check on held-out larger configurations.

It draws what `explorer.stats` (the one posterior) computes and must not fit or judge anything itself,
nor write HTML.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from explorer.dashboard.reading import completed, length_options, metric_of, summaries
from explorer.dashboard.text import esc, split_config
from explorer.decisions import within
from explorer.stats import LEVEL, summarize
from explorer.transfer import SIZE_REACH
from explorer.units import format_count

BUDGETS = 40  # points of the pick-by-budget line


def extrapolation_figure(frames: dict[str, pd.DataFrame], meta: dict[str, dict],
                         stats: dict[str, pd.DataFrame] | None = None) -> go.Figure:
    """Left: the configurations' means, and the posterior's pick within each budget up to SIZE_REACH x the
    largest measured configuration with its 95% interval (dashed past the data); the candidates are
    `meta["candidates"]` and `meta["widened"]`'s (splits past the space). Right: the posterior fitted on
    the configurations up to the median size, against the measured means of the larger ones."""
    stats = summaries(frames, meta) if stats is None else stats
    fig = make_subplots(rows=len(frames), cols=2, subplot_titles=[" "] * (2 * len(frames)))
    for i, (name, df) in enumerate(frames.items(), start=1):
        metric, higher = metric_of(meta[name])
        summary, done = stats[name], completed(df, metric) if metric in df else df.iloc[0:0]
        left, right = fig.layout.annotations[2 * i - 2], fig.layout.annotations[2 * i - 1]
        if summary.empty:
            left.text = f"{esc(name)}: no completed trials"
            continue
        fig.add_trace(go.Scatter(
            x=summary["params"], y=summary["mean"], mode="markers", name=f"{esc(name)}: measured means",
            marker=dict(color="#333", size=6), hovertext=[split_config(a) for a in summary["arch"]],
            error_y=dict(type="data", symmetric=False, array=(summary["hi"] - summary["mean"]).fillna(0),
                         arrayminus=(summary["mean"] - summary["lo"]).fillna(0), thickness=1, width=2),
            hovertemplate="%{hovertext}<br>%{x:,} params: %{y:.4f}<extra></extra>"), row=i, col=1)
        objectives = [(metric, "maximize" if higher else "minimize"), ("params", "minimize")]
        top = int(summary["params"].max())
        past = meta[name]["widened"](int(SIZE_REACH * top)) if "widened" in meta[name] else []
        candidates = [*(meta[name].get("candidates") or ()), *past]
        post = summarize(done, metric, objectives, draws=0, candidates=candidates, **length_options(meta[name])).attrs["posterior"]
        lo, hi = post.interval(LEVEL)
        budgets = np.unique(np.append(np.geomspace(post.params.min(), SIZE_REACH * top, BUDGETS), top))
        picks = [post.index[post.regret(within(post, b)).pick] for b in budgets]
        for part, inside, dash in (("measured range", budgets <= top, "solid"), ("past the data", budgets >= top, "dash")):
            at = [k for k, keep in zip(picks, inside) if keep]
            x = budgets[inside]
            fig.add_trace(go.Scatter(x=x, y=hi[at], mode="lines", line=dict(width=0), showlegend=False,
                                     hoverinfo="skip"), row=i, col=1)
            fig.add_trace(go.Scatter(x=x, y=lo[at], mode="lines", line=dict(width=0), fill="tonexty",
                                     fillcolor="rgba(31,119,180,0.18)", name=f"{esc(name)}: {LEVEL:.0%} interval, {part}",
                                     hoverinfo="skip"), row=i, col=1)
            fig.add_trace(go.Scatter(
                x=x, y=post.mean[at], mode="lines", line=dict(color="#1f77b4", dash=dash),
                name=f"{esc(name)}: the answer within budget, {part}", hovertext=[split_config(post.keys[k]) for k in at],
                hovertemplate="budget %{x:,.0f}: %{hovertext}, %{y:.4f}<extra></extra>"), row=i, col=1)
        span = [float(np.nanmin([summary["mean"].min(), lo.min()])), float(np.nanmax([summary["mean"].max(), hi.max()]))]
        for x, label in ((top, "largest measured configuration"), (SIZE_REACH * top, f"validated reach, {SIZE_REACH:g}x")):
            fig.add_trace(go.Scatter(x=[x, x], y=span, mode="lines", line=dict(color="#999", dash="dot"),
                                     name=f"{esc(name)}: {label}", hovertemplate=f"{label}: %{{x:,.0f}}<extra></extra>"),
                          row=i, col=1)
        left.text = f"{esc(name)}: {esc(metric)} by budget (x: parameters)"
        fig.update_xaxes(type="log", title_text="parameters (budget)", row=i, col=1)
        fig.update_yaxes(title_text=esc(metric), row=i, col=1)
        right.text = f"{esc(name)}: " + esc(_held_out_check(fig, i, done, summary, metric, objectives, meta[name]))
    fig.update_layout(title="Past the measured range: the answer by budget, with its interval, and its held-out check",
                      height=460 * len(frames))
    return fig


def _held_out_check(fig: go.Figure, row: int, done: pd.DataFrame, summary: pd.DataFrame, metric: str,
                    objectives: list[tuple[str, str]], meta: dict) -> str:
    """The posterior of the configurations up to the median size; its prediction vs the measured mean of the larger ones."""
    cut = summary["params"].median()
    small, large = summary[summary["params"] <= cut], summary[summary["params"] > cut]
    if large.empty or len(small) < 2:
        return "no configuration larger than the median to hold out"
    candidates = [(r["arch"], dict(r["config"]) if isinstance(r.get("config"), dict) else
                   {d: r[d] for d in ("layers", "heads", "width", "mlp") if d in r and pd.notna(r[d])}, int(r["params"]))
                  for r in done[done["arch"].isin(large["arch"])].drop_duplicates("arch").to_dict("records")]
    post = summarize(done[done["arch"].isin(small["arch"])], metric, objectives, draws=0, candidates=candidates,
                     **length_options(meta)).attrs["posterior"]
    if post.model != "smooth":
        return f"no held-out check: no surface from the {len(small)} configurations up to the median size"
    cols = [post.index[k] for k in large["arch"]]
    value = post.mean[cols]
    lo, hi = (b[cols] for b in post.interval(LEVEL))
    measured = large["mean"].to_numpy(float)
    inside = int(((lo <= measured) & (measured <= hi)).sum())
    fig.add_trace(go.Scatter(
        x=measured, y=value, mode="markers", name="held out: predicted vs measured", marker=dict(color="#d62728", size=6),
        error_y=dict(type="data", symmetric=False, array=hi - value, arrayminus=value - lo, thickness=1, width=2),
        hovertext=[split_config(a) for a in large["arch"]],
        hovertemplate="%{hovertext}<br>measured %{x:.4f}, predicted %{y:.4f}<extra></extra>"), row=row, col=2)
    edge = [float(min(measured.min(), lo.min())), float(max(measured.max(), hi.max()))]
    fig.add_trace(go.Scatter(x=edge, y=edge, mode="lines", line=dict(color="#999", dash="dot"), showlegend=False,
                             hoverinfo="skip"), row=row, col=2)
    fig.update_xaxes(title_text=f"measured mean {metric}", row=row, col=2)
    fig.update_yaxes(title_text=f"predicted (from {len(small)} configurations up to {format_count(cut)})", row=row, col=2)
    return (f"held-out check: {inside} of {len(large)} larger configurations inside their {LEVEL:.0%} interval, "
            f"mean |error| {np.mean(np.abs(value - measured)):.4f}")
