"""The shape-law figure: `explorer.extrapolate`'s law past the measured configurations, with its
prediction band, and its check on held-out larger configurations.

It draws what `explorer.extrapolate` fits and must not fit or judge a law itself, nor write HTML;
the bootstrap is kept small (`DASH_BOOTSTRAP`) because the report renders on every `--watch` tick.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from explorer import extrapolate
from explorer.dashboard.reading import completed, metric_of, summaries
from explorer.dashboard.text import esc, split_config
from explorer.errors import ExplorerError
from explorer.stats import LEVEL
from explorer.units import format_count

DASH_BOOTSTRAP = 100  # refits per shape law drawn: the report renders on every --watch tick


def extrapolation_figure(frames: dict[str, pd.DataFrame], meta: dict[str, dict],
                          stats: dict[str, pd.DataFrame] | None = None) -> go.Figure:
    """The shape law (explorer.extrapolate) past the measured points, and its check on held-out larger ones.

    Left: the configurations' means, and the law's best prediction within each budget up to REACH x the
    largest measured configuration, with its 95% prediction band (dashed past the data); the candidates
    are `meta["candidates"]` (the space's configurations) or else the measured ones. Right: the law
    fitted on the configurations up to the median size, against the measured means of the larger ones.
    """
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
        try:
            model = extrapolate.fit(done, metric, higher, bootstrap=DASH_BOOTSTRAP)
        except ExplorerError as err:
            left.text = f"{esc(name)}: no shape law ({esc(err)})"
            continue
        candidates = meta[name].get("candidates") or [
            (r["arch"], {d: r[d] for d in extrapolate.DIMS}, int(r["params"])) for r in summary.to_dict("records")]
        dims = [{**d, "params": p} for _, d, p in candidates]
        value = model.predict(dims) * (1 if higher else -1)
        lo, hi = np.quantile(model.draws(dims), [(1 - LEVEL) / 2, (1 + LEVEL) / 2], axis=0)
        params = np.array([p for _, _, p in candidates])
        top = model.max_params
        budgets = np.unique(np.append(np.geomspace(params.min(), extrapolate.REACH * top, 60), top))
        picks = [int(np.argmax(np.where(params <= b, value, -np.inf))) for b in budgets]
        for part, inside, dash in (("measured range", budgets <= top, "solid"), ("beyond the data", budgets >= top, "dash")):
            at = [k for k, keep in zip(picks, inside) if keep]
            x = budgets[inside]
            fig.add_trace(go.Scatter(x=x, y=hi[at], mode="lines", line=dict(width=0), showlegend=False,
                                     hoverinfo="skip"), row=i, col=1)
            fig.add_trace(go.Scatter(x=x, y=lo[at], mode="lines", line=dict(width=0), fill="tonexty",
                                     fillcolor="rgba(31,119,180,0.18)", name=f"{esc(name)}: {LEVEL:.0%} band, {part}",
                                     hoverinfo="skip"), row=i, col=1)
            fig.add_trace(go.Scatter(
                x=x, y=model.predict([dims[k] for k in at]), mode="lines", line=dict(color="#1f77b4", dash=dash),
                name=f"{esc(name)}: law's best within budget, {part}", hovertext=[split_config(candidates[k][0]) for k in at],
                hovertemplate="budget %{x:,.0f}: %{hovertext}, %{y:.4f}<extra></extra>"), row=i, col=1)
        span = [float(np.nanmin([summary["mean"].min(), lo.min()])), float(np.nanmax([summary["mean"].max(), hi.max()]))]
        for x, label in ((top, "largest measured configuration"), (extrapolate.REACH * top, f"validated reach, {extrapolate.REACH:g}x")):
            fig.add_trace(go.Scatter(x=[x, x], y=span, mode="lines", line=dict(color="#999", dash="dot"),
                                     name=f"{esc(name)}: {label}", hovertemplate=f"{label}: %{{x:,.0f}}<extra></extra>"),
                          row=i, col=1)
        left.text = f"{esc(name)}: {esc(metric)} by budget (x: parameters)"
        fig.update_xaxes(type="log", title_text="parameters (budget)", row=i, col=1)
        fig.update_yaxes(title_text=esc(metric), row=i, col=1)
        right.text = f"{esc(name)}: " + esc(_held_out_check(fig, i, done, summary, metric, higher))
    fig.update_layout(title="Shape law: the best split past the measured range, with its band, and its held-out check",
                      height=460 * len(frames))
    return fig


def _held_out_check(fig: go.Figure, row: int, done: pd.DataFrame, summary: pd.DataFrame, metric: str,
                    higher: bool) -> str:
    """Fit on the configurations up to the median size; draw prediction vs measured mean for the larger ones."""
    cut = summary["params"].median()
    small, large = summary[summary["params"] <= cut], summary[summary["params"] > cut]
    try:
        model = extrapolate.fit(done[done["arch"].isin(small["arch"])], metric, higher, bootstrap=DASH_BOOTSTRAP)
    except ExplorerError as err:
        return f"no held-out check ({err})"
    if large.empty:
        return "no configuration larger than the median to hold out"
    dims = [{d: r[d] for d in (*extrapolate.DIMS, "params")} for r in large.to_dict("records")]
    value = model.predict(dims)
    lo, hi = np.quantile(model.draws(dims), [(1 - LEVEL) / 2, (1 + LEVEL) / 2], axis=0)
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
    fig.update_yaxes(title_text=f"predicted (fit on {len(small)} configurations up to {format_count(cut)})", row=row, col=2)
    return (f"held-out check: {inside} of {len(large)} larger configurations inside their {LEVEL:.0%} interval, "
            f"mean |error| {np.mean(np.abs(value - measured)):.4f}")

