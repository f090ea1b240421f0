"""The report's plotly figures: the front of configuration means (every replicate visible), depth x
heads, κ against heads, the front's learning curves and the hypervolume after each trial, with their
hovers; and `figures`, every figure of the report by its div id (the shape law's comes from
`extrapolation.py`).

Figures only: this module must not write a page or a table (`page.py`), fit a law, or compute a
statistic; configurations are drawn as `reading.summaries` gives them. Everything a user wrote reaches
a plotly label only through `text.esc`, since plotly renders labels as HTML.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from explorer.dashboard.extrapolation import extrapolation_figure
from explorer.dashboard.reading import completed, is_replicated, measurements, metric_of, objectives, summaries
from explorer.dashboard.text import NO_INTERVALS, esc, interval_text, num, split_config
from explorer.pareto import front_over_time, knee
from explorer.stats import LEVEL
from explorer.units import format_count

FIGURES = ("fig-front", "fig-heatmap", "fig-kappa", "fig-curves", "fig-hypervolume", "fig-extrapolation")
DASHES = ("solid", "dash", "dot", "dashdot")
SYMBOLS = ("circle", "diamond", "square", "triangle-up", "cross", "pentagon", "hexagon", "star-square")


def _hover(study: str, row: dict[str, Any], metric: str) -> str:
    config = row.get("config") if isinstance(row.get("config"), dict) else {}
    seed = row.get("seed")
    lines = [
        f"<b>{esc(study)}</b> trial {esc(row['number'])}" + ("" if pd.isna(seed) else f", seed {esc(num(seed))}"),
        split_config(row.get("arch")),
        f"params {esc(format_count(row['params']))} ({int(row['params'])})",
        f"{esc(metric)} {esc(num(row[metric]))}",
        f"κ init {esc(num(row.get('kappa_init_mean')))}, final {esc(num(row.get('kappa_final_mean')))}",
        f"{esc(num(row.get('train_time_s'), 3))} s on {esc(row.get('device'))}",
        "config: " + esc(", ".join(f"{k}={v}" for k, v in config.items())),
    ]
    return "<br>".join(lines)


def _hovers(study: str, rows: pd.DataFrame, metric: str) -> list[str]:
    """Hover text per row; only the columns it shows are converted (fast on 100k rows)."""
    used = ["number", "arch", "params", metric, "kappa_init_mean", "kappa_final_mean", "train_time_s", "device",
            "config", *(["seed"] if "seed" in rows else [])]
    return [_hover(study, row, metric) for row in rows[used].to_dict("records")]




def _config_hover(study: str, row: dict[str, Any], metric: str, trials: list[dict[str, Any]] | None) -> str:
    """A configuration's statistics, its front probability, the tie it is in, and every replicate's value
    (`trials`: its measurements as `_records` gives them, for their trial numbers and details)."""
    n = int(row["n"])
    spread = f"; {n} seeds, std {num(row['std'], 2)}" if n > 1 else "; one seed: no interval"
    if row["on_front"]:
        place = "on the front of means"
    elif isinstance(row.get("tied_with"), str):
        place = f"off the front, tied with {split_config(row['tied_with'])}: no evidence either is better"
    else:
        place = "off the front"
    prob = row.get("front_prob")
    lines = [
        f"<b>{esc(study)}</b> {split_config(row['arch'])}",
        f"params {esc(format_count(row['params']))} ({int(row['params'])})",
        f"{esc(metric)} {esc(interval_text(row))}{spread}",
        (f"P(on front) {prob:.2f}, " if prob is not None and math.isfinite(prob) else "") + place,
    ]
    trials = trials or []
    numbers = {t["seed"]: t["number"] for t in trials}
    for seed, value in zip(row["seeds"], row["values"]):
        trial = f" (trial {numbers[seed]})" if seed in numbers else ""
        lines.append(f"seed {esc(seed)}: {esc(num(value))}{trial}")
    if n == 1 and trials:  # the one trial's details, as a trial's hover shows them
        one = trials[0]
        lines.append(f"κ init {esc(num(one.get('kappa_init_mean')))}, final {esc(num(one.get('kappa_final_mean')))}; "
                     f"{esc(num(one.get('train_time_s'), 3))} s on {esc(one.get('device'))}")
    config = trials[0].get("config") if trials else None
    if isinstance(config, dict):
        lines.append("config: " + esc(", ".join(f"{k}={v}" for k, v in config.items())))
    return "<br>".join(lines)



def _records(measured: pd.DataFrame) -> dict[str, list[dict[str, Any]]]:
    """Each configuration's measurements as plain records (fast on many configurations)."""
    used = [c for c in ("arch", "number", "seed", "kappa_init_mean", "kappa_final_mean", "train_time_s", "device",
                        "config") if c in measured]
    out: dict[str, list[dict[str, Any]]] = {}
    for record in measured[used].to_dict("records"):
        out.setdefault(record["arch"], []).append(record)
    return out


def _config_trace(name: str, rows: pd.DataFrame, metric: str, trials: dict[str, list[dict]], symbol: str,
                  colour: Any, sizes: np.ndarray, legend: str) -> go.Scatter:
    """Configurations at their means, with their intervals as error bars where there are intervals."""
    bars = None
    if np.isfinite(rows["hi"].to_numpy(float)).any():
        bars = dict(type="data", symmetric=False, array=(rows["hi"] - rows["mean"]).to_numpy(float),
                    arrayminus=(rows["mean"] - rows["lo"]).to_numpy(float), thickness=1.2, width=3,
                    color="rgba(60,60,60,0.7)")
    return go.Scatter(
        x=rows["params"].to_numpy(float), y=rows["mean"].to_numpy(float), ids=list(rows["arch"]), mode="markers",
        name=legend, error_y=bars, hoverinfo="text",
        hovertext=[_config_hover(name, row, metric, trials.get(row["arch"])) for row in rows.to_dict("records")],
        marker=dict(symbol=symbol, size=sizes, color=colour, line=dict(width=1.5 if symbol.endswith("-open") else 0.5,
                    color="#333" if not symbol.endswith("-open") else None), opacity=0.9,
                    **({"coloraxis": "coloraxis"} if not isinstance(colour, str) else {})),
    )


def _front_figure(frames: dict[str, pd.DataFrame], meta: dict[str, dict],
                  stats: dict[str, pd.DataFrame] | None = None) -> go.Figure:
    stats = summaries(frames, meta) if stats is None else stats
    fig = go.Figure()
    replicated = any(is_replicated(s) for s in stats.values())
    all_heads = sorted({int(h) for df in frames.values() for h in df["heads"].dropna()})
    ticks = [math.log2(h) for h in all_heads]
    for i, (name, df) in enumerate(frames.items()):
        metric, _ = metric_of(meta[name])
        summary = stats[name]
        if summary.empty:
            continue
        label = esc(name)
        measured = measurements(completed(df, metric), meta[name])
        trials = _records(measured)
        if is_replicated(summary):  # every replicate, faint, at its own value, with the trial's own hover
            fig.add_trace(
                go.Scatter(
                    x=measured["params"].to_numpy(float), y=measured[metric].to_numpy(float), mode="markers",
                    name=f"{label}: replicates (one point per seed)", hovertext=_hovers(name, measured, metric),
                    hoverinfo="text",
                    marker=dict(size=4, color="rgba(90,90,90,0.35)", symbol=SYMBOLS[i % len(SYMBOLS)]),
                )
            )
        if replicated:
            colour = summary["front_prob"].to_numpy(float) if is_replicated(summary) else "#888"
        else:
            colour = np.log2(summary["heads"].fillna(1).to_numpy(float)) if "heads" in summary else "#888"
        layers = summary["layers"].fillna(1).to_numpy(float) if "layers" in summary else np.ones(len(summary))
        sizes = 5 + 15 * layers / max(layers.max(), 1)
        tied = summary["tied_with"].map(lambda t: isinstance(t, str)).to_numpy(bool)
        symbol = SYMBOLS[i % len(SYMBOLS)]
        pick = lambda value, mask: value if isinstance(value, str) else value[mask]  # noqa: E731
        where = f"mean, {LEVEL:.0%} interval" if is_replicated(summary) else "one seed each"
        fig.add_trace(_config_trace(name, summary[~tied], metric, trials, symbol, pick(colour, ~tied), sizes[~tied],
                                    f"{label}: configurations ({where})"))
        if tied.any():
            fig.add_trace(_config_trace(name, summary[tied], metric, trials, f"{symbol}-open", pick(colour, tied),
                                        sizes[tied], f"{label}: tied with a front member (open)"))
        front = summary[summary["on_front"]].sort_values(["params", "mean"])
        fig.add_trace(
            go.Scatter(
                x=front["params"].to_numpy(float), y=front["mean"].to_numpy(float), mode="lines", line_shape="hv",
                name=f"{label}: front" + (" of means" if is_replicated(summary) else ""), line=dict(width=2),
                hoverinfo="skip",
            )
        )
        k = front.iloc[knee(front[["params", "mean"]].to_numpy(float))]
        fig.add_annotation(x=float(k["params"]), y=float(k["mean"]), text=f"knee: {split_config(k['arch'])}", showarrow=True,
                           arrowhead=2)
        base = summary[summary["arch"] == meta[name].get("baseline")]
        if len(base):
            fig.add_trace(
                go.Scatter(
                    x=base["params"].to_numpy(float), y=base["mean"].to_numpy(float), mode="markers",
                    name=f"{label}: baseline {split_config(base['arch'].iloc[0])}",
                    marker=dict(symbol="star", size=20, color="gold", line=dict(width=1.5, color="black")),
                    hovertext=[_config_hover(name, row, metric, trials.get(row["arch"]))
                               for row in base.to_dict("records")],
                    hoverinfo="text",
                )
            )
    metrics = esc(", ".join(sorted({metric_of(m)[0] for m in meta.values()})))
    if replicated:
        title = (f"Pareto front of configuration means: parameters vs {metrics}<br><sup>error bars: {LEVEL:.0%} "
                 "posterior interval; colour: P(on front), the probability of being on the Pareto front; size: depth; "
                 "open: tied with a front member; grey dots: one per seed</sup>")
        axis = dict(colorscale="Viridis", cmin=0, cmax=1, colorbar=dict(title="P(on front)"))
    else:
        title = (f"Pareto front: parameters vs {metrics}<br><sup>{NO_INTERVALS}; colour: heads; size: depth</sup>")
        axis = dict(colorscale="Viridis",
                    colorbar=dict(title="heads", tickvals=ticks, ticktext=[str(h) for h in all_heads]))
    fig.update_layout(
        title=title, xaxis_title="parameters", yaxis_title=metrics, height=560,
        coloraxis=axis, legend=dict(orientation="h", y=-0.2),
    )
    return fig


def _heatmap_figure(frames: dict[str, pd.DataFrame], meta: dict[str, dict],
                    stats: dict[str, pd.DataFrame] | None = None) -> go.Figure:
    """Each (layers, heads) cell at the most common width: its configuration's mean ± interval half-width.

    Where other dimensions vary, several configurations share a cell; it shows the best of them, named
    in its hover.
    """
    stats = summaries(frames, meta) if stats is None else stats
    fig = make_subplots(rows=1, cols=len(frames), subplot_titles=[" "] * len(frames))
    for i, (name, df) in enumerate(frames.items(), start=1):
        metric, higher = metric_of(meta[name])
        summary = stats[name]
        if summary.empty or not {"layers", "heads"} <= set(summary):
            continue
        widths = summary["width"].dropna() if "width" in summary else pd.Series(dtype=float)
        width = widths.mode().iloc[0] if len(widths) else None
        at = summary if width is None else summary[summary["width"] == width]
        at = at.dropna(subset=["layers", "heads"]).sort_values("mean", ascending=not higher)
        cells = at.drop_duplicates(["layers", "heads"]).assign(
            shared=at.groupby(["layers", "heads"])["arch"].transform("size"))
        layers, heads = sorted(cells["layers"].unique()), sorted(cells["heads"].unique())
        z = np.full((len(layers), len(heads)), np.nan)
        text = [[""] * len(heads) for _ in layers]
        hover = [[""] * len(heads) for _ in layers]
        for row in cells.to_dict("records"):
            r, c = layers.index(row["layers"]), heads.index(row["heads"])
            z[r, c] = row["mean"]
            finite = math.isfinite(row["hi"]) and math.isfinite(row["lo"])
            text[r][c] = f"{row['mean']:.3f} ± {(row['hi'] - row['lo']) / 2:.3f}" if finite else f"{row['mean']:.3f}"
            spread = (f"std {num(row['std'], 2)}, n {row['n']} seeds" if row["n"] > 1
                      else "n 1: one seed, no interval")
            shared = f"<br>best of {row['shared']} configurations here" if row["shared"] > 1 else ""
            hover[r][c] = (f"layers {num(row['layers'])}, heads {num(row['heads'])}: {split_config(row['arch'])}<br>"
                           f"{esc(metric)} {esc(interval_text(row))}<br>{spread}{shared}")
        fig.add_trace(
            go.Heatmap(
                z=z, x=[str(int(h)) for h in heads], y=[str(int(d)) for d in layers], coloraxis="coloraxis",
                text=text, texttemplate="%{text}", hovertext=hover, hovertemplate="%{hovertext}<extra></extra>",
            ),
            row=1, col=i,
        )
        fig.layout.annotations[i - 1].text = f"{esc(name)}: {esc(metric)} at width {num(width) or '?'}"
        fig.update_xaxes(title_text="heads", type="category", row=1, col=i)
        fig.update_yaxes(title_text="layers", type="category", row=1, col=i)
    if any(is_replicated(s) for s in stats.values()):
        title = f"Depth x heads at fixed width: mean over seeds ± half its {LEVEL:.0%} interval (std and n on hover)"
    else:
        title = f"Depth x heads at fixed width ({NO_INTERVALS})"
    fig.update_layout(title=title, height=460, coloraxis_colorscale="Viridis")
    return fig


def _kappa_figure(frames: dict[str, pd.DataFrame], meta: dict[str, dict], stats: Any = None) -> go.Figure:
    fig = go.Figure()
    for i, (name, df) in enumerate(frames.items()):
        done = df[df["state"] == "COMPLETE"]
        for column, when, colour in (("kappa_init_mean", "init", "#1f77b4"), ("kappa_final_mean", "final", "#d62728")):
            rows = done.dropna(subset=[column, "heads"])
            rows = rows[rows[column] > 0]
            if rows.empty:
                continue
            fig.add_trace(
                go.Scatter(
                    x=rows["heads"], y=rows[column], mode="markers", name=f"{esc(name)}: κ {when}",
                    marker=dict(color=colour, opacity=0.5, size=7),
                    hovertext=[f"{esc(name)} trial {n}: {split_config(a)}" for n, a in rows[["number", "arch"]].to_numpy()],
                    hovertemplate="%{hovertext}<br>κ " + when + " %{y:.3g}<extra></extra>",
                )
            )
            median = rows.groupby("heads")[column].median()
            fig.add_trace(
                go.Scatter(
                    x=median.index, y=median.to_numpy(), mode="lines", name=f"{esc(name)}: median κ {when}",
                    line=dict(color=colour, dash=DASHES[i % len(DASHES)]),
                    hovertemplate="heads %{x}: median κ %{y:.3g}<extra></extra>",
                )
            )
    fig.update_layout(
        title="Attention conditioning κ = σ₁/σ_k against heads (geometric mean over blocks)",
        xaxis=dict(title="heads", type="log", dtick=math.log10(2)), yaxis=dict(title="κ", type="log"), height=460,
    )
    return fig


def _curves_figure(frames: dict[str, pd.DataFrame], meta: dict[str, dict],
                   stats: dict[str, pd.DataFrame] | None = None) -> go.Figure:
    """The learning curve of every measurement (each seed) of the configurations on the front of means."""
    stats = summaries(frames, meta) if stats is None else stats
    fig = go.Figure()
    for name, df in frames.items():
        metric, _ = metric_of(meta[name])
        summary = stats[name]
        if summary.empty:
            continue
        measured = measurements(completed(df, metric), meta[name])
        several = is_replicated(summary)
        front = summary.loc[summary["on_front"]].sort_values("params")["arch"]
        for arch in front:
            for row in measured[measured["arch"] == arch].sort_values("seed").to_dict("records"):
                curve = list(row["curve"]) if isinstance(row["curve"], (list, tuple)) else []
                fig.add_trace(
                    go.Scatter(
                        x=list(range(1, len(curve) + 1)), y=curve, mode="lines+markers",
                        name=f"{esc(name)}: {split_config(row['arch'])} ({esc(format_count(row['params']))})"
                             + (f" seed {esc(row['seed'])}" if several else ""),
                        legendgroup=f"{esc(name)}: {esc(row['arch'])}",
                        hovertemplate="epoch %{x}: %{y:.4f}<extra>" + split_config(row["arch"]) + "</extra>",
                    )
                )
    metrics = sorted({metric_of(m)[0] for m in meta.values()})
    fig.update_layout(
        title="Learning curves of the front's configurations (every seed)", xaxis=dict(title="epoch", dtick=1),
        yaxis_title=esc(", ".join(metrics)), height=460,
    )
    return fig


def _hypervolume_figure(frames: dict[str, pd.DataFrame], meta: dict[str, dict], stats: Any = None) -> go.Figure:
    fig = go.Figure()
    for name, df in frames.items():
        objs = objectives(meta[name])
        if df.empty or any(column not in df for column, _ in objs):
            continue
        hv = front_over_time(df, objs)
        fig.add_trace(
            go.Scatter(
                x=hv["number"], y=hv["hypervolume"], mode="lines", line_shape="hv",
                name=esc(name) + ": " + esc(", ".join(f"{d} {c}" for c, d in objs)),
            )
        )
    fig.update_layout(
        title="Hypervolume of the front after each trial (reference: worst value of each objective + 10% of its range)",
        xaxis_title="trial number", yaxis_title="hypervolume", height=420,
    )
    return fig


def running_figure(frames: dict[str, pd.DataFrame], meta: dict[str, dict]) -> go.Figure:
    """The curves of the trials training now, to their last epoch (their `curve`, stored after each one): the
    live page's (explorer.dashboard.live). A finished trial leaves it for the report's other figures."""
    fig = go.Figure()
    for name, df in frames.items():
        running = df[df["state"] == "RUNNING"] if len(df) else df
        for row in running.to_dict("records"):
            curve = list(row["curve"]) if isinstance(row.get("curve"), (list, tuple)) else []
            seed = "" if pd.isna(row.get("seed")) else f", seed {num(row['seed'])}"
            fig.add_trace(go.Scatter(
                x=list(range(1, len(curve) + 1)), y=curve, mode="lines+markers",
                name=f"{esc(name)}: trial {row['number']} {esc(row.get('arch'))}{esc(seed)}",
                hovertemplate="epoch %{x}: %{y:.4f}<extra>trial " + str(row["number"]) + "</extra>"))
    metrics = esc(", ".join(sorted({metric_of(m)[0] for m in meta.values()})))
    title = "Running trials, epoch by epoch" if fig.data else "Running trials, epoch by epoch: none is running"
    fig.update_layout(title=title, xaxis=dict(title="epoch", dtick=1), yaxis_title=metrics, height=420)
    return fig


def figures(frames: dict[str, pd.DataFrame], meta: dict[str, dict],
            stats: dict[str, pd.DataFrame] | None = None) -> dict[str, go.Figure]:
    """The report's figures by div id (usable on their own, e.g. in a notebook); `stats`: `summaries`."""
    stats = summaries(frames, meta) if stats is None else stats
    builders = (_front_figure, _heatmap_figure, _kappa_figure, _curves_figure, _hypervolume_figure, extrapolation_figure)
    return {div: build(frames, meta, stats) for div, build in zip(FIGURES, builders, strict=True)}

