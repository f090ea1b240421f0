"""The study report: one self-contained HTML file of plotly figures and sortable configuration and trial tables.

Every figure and table that speaks of a configuration reads its statistics from `explorer.stats.summarize`
(`summaries`): the front is drawn at configuration means with their t intervals, coloured by the
probability of being on the Pareto front, with every replicate visible; nothing here averages trials.
A study with one seed per configuration says so where the intervals would be.

The only module that imports plotly. plotly.js is inlined once in <head> (no CDN), so the file
opens offline. Everything a user wrote (study names, config values, failure messages) is
html-escaped before it reaches the page or a plotly label, which plotly renders as HTML.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from explorer import extrapolate
from explorer.errors import ExplorerError
from explorer.frame import trials_frame
from explorer.pareto import DEFAULT_OBJECTIVES, front_over_time, knee
from explorer.stats import LEVEL, summarize
from explorer.study import load_study_spec
from explorer.units import format_count

FIGURES = ("fig-front", "fig-heatmap", "fig-kappa", "fig-curves", "fig-hypervolume", "fig-extrapolation")
DASHES = ("solid", "dash", "dot", "dashdot")
SYMBOLS = ("circle", "diamond", "square", "triangle-up", "cross", "pentagon", "hexagon", "star-square")
PLOT_CONFIG = {"displaylogo": False, "responsive": True}
NO_INTERVALS = "one seed per configuration: no intervals"
DASH_BOOTSTRAP = 100  # refits per shape law drawn: the report renders on every --watch tick


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: Any, digits: int = 4) -> str:
    if value is None or not math.isfinite(number := float(value)):
        return ""
    return str(int(number)) if number.is_integer() else f"{number:.{digits}g}"


def objectives(meta: dict[str, Any]) -> list[tuple[str, str]]:
    """(column, direction) pairs from pairs, {"name":, "direction":} mappings (the study's user
    attr) or "maximize accuracy" strings (the study YAML)."""
    out = []
    for item in meta.get("objectives") or DEFAULT_OBJECTIVES:
        if isinstance(item, str):
            direction, name = item.split(None, 1)
        elif isinstance(item, dict):
            name, direction = item["name"], item["direction"]
        else:
            name, direction = item
        out.append((str(name), str(direction)))
    return out


def _metric(meta: dict[str, Any]) -> tuple[str, bool]:
    metric = str(meta.get("metric", "accuracy"))
    higher = meta.get("higher_is_better", dict(objectives(meta)).get(metric, "maximize") == "maximize")
    return metric, bool(higher)


def _done(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    return df[df["state"] == "COMPLETE"].dropna(subset=[metric, "params"])


def _study_objectives(meta: dict[str, Any], df: pd.DataFrame) -> list[tuple[str, str]]:
    """The study's objectives that its frame holds, the metric always among them."""
    metric, higher = _metric(meta)
    objs = [(name, direction) for name, direction in objectives(meta) if name in df]
    if metric not in dict(objs):
        objs.insert(0, (metric, "maximize" if higher else "minimize"))
    return objs


def summaries(frames: dict[str, pd.DataFrame], meta: dict[str, dict]) -> dict[str, pd.DataFrame]:
    """Each study's `stats.summarize` table (one row per configuration): what the front, the heatmap,
    the learning curves, the summary and the tables read; raw trials are never averaged here."""
    out = {}
    for name, df in frames.items():
        metric, _ = _metric(meta[name])
        done = _done(df, metric) if metric in df else df.iloc[0:0]
        out[name] = summarize(done, metric, _study_objectives(meta[name], df)) if len(done) else pd.DataFrame()
    return out


def _replicated(summary: pd.DataFrame) -> bool:
    """Whether any configuration has more than one seed (else there is no interval anywhere)."""
    return bool(len(summary)) and bool((summary["n"] > 1).any())


def _hover(study: str, row: dict[str, Any], metric: str) -> str:
    config = row.get("config") if isinstance(row.get("config"), dict) else {}
    seed = row.get("seed")
    lines = [
        f"<b>{_e(study)}</b> trial {_e(row['number'])}" + ("" if pd.isna(seed) else f", seed {_e(_num(seed))}"),
        _e(row.get("arch")),
        f"params {_e(format_count(row['params']))} ({int(row['params'])})",
        f"{_e(metric)} {_e(_num(row[metric]))}",
        f"κ init {_e(_num(row.get('kappa_init_mean')))}, final {_e(_num(row.get('kappa_final_mean')))}",
        f"{_e(_num(row.get('train_time_s'), 3))} s on {_e(row.get('device'))}",
        "config: " + _e(", ".join(f"{k}={v}" for k, v in config.items())),
    ]
    return "<br>".join(lines)


def _hovers(study: str, rows: pd.DataFrame, metric: str) -> list[str]:
    """Hover text per row; only the columns it shows are converted (fast on 100k rows)."""
    used = ["number", "arch", "params", metric, "kappa_init_mean", "kappa_final_mean", "train_time_s", "device",
            "config", *(["seed"] if "seed" in rows else [])]
    return [_hover(study, row, metric) for row in rows[used].to_dict("records")]


def _interval(row: Any, digits: int = 4) -> str:
    """'0.9453 ± 0.0091 (95% interval 0.9362 to 0.9544)', or the mean alone where there is no interval."""
    if not math.isfinite(row["hi"]) or not math.isfinite(row["lo"]):
        return _num(row["mean"], digits)
    half = (row["hi"] - row["lo"]) / 2
    return (f"{_num(row['mean'], digits)} ± {_num(half, 2)} "
            f"({LEVEL:.0%} interval {_num(row['lo'], digits)} to {_num(row['hi'], digits)})")


def _config_hover(study: str, row: dict[str, Any], metric: str, trials: list[dict[str, Any]] | None) -> str:
    """A configuration's statistics, its front probability, the tie it is in, and every replicate's value
    (`trials`: its measurements as `_records` gives them, for their trial numbers and details)."""
    n = int(row["n"])
    spread = f"; {n} seeds, std {_num(row['std'], 2)}" if n > 1 else "; one seed: no interval"
    if row["on_front"]:
        place = "on the front of means"
    elif isinstance(row.get("tied_with"), str):
        place = f"off the front, tied with {_e(row['tied_with'])}: no evidence either is better"
    else:
        place = "off the front"
    prob = row.get("front_prob")
    lines = [
        f"<b>{_e(study)}</b> {_e(row['arch'])}",
        f"params {_e(format_count(row['params']))} ({int(row['params'])})",
        f"{_e(metric)} {_e(_interval(row))}{spread}",
        (f"P(on front) {prob:.2f}, " if prob is not None and math.isfinite(prob) else "") + place,
    ]
    trials = trials or []
    numbers = {t["seed"]: t["number"] for t in trials}
    for seed, value in zip(row["seeds"], row["values"]):
        trial = f" (trial {numbers[seed]})" if seed in numbers else ""
        lines.append(f"seed {_e(seed)}: {_e(_num(value))}{trial}")
    if n == 1 and trials:  # the one trial's details, as a trial's hover shows them
        one = trials[0]
        lines.append(f"κ init {_e(_num(one.get('kappa_init_mean')))}, final {_e(_num(one.get('kappa_final_mean')))}; "
                     f"{_e(_num(one.get('train_time_s'), 3))} s on {_e(one.get('device'))}")
    config = trials[0].get("config") if trials else None
    if isinstance(config, dict):
        lines.append("config: " + _e(", ".join(f"{k}={v}" for k, v in config.items())))
    return "<br>".join(lines)


def _measured(done: pd.DataFrame) -> pd.DataFrame:
    """The completed measurements, one per configuration and seed, as `stats.summarize` counts them."""
    if "duplicate_of" in done:
        done = done[done["duplicate_of"].isna()]
    seeds = done["seed"] if "seed" in done else pd.Series(0, index=done.index)
    return done.assign(seed=seeds.fillna(0).astype(int)).drop_duplicates(["arch", "seed"])


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
    replicated = any(_replicated(s) for s in stats.values())
    all_heads = sorted({int(h) for df in frames.values() for h in df["heads"].dropna()})
    ticks = [math.log2(h) for h in all_heads]
    for i, (name, df) in enumerate(frames.items()):
        metric, _ = _metric(meta[name])
        summary = stats[name]
        if summary.empty:
            continue
        label = _e(name)
        measured = _measured(_done(df, metric))
        trials = _records(measured)
        if _replicated(summary):  # every replicate, faint, at its own value, with the trial's own hover
            fig.add_trace(
                go.Scatter(
                    x=measured["params"].to_numpy(float), y=measured[metric].to_numpy(float), mode="markers",
                    name=f"{label}: replicates (one point per seed)", hovertext=_hovers(name, measured, metric),
                    hoverinfo="text",
                    marker=dict(size=4, color="rgba(90,90,90,0.35)", symbol=SYMBOLS[i % len(SYMBOLS)]),
                )
            )
        if replicated:
            colour = summary["front_prob"].to_numpy(float) if _replicated(summary) else "#888"
        else:
            colour = np.log2(summary["heads"].fillna(1).to_numpy(float)) if "heads" in summary else "#888"
        layers = summary["layers"].fillna(1).to_numpy(float) if "layers" in summary else np.ones(len(summary))
        sizes = 5 + 15 * layers / max(layers.max(), 1)
        tied = summary["tied_with"].map(lambda t: isinstance(t, str)).to_numpy(bool)
        symbol = SYMBOLS[i % len(SYMBOLS)]
        pick = lambda value, mask: value if isinstance(value, str) else value[mask]  # noqa: E731
        where = f"mean, {LEVEL:.0%} interval" if _replicated(summary) else "one seed each"
        fig.add_trace(_config_trace(name, summary[~tied], metric, trials, symbol, pick(colour, ~tied), sizes[~tied],
                                    f"{label}: configurations ({where})"))
        if tied.any():
            fig.add_trace(_config_trace(name, summary[tied], metric, trials, f"{symbol}-open", pick(colour, tied),
                                        sizes[tied], f"{label}: tied with a front member (open)"))
        front = summary[summary["on_front"]].sort_values(["params", "mean"])
        fig.add_trace(
            go.Scatter(
                x=front["params"].to_numpy(float), y=front["mean"].to_numpy(float), mode="lines", line_shape="hv",
                name=f"{label}: front" + (" of means" if _replicated(summary) else ""), line=dict(width=2),
                hoverinfo="skip",
            )
        )
        k = front.iloc[knee(front[["params", "mean"]].to_numpy(float))]
        fig.add_annotation(x=float(k["params"]), y=float(k["mean"]), text=f"knee: {_e(k['arch'])}", showarrow=True,
                           arrowhead=2)
        base = summary[summary["arch"] == meta[name].get("baseline")]
        if len(base):
            fig.add_trace(
                go.Scatter(
                    x=base["params"].to_numpy(float), y=base["mean"].to_numpy(float), mode="markers",
                    name=f"{label}: baseline {_e(base['arch'].iloc[0])}",
                    marker=dict(symbol="star", size=20, color="gold", line=dict(width=1.5, color="black")),
                    hovertext=[_config_hover(name, row, metric, trials.get(row["arch"]))
                               for row in base.to_dict("records")],
                    hoverinfo="text",
                )
            )
    metrics = _e(", ".join(sorted({_metric(m)[0] for m in meta.values()})))
    if replicated:
        title = (f"Pareto front of configuration means: parameters vs {metrics}<br><sup>error bars: {LEVEL:.0%} t "
                 "interval; colour: P(on front), the probability of being on the Pareto front; size: depth; "
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
        metric, higher = _metric(meta[name])
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
            spread = (f"std {_num(row['std'], 2)}, n {row['n']} seeds" if row["n"] > 1
                      else "n 1: one seed, no interval")
            shared = f"<br>best of {row['shared']} configurations here" if row["shared"] > 1 else ""
            hover[r][c] = (f"layers {_num(row['layers'])}, heads {_num(row['heads'])}: {_e(row['arch'])}<br>"
                           f"{_e(metric)} {_e(_interval(row))}<br>{spread}{shared}")
        fig.add_trace(
            go.Heatmap(
                z=z, x=[str(int(h)) for h in heads], y=[str(int(d)) for d in layers], coloraxis="coloraxis",
                text=text, texttemplate="%{text}", hovertext=hover, hovertemplate="%{hovertext}<extra></extra>",
            ),
            row=1, col=i,
        )
        fig.layout.annotations[i - 1].text = f"{_e(name)}: {_e(metric)} at width {_num(width) or '?'}"
        fig.update_xaxes(title_text="heads", type="category", row=1, col=i)
        fig.update_yaxes(title_text="layers", type="category", row=1, col=i)
    if any(_replicated(s) for s in stats.values()):
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
                    x=rows["heads"], y=rows[column], mode="markers", name=f"{_e(name)}: κ {when}",
                    marker=dict(color=colour, opacity=0.5, size=7),
                    hovertext=[f"{_e(name)} trial {n}: {_e(a)}" for n, a in rows[["number", "arch"]].to_numpy()],
                    hovertemplate="%{hovertext}<br>κ " + when + " %{y:.3g}<extra></extra>",
                )
            )
            median = rows.groupby("heads")[column].median()
            fig.add_trace(
                go.Scatter(
                    x=median.index, y=median.to_numpy(), mode="lines", name=f"{_e(name)}: median κ {when}",
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
        metric, _ = _metric(meta[name])
        summary = stats[name]
        if summary.empty:
            continue
        measured = _measured(_done(df, metric))
        several = _replicated(summary)
        front = summary.loc[summary["on_front"]].sort_values("params")["arch"]
        for arch in front:
            for row in measured[measured["arch"] == arch].sort_values("seed").to_dict("records"):
                curve = list(row["curve"]) if isinstance(row["curve"], (list, tuple)) else []
                fig.add_trace(
                    go.Scatter(
                        x=list(range(1, len(curve) + 1)), y=curve, mode="lines+markers",
                        name=f"{_e(name)}: {_e(row['arch'])} ({_e(format_count(row['params']))})"
                             + (f" seed {_e(row['seed'])}" if several else ""),
                        legendgroup=f"{_e(name)}: {_e(row['arch'])}",
                        hovertemplate="epoch %{x}: %{y:.4f}<extra>" + _e(row["arch"]) + "</extra>",
                    )
                )
    metrics = sorted({_metric(m)[0] for m in meta.values()})
    fig.update_layout(
        title="Learning curves of the front's configurations (every seed)", xaxis=dict(title="epoch", dtick=1),
        yaxis_title=_e(", ".join(metrics)), height=460,
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
                name=_e(name) + ": " + _e(", ".join(f"{d} {c}" for c, d in objs)),
            )
        )
    fig.update_layout(
        title="Hypervolume of the front after each trial (reference: worst value of each objective + 10% of its range)",
        xaxis_title="trial number", yaxis_title="hypervolume", height=420,
    )
    return fig


def _extrapolation_figure(frames: dict[str, pd.DataFrame], meta: dict[str, dict],
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
        metric, higher = _metric(meta[name])
        summary, done = stats[name], _done(df, metric) if metric in df else df.iloc[0:0]
        left, right = fig.layout.annotations[2 * i - 2], fig.layout.annotations[2 * i - 1]
        if summary.empty:
            left.text = f"{_e(name)}: no completed trials"
            continue
        fig.add_trace(go.Scatter(
            x=summary["params"], y=summary["mean"], mode="markers", name=f"{_e(name)}: measured means",
            marker=dict(color="#333", size=6), hovertext=[_e(a) for a in summary["arch"]],
            error_y=dict(type="data", symmetric=False, array=(summary["hi"] - summary["mean"]).fillna(0),
                         arrayminus=(summary["mean"] - summary["lo"]).fillna(0), thickness=1, width=2),
            hovertemplate="%{hovertext}<br>%{x:,} params: %{y:.4f}<extra></extra>"), row=i, col=1)
        try:
            model = extrapolate.fit(done, metric, higher, bootstrap=DASH_BOOTSTRAP)
        except ExplorerError as err:
            left.text = f"{_e(name)}: no shape law ({_e(err)})"
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
                                     fillcolor="rgba(31,119,180,0.18)", name=f"{_e(name)}: {LEVEL:.0%} band, {part}",
                                     hoverinfo="skip"), row=i, col=1)
            fig.add_trace(go.Scatter(
                x=x, y=model.predict([dims[k] for k in at]), mode="lines", line=dict(color="#1f77b4", dash=dash),
                name=f"{_e(name)}: law's best within budget, {part}", hovertext=[_e(candidates[k][0]) for k in at],
                hovertemplate="budget %{x:,.0f}: %{hovertext}, %{y:.4f}<extra></extra>"), row=i, col=1)
        span = [float(np.nanmin([summary["mean"].min(), lo.min()])), float(np.nanmax([summary["mean"].max(), hi.max()]))]
        for x, label in ((top, "largest measured configuration"), (extrapolate.REACH * top, f"validated reach, {extrapolate.REACH:g}x")):
            fig.add_trace(go.Scatter(x=[x, x], y=span, mode="lines", line=dict(color="#999", dash="dot"),
                                     name=f"{_e(name)}: {label}", hovertemplate=f"{label}: %{{x:,.0f}}<extra></extra>"),
                          row=i, col=1)
        left.text = f"{_e(name)}: {_e(metric)} by budget (x: parameters)"
        fig.update_xaxes(type="log", title_text="parameters (budget)", row=i, col=1)
        fig.update_yaxes(title_text=_e(metric), row=i, col=1)
        right.text = f"{_e(name)}: " + _e(_held_out_check(fig, i, done, summary, metric, higher))
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
        hovertext=[_e(a) for a in large["arch"]],
        hovertemplate="%{hovertext}<br>measured %{x:.4f}, predicted %{y:.4f}<extra></extra>"), row=row, col=2)
    edge = [float(min(measured.min(), lo.min())), float(max(measured.max(), hi.max()))]
    fig.add_trace(go.Scatter(x=edge, y=edge, mode="lines", line=dict(color="#999", dash="dot"), showlegend=False,
                             hoverinfo="skip"), row=row, col=2)
    fig.update_xaxes(title_text=f"measured mean {metric}", row=row, col=2)
    fig.update_yaxes(title_text=f"predicted (fit on {len(small)} configurations up to {format_count(cut)})", row=row, col=2)
    return (f"held-out check: {inside} of {len(large)} larger configurations inside their {LEVEL:.0%} interval, "
            f"mean |error| {np.mean(np.abs(value - measured)):.4f}")


def _text(value: Any) -> str:
    """A table cell's text: numbers shortened, missing values empty."""
    if isinstance(value, (int, float, np.number)) and not isinstance(value, bool):
        return _num(value)
    return "" if value is None else str(value)


def _table(frames: dict[str, pd.DataFrame], meta: dict[str, dict], stats: dict[str, pd.DataFrame]) -> str:
    metrics = list(dict.fromkeys(_metric(meta[name])[0] for name in frames))
    columns = ["study", "number", "state", "arch", "seed", "layers", "heads", "width", "mlp", "params", "flops",
               *metrics, "kappa_init_mean", "kappa_final_mean", "train_time_s", "device", "front", "fail_reason"]
    if not any("seed" in df for df in frames.values()):
        columns.remove("seed")
    body = []
    for name, df in frames.items():
        summary = stats[name]
        on_front = set(summary.loc[summary["on_front"], "arch"]) if len(summary) else set()
        for row in df[[c for c in columns if c in df]].to_dict("records"):
            cells = []
            for c in columns:
                if c == "study":
                    cells.append(f"<td>{_e(name)}</td>")
                elif c == "front":  # the trial's configuration is on the front of means
                    on = row["state"] == "COMPLETE" and row.get("arch") in on_front
                    cells.append(f"<td>{'yes' if on else ''}</td>")
                else:
                    cells.append(_td(c, row.get(c)))
            body.append("<tr>" + "".join(cells) + "</tr>")
    return _sortable("trial-table", columns, body)


def _config_table(frames: dict[str, pd.DataFrame], meta: dict[str, dict], stats: dict[str, pd.DataFrame]) -> str:
    """One row per configuration (`stats.summarize`): its seeds, mean, interval and place on the front."""
    columns = ["study", "arch", "layers", "heads", "width", "mlp", "params", "n", "mean", "±", "lo", "hi", "std",
               "P(on front)", "front", "tied with", "values by seed"]
    if not any(_replicated(summary) for summary in stats.values()):  # no interval anywhere: no empty columns
        columns = [c for c in columns if c not in ("±", "lo", "hi", "std", "P(on front)", "tied with")]
    body = []
    for name, summary in stats.items():
        for row in summary.to_dict("records"):
            finite = math.isfinite(row["hi"]) and math.isfinite(row["lo"])
            values = {
                "study": name, "±": (row["hi"] - row["lo"]) / 2 if finite else None, "P(on front)": row["front_prob"],
                "front": "yes" if row["on_front"] else "",
                "tied with": row["tied_with"] if isinstance(row["tied_with"], str) else "",
                "values by seed": ", ".join(f"{seed}: {_num(v)}" for seed, v in zip(row["seeds"], row["values"])),
            }
            body.append("<tr>" + "".join(_td(c, values[c] if c in values else row.get(c)) for c in columns) + "</tr>")
    return _sortable("config-table", columns, body)


def _td(column: str, value: Any) -> str:
    """One cell; counts (params, FLOPs) are shown as 35.7k and sort by their number."""
    if column in ("params", "flops"):
        shown = "" if value is None or pd.isna(value) else format_count(value)
        return f'<td data-v="{_e(_num(value))}">{_e(shown)}</td>'
    return f"<td>{_e(_text(value))}</td>"


def _sortable(table_id: str, columns: list[str], body: list[str]) -> str:
    head = "".join(f'<th title="sort">{_e(c)}</th>' for c in columns)
    return f'<table id="{table_id}" class="sortable"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _config_note(stats: dict[str, pd.DataFrame]) -> str:
    """What the configuration table's numbers are, or plainly that there are none."""
    if not any(_replicated(s) for s in stats.values()):
        return (f"<p><b>{NO_INTERVALS.capitalize()}</b>: every configuration was trained under one seed, so there "
                "is no spread, interval or front probability to show; more seeds per configuration give them.</p>")
    return (f"<p>Mean over seeds, its {LEVEL:.0%} t interval (lo to hi; ± is half its width; variances moderated "
            "towards the study's pooled replicate variance), P(on front): the probability of being on the Pareto "
            "front, and for a configuration off the front the front member it is tied with (no evidence either "
            "is better). Click a column to sort.</p>")


_STATUS_JS = """
document.documentElement.dataset.rendered = 0;
window.addEventListener('error', function (e) {
  var el = document.documentElement;
  el.dataset.errors = (el.dataset.errors ? el.dataset.errors + ' | ' : '') + e.message;
});
function explorerRendered() {
  var el = document.documentElement;
  el.dataset.rendered = Number(el.dataset.rendered) + 1;
}
"""

_SORT_JS = """
document.querySelectorAll('table.sortable th').forEach(function (th, col) {
  th.addEventListener('click', function () {
    var body = th.closest('table').tBodies[0], up = th.dataset.dir !== 'up';
    th.dataset.dir = up ? 'up' : 'down';
    var key = function (tr) {
      var td = tr.cells[col];
      return td.dataset.v !== undefined ? td.dataset.v : td.textContent;
    };
    var rows = Array.from(body.rows).sort(function (a, b) {
      var x = key(a), y = key(b), nx = parseFloat(x), ny = parseFloat(y);
      var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : (x === '' ? 1 : y === '' ? -1 : x.localeCompare(y));
      return up ? c : -c;
    });
    rows.forEach(function (tr) { body.appendChild(tr); });
  });
});
"""

_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
section { margin-bottom: 2em; }
table { border-collapse: collapse; font-size: 12px; }
th, td { border: 1px solid #ddd; padding: 2px 6px; text-align: right; }
th { cursor: pointer; background: #f4f4f4; position: sticky; top: 0; }
td:nth-child(-n+4), td:last-child { text-align: left; }
"""


def _summary(name: str, df: pd.DataFrame, meta: dict[str, Any], summary: pd.DataFrame) -> str:
    metric, higher = _metric(meta)
    counts = ", ".join(f"{n} {_e(s.lower())}" for s, n in df["state"].value_counts().items())
    text = f"<b>{_e(name)}</b> (space {_e(meta.get('space', '?'))}, metric {_e(metric)}): {counts or 'no trials'}"
    if len(summary):
        best = summary.sort_values("mean", ascending=not higher).iloc[0]
        seeds = f" over {best['n']} seeds" if best["n"] > 1 else ""
        text += (f"; highest mean {_e(best['arch'])} {_e(_interval(best))}{seeds} "
                 f"at {_e(format_count(best['params']))} params")
        if _replicated(summary):
            text += (f"; {len(summary)} configurations, {summary['n'].min()} to {summary['n'].max()} seeds each, "
                     f"{int(summary['on_front'].sum())} on the front of means")
        else:
            text += f"; {NO_INTERVALS}"
    if meta.get("baseline"):
        measured = bool(len(summary)) and (summary["arch"] == meta["baseline"]).any()
        text += f"; baseline {_e(meta['baseline'])}" + ("" if measured else " (not evaluated)")
    return f"<li>{text}</li>"


def figures(frames: dict[str, pd.DataFrame], meta: dict[str, dict],
            stats: dict[str, pd.DataFrame] | None = None) -> dict[str, go.Figure]:
    """The report's figures by div id (usable on their own, e.g. in a notebook); `stats`: `summaries`."""
    stats = summaries(frames, meta) if stats is None else stats
    builders = (_front_figure, _heatmap_figure, _kappa_figure, _curves_figure, _hypervolume_figure, _extrapolation_figure)
    return {div: build(frames, meta, stats) for div, build in zip(FIGURES, builders, strict=True)}


def render(frames: dict[str, pd.DataFrame], out: Path, meta: dict[str, dict]) -> Path:
    """Write the report of one or more studies (name -> `trials_frame`) to `out`; returns `out`.

    `meta[name]` holds `baseline` (config key or None), `objectives`, `metric` and `space`.
    """
    stats = summaries(frames, meta)
    sections = []
    for div, fig in figures(frames, meta, stats).items():
        part = fig.to_html(
            full_html=False, include_plotlyjs=False, div_id=div, config=PLOT_CONFIG,
            post_script="explorerRendered();",
        )
        sections.append(f"<section>{part}</section>")
    title = "explorer: " + ", ".join(frames)
    page = f"""<!DOCTYPE html>
<html lang="en" data-figures="{len(FIGURES)}"><head><meta charset="utf-8"><title>{_e(title)}</title>
<style>{_CSS}</style><script>{_STATUS_JS}</script>
<script type="text/javascript">{get_plotlyjs()}</script></head>
<body><h1>{_e(title)}</h1><ul>{"".join(_summary(n, df, meta[n], stats[n]) for n, df in frames.items())}</ul>
{"".join(sections)}
<section><h2>Configurations</h2>{_config_note(stats)}{_config_table(frames, meta, stats)}</section>
<section><h2>Trials</h2><p>Click a column to sort.</p>{_table(frames, meta, stats)}</section>
<script>{_SORT_JS}</script></body></html>
"""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")  # --watch: a reader never sees half a page
    partial.write_text(page, encoding="utf-8")
    partial.replace(out)
    return out


def default_output(study_yaml: Path, names: Sequence[str]) -> Path:
    """Where a dashboard goes without `--out`: relative to the (first) study file, like every path.

    The nearest folder named `studies` at or above the study decides: `dashboards/NAME.html` beside
    it, so `studies/x.yaml` and `studies/hf/x.yaml` both write to the one `dashboards/`; a study with
    no `studies` folder above it writes `dashboards/NAME.html` in its own folder.
    """
    folder = Path(study_yaml).resolve().parent
    studies = next((p for p in (folder, *folder.parents) if p.name == "studies"), None)
    root = studies.parent if studies else folder
    return root / "dashboards" / ("+".join(names) + ".html")


def render_studies(paths: Sequence[str | Path], out: Path | None = None) -> Path:
    """Render study YAMLs from their storages, read only (`explorer dashboard`); default: `default_output`."""
    frames, meta = {}, {}
    for path in paths:
        study = load_study_spec(path)
        name = study.spec.name
        frames[name] = trials_frame(study.read())
        meta[name] = {
            "baseline": study.space.baseline.key if study.space.baseline else None,
            "objectives": [(o.name, o.direction) for o in study.objectives],
            "metric": study.task.metric,
            "higher_is_better": study.task.higher_is_better,
            "space": study.space.name,
            "candidates": [(c.key, c.dims, c.params) for c in study.space.configs()],
        }
    return render(frames, out or default_output(Path(paths[0]), list(frames)), meta)
