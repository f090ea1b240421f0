"""The study report: one self-contained HTML file of plotly figures and a sortable trial table.

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

from explorer.frame import trials_frame
from explorer.pareto import DEFAULT_OBJECTIVES, front_over_time, knee, pareto_mask
from explorer.study import load_study_spec
from explorer.units import format_count

FIGURES = ("fig-front", "fig-heatmap", "fig-kappa", "fig-curves", "fig-hypervolume")
DASHES = ("solid", "dash", "dot", "dashdot")
SYMBOLS = ("circle", "diamond", "square", "triangle-up", "cross", "pentagon", "hexagon", "star-square")
PLOT_CONFIG = {"displaylogo": False, "responsive": True}


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


def _front(done: pd.DataFrame, metric: str, higher: bool) -> pd.DataFrame:
    mask = pareto_mask(done[[metric, "params"]].to_numpy(float), ["maximize" if higher else "minimize", "minimize"])
    return done[mask].sort_values(["params", metric])


def _hover(study: str, row: dict[str, Any], metric: str) -> str:
    config = row.get("config") if isinstance(row.get("config"), dict) else {}
    lines = [
        f"<b>{_e(study)}</b> trial {_e(row['number'])}",
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
            "config"]
    return [_hover(study, row, metric) for row in rows[used].to_dict("records")]


def _front_figure(frames: dict[str, pd.DataFrame], meta: dict[str, dict]) -> go.Figure:
    fig = go.Figure()
    all_heads = sorted({int(h) for df in frames.values() for h in df["heads"].dropna()})
    ticks = [math.log2(h) for h in all_heads]
    for i, (name, df) in enumerate(frames.items()):
        metric, higher = _metric(meta[name])
        done = _done(df, metric)
        if done.empty:
            continue
        label = _e(name)
        fig.add_trace(
            go.Scatter(
                x=done["params"], y=done[metric], mode="markers", name=f"{label}: trials",
                hovertext=_hovers(name, done, metric), hoverinfo="text",
                marker=dict(
                    symbol=SYMBOLS[i % len(SYMBOLS)],
                    size=5 + 15 * done["layers"].fillna(1).to_numpy() / max(done["layers"].max(), 1),
                    color=np.log2(done["heads"].fillna(1).to_numpy(float)), coloraxis="coloraxis",
                    line=dict(width=0.5, color="#333"), opacity=0.85,
                ),
            )
        )
        front = _front(done, metric, higher)
        fig.add_trace(
            go.Scatter(
                x=front["params"], y=front[metric], mode="lines", line_shape="hv",
                name=f"{label}: front", line=dict(width=2), hoverinfo="skip",
            )
        )
        k = front.iloc[knee(front[["params", metric]].to_numpy(float))]
        fig.add_annotation(x=k["params"], y=k[metric], text=f"knee: {_e(k['arch'])}", showarrow=True, arrowhead=2)
        base = done[done["arch"] == meta[name].get("baseline")]
        if len(base):
            fig.add_trace(
                go.Scatter(
                    x=base["params"], y=base[metric], mode="markers",
                    name=f"{label}: baseline {_e(base['arch'].iloc[0])}",
                    marker=dict(symbol="star", size=20, color="gold", line=dict(width=1.5, color="black")),
                    hovertext=_hovers(name, base, metric), hoverinfo="text",
                )
            )
    metrics = sorted({_metric(m)[0] for m in meta.values()})
    fig.update_layout(
        title="Pareto front: parameters vs " + _e(", ".join(metrics)) + " (colour = heads, size = depth)",
        xaxis_title="parameters", yaxis_title=_e(", ".join(metrics)), height=560,
        coloraxis=dict(
            colorscale="Viridis",
            colorbar=dict(title="heads", tickvals=ticks, ticktext=[str(h) for h in all_heads]),
        ),
        legend=dict(orientation="h", y=-0.2),
    )
    return fig


def _heatmap_figure(frames: dict[str, pd.DataFrame], meta: dict[str, dict]) -> go.Figure:
    fig = make_subplots(rows=1, cols=len(frames), subplot_titles=[" "] * len(frames))
    for i, (name, df) in enumerate(frames.items(), start=1):
        metric, _ = _metric(meta[name])
        done = _done(df, metric)
        if done.empty:
            continue
        widths = done["width"].dropna()
        width = widths.mode().iloc[0] if len(widths) else None
        at = done if width is None else done[done["width"] == width]
        grid = at.pivot_table(index="layers", columns="heads", values=metric, aggfunc="mean")
        fig.add_trace(
            go.Heatmap(
                z=grid.to_numpy(), x=[str(int(h)) for h in grid.columns], y=[str(int(d)) for d in grid.index],
                coloraxis="coloraxis", texttemplate="%{z:.3f}",
                hovertemplate="layers %{y}, heads %{x}<br>" + _e(metric) + " %{z:.4f}<extra></extra>",
            ),
            row=1, col=i,
        )
        fig.layout.annotations[i - 1].text = f"{_e(name)}: {_e(metric)} at width {_num(width) or '?'}"
        fig.update_xaxes(title_text="heads", type="category", row=1, col=i)
        fig.update_yaxes(title_text="layers", type="category", row=1, col=i)
    fig.update_layout(
        title="Depth x heads at fixed width (mean over trials)", height=460, coloraxis_colorscale="Viridis"
    )
    return fig


def _kappa_figure(frames: dict[str, pd.DataFrame], meta: dict[str, dict]) -> go.Figure:
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


def _curves_figure(frames: dict[str, pd.DataFrame], meta: dict[str, dict]) -> go.Figure:
    fig = go.Figure()
    for name, df in frames.items():
        metric, higher = _metric(meta[name])
        done = _done(df, metric)
        if done.empty:
            continue
        for _, row in _front(done, metric, higher).iterrows():
            curve = list(row["curve"]) if isinstance(row["curve"], (list, tuple)) else []
            fig.add_trace(
                go.Scatter(
                    x=list(range(1, len(curve) + 1)), y=curve, mode="lines+markers",
                    name=f"{_e(name)}: {_e(row['arch'])} ({_e(format_count(row['params']))})",
                    hovertemplate="epoch %{x}: %{y:.4f}<extra>" + _e(row["arch"]) + "</extra>",
                )
            )
    metrics = sorted({_metric(m)[0] for m in meta.values()})
    fig.update_layout(
        title="Learning curves of the front's trials", xaxis=dict(title="epoch", dtick=1),
        yaxis_title=_e(", ".join(metrics)), height=460,
    )
    return fig


def _hypervolume_figure(frames: dict[str, pd.DataFrame], meta: dict[str, dict]) -> go.Figure:
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


def _text(value: Any) -> str:
    """A table cell's text: numbers shortened, missing values empty."""
    if isinstance(value, (int, float, np.number)) and not isinstance(value, bool):
        return _num(value)
    return "" if value is None else str(value)


def _table(frames: dict[str, pd.DataFrame], meta: dict[str, dict]) -> str:
    metrics = list(dict.fromkeys(_metric(meta[name])[0] for name in frames))
    columns = ["study", "number", "state", "arch", "layers", "heads", "width", "mlp", "params", "flops",
               *metrics, "kappa_init_mean", "kappa_final_mean", "train_time_s", "device", "front", "fail_reason"]
    head = "".join(f'<th title="sort">{_e(c)}</th>' for c in columns)
    body = []
    for name, df in frames.items():
        metric, higher = _metric(meta[name])
        on_front = set(_front(_done(df, metric), metric, higher)["number"])
        for row in df[[c for c in columns if c in df]].to_dict("records"):
            cells = []
            for c in columns:
                if c == "study":
                    cells.append(f"<td>{_e(name)}</td>")
                elif c == "front":
                    cells.append(f"<td>{'yes' if row['number'] in on_front else ''}</td>")
                elif c in ("params", "flops"):
                    v = row.get(c)
                    shown = "" if v is None or pd.isna(v) else format_count(v)
                    cells.append(f'<td data-v="{_e(_num(v))}">{_e(shown)}</td>')
                else:
                    cells.append(f"<td>{_e(_text(row.get(c)))}</td>")
            body.append("<tr>" + "".join(cells) + "</tr>")
    return f'<table id="trial-table"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


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
document.querySelectorAll('#trial-table th').forEach(function (th, col) {
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


def _summary(name: str, df: pd.DataFrame, meta: dict[str, Any]) -> str:
    metric, higher = _metric(meta)
    done = _done(df, metric)
    counts = ", ".join(f"{n} {_e(s.lower())}" for s, n in df["state"].value_counts().items())
    text = f"<b>{_e(name)}</b> (space {_e(meta.get('space', '?'))}, metric {_e(metric)}): {counts or 'no trials'}"
    if len(done):
        best = done.sort_values(metric, ascending=not higher).iloc[0]
        text += f"; best {_e(best['arch'])} {_e(_num(best[metric]))} at {_e(format_count(best['params']))} params"
    if meta.get("baseline"):
        measured = (done["arch"] == meta["baseline"]).any()
        text += f"; baseline {_e(meta['baseline'])}" + ("" if measured else " (not evaluated)")
    return f"<li>{text}</li>"


def figures(frames: dict[str, pd.DataFrame], meta: dict[str, dict]) -> dict[str, go.Figure]:
    """The report's figures by div id (usable on their own, e.g. in a notebook)."""
    builders = (_front_figure, _heatmap_figure, _kappa_figure, _curves_figure, _hypervolume_figure)
    return {div: build(frames, meta) for div, build in zip(FIGURES, builders, strict=True)}


def render(frames: dict[str, pd.DataFrame], out: Path, meta: dict[str, dict]) -> Path:
    """Write the report of one or more studies (name -> `trials_frame`) to `out`; returns `out`.

    `meta[name]` holds `baseline` (config key or None), `objectives`, `metric` and `space`.
    """
    sections = []
    for div, fig in figures(frames, meta).items():
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
<body><h1>{_e(title)}</h1><ul>{"".join(_summary(n, df, meta[n]) for n, df in frames.items())}</ul>
{"".join(sections)}
<section><h2>Trials</h2><p>Click a column to sort.</p>{_table(frames, meta)}</section>
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

    A study in the repository's `studies/` folder writes `../dashboards/NAME.html` (the `dashboards/`
    beside it); a study elsewhere writes `dashboards/NAME.html` in its own folder.
    """
    folder = Path(study_yaml).resolve().parent
    root = folder.parent if folder.name == "studies" else folder
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
        }
    return render(frames, out or default_output(Path(paths[0]), list(frames)), meta)
