"""The report as one self-contained HTML file: the figures by div id, a summary line per study, the
sortable configuration and trial tables, and where the file goes (`default_output`).

plotly.js is inlined once in <head> (no CDN), so the file opens offline; the page is written beside
its target and renamed, so a `--watch` reader never sees half of one. Everything a user wrote (study
names, config values, failure messages) is escaped (`text.esc`) before it reaches the page. This
module lays out what the others compute: it must not build a figure (`plots.py`, `extrapolation.py`)
or compute a statistic (`reading.summaries`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pandas as pd
from plotly.offline import get_plotlyjs

from explorer.dashboard.plots import FIGURES, figures
from explorer.dashboard.reading import answers, is_replicated, metric_of, summaries
from explorer.dashboard.text import NO_INTERVALS, esc, interval_text, num, split_config
from explorer.decisions import table
from explorer.frame import trials_frame
from explorer.identity import current_rows
from explorer.posterior import at_length
from explorer.recommend import describe
from explorer.space import widened
from explorer.stats import LEVEL
from explorer.study import Study, load_study_spec
from explorer.units import format_count

PLOT_CONFIG = {"displaylogo": False, "responsive": True}


def _text(value: Any) -> str:
    """A table cell's text: numbers shortened, missing values empty."""
    if isinstance(value, (int, float, np.number)) and not isinstance(value, bool):
        return num(value)
    return "" if value is None else str(value)


def _table(frames: dict[str, pd.DataFrame], meta: dict[str, dict], stats: dict[str, pd.DataFrame]) -> str:
    metrics = list(dict.fromkeys(metric_of(meta[name])[0] for name in frames))
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
                    cells.append(f"<td>{esc(name)}</td>")
                elif c == "front":  # the trial's configuration is on the front of means
                    on = row["state"] == "COMPLETE" and row.get("arch") in on_front
                    cells.append(f"<td>{'yes' if on else ''}</td>")
                else:
                    cells.append(_td(c, row.get(c)))
            body.append("<tr>" + "".join(cells) + "</tr>")
    return _sortable("trial-table", columns, body)


def _config_table(frames: dict[str, pd.DataFrame], meta: dict[str, dict], stats: dict[str, pd.DataFrame]) -> str:
    """One row per configuration (`stats.summarize`): its seeds, mean, interval and place on the front."""
    columns = ["study", "arch", "layers", "heads", "width", "mlp", "params", "n", "raw", "mean", "±", "lo", "hi", "std",
               "P(on front)", "front", "tied with", "values by seed"]
    if not any(is_replicated(summary) for summary in stats.values()):  # no interval anywhere: no empty columns
        columns = [c for c in columns if c not in ("±", "lo", "hi", "std", "P(on front)", "tied with")]
    body = []
    for name, summary in stats.items():
        for row in summary.to_dict("records"):
            finite = math.isfinite(row["hi"]) and math.isfinite(row["lo"])
            values = {
                "study": name, "±": (row["hi"] - row["lo"]) / 2 if finite else None, "P(on front)": row["front_prob"],
                "front": "yes" if row["on_front"] else "",
                "tied with": row["tied_with"] if isinstance(row["tied_with"], str) else "",
                "values by seed": ", ".join(f"{seed}: {num(v)}" for seed, v in zip(row["seeds"], row["values"])),
            }
            body.append("<tr>" + "".join(_td(c, values[c] if c in values else row.get(c)) for c in columns) + "</tr>")
    return _sortable("config-table", columns, body)


def _td(column: str, value: Any) -> str:
    """One cell; counts (params, FLOPs) are shown as 35.7k and sort by their number; a configuration as `3 / 8`."""
    if column in ("arch", "tied with") and isinstance(value, str) and value:
        return f"<td>{split_config(value)}</td>"
    if column in ("params", "flops"):
        shown = "" if value is None or pd.isna(value) else format_count(value)
        return f'<td data-v="{esc(num(value))}">{esc(shown)}</td>'
    return f"<td>{esc(_text(value))}</td>"


def _sortable(table_id: str, columns: list[str], body: list[str]) -> str:
    head = "".join(f'<th title="sort">{esc(c)}</th>' for c in columns)
    return f'<table id="{table_id}" class="sortable"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _answers_table(meta: dict[str, dict], stats: dict[str, pd.DataFrame]) -> str:
    """Budget -> the configuration to use and its bound eps, decided or not, its verdict against the
    baseline: the answer each study gives at its budgets (explorer.decisions), beside the front."""
    body, columns, models = [], ["study"], []
    for name, summary in stats.items():
        model = describe(summary.attrs["posterior"]) if "posterior" in summary.attrs else ""
        models += [f"<p>The model of {esc(name)}: {esc(model)}.</p>"] if model else []
        lengths = (meta[name].get("lengths") or [None]) if summary.attrs.get("epochs") else [None]
        for epochs in lengths:  # a ladder: the answers at each length it trains
            said = answers(summary, meta[name], epochs)
            if not said:
                continue
            metric, higher = metric_of(meta[name])
            post = summary.attrs["posterior"] if epochs is None else at_length(summary.attrs["full"], epochs)
            rows = table(said, post, metric, higher)
            if epochs is not None:
                rows.insert(0, "epochs", epochs)
            columns = ["study", *rows.columns]
            body += ["<tr>" + _td("study", name) + "".join(_td(c, v) for c, v in row.items()) + "</tr>"
                     for row in rows.to_dict("records")]
    if not body:
        return ""
    note = ("<p>At each budget: use the configuration named, within ε (points for an accuracy) of the best configuration "
            "within the budget with 95% probability under the study's posterior; decided when ε is at most the study's "
            "margin (decision.delta). The verdict against the baseline comes from the same posterior.</p>")
    return f"<section><h2>Answers by budget</h2>{note}{_sortable('answer-table', columns, body)}{''.join(models)}</section>"


def _config_note(stats: dict[str, pd.DataFrame]) -> str:
    """What the configuration table's numbers are, or plainly that there are none."""
    if not any(is_replicated(s) for s in stats.values()):
        return (f"<p><b>{NO_INTERVALS.capitalize()}</b>: every configuration was trained under one seed, so there "
                "is no spread, interval or front probability to show; more seeds per configuration give them.</p>")
    return (f"<p>Mean: the posterior mean of each configuration's metric (its seeds' plain mean moved towards a smooth "
            f"surface over the free dimensions as far as its noise allows; raw: the plain mean), its {LEVEL:.0%} "
            "interval (lo to hi; ± is half its width; inside [0, 1] for an accuracy), P(on front): the share of "
            "posterior draws in which it is on the Pareto front, and for a configuration off the front the front "
            "member the posterior cannot tell from it. Click a column to sort.</p>")


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
function explorerSortable() {
  document.querySelectorAll('table.sortable th').forEach(function (th) {
    var col = th.cellIndex;  // its own table's column
    if (th.dataset.bound) return;
    th.dataset.bound = 1;
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
}
explorerSortable();
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
    metric, higher = metric_of(meta)
    counts = ", ".join(f"{n} {esc(s.lower())}" for s, n in df["state"].value_counts().items())
    text = f"<b>{esc(name)}</b> (space {esc(meta.get('space', '?'))}, metric {esc(metric)}): {counts or 'no trials'}"
    if len(summary):
        best = summary.sort_values("mean", ascending=not higher).iloc[0]
        seeds = f" over {best['n']} seeds" if best["n"] > 1 else ""
        text += (f"; highest mean {split_config(best['arch'])} {esc(interval_text(best))}{seeds} "
                 f"at {esc(format_count(best['params']))} params")
        if is_replicated(summary):
            text += (f"; {len(summary)} configurations, {summary['n'].min()} to {summary['n'].max()} seeds each, "
                     f"{int(summary['on_front'].sum())} on the front of means")
        else:
            text += f"; {NO_INTERVALS}"
    if meta.get("baseline"):
        measured = bool(len(summary)) and (summary["arch"] == meta["baseline"]).any()
        text += f"; baseline {split_config(meta['baseline'])}" + ("" if measured else " (not evaluated)")
    return f"<li>{text}</li>"



def parts(frames: dict[str, pd.DataFrame], meta: dict[str, dict], stats: dict[str, pd.DataFrame]) -> dict[str, str]:
    """The page's parts other than figures, by element id: what a live page replaces as its studies move."""
    return {
        "summary": "".join(_summary(n, df, meta[n], stats[n]) for n, df in frames.items()),
        "answers": _answers_table(meta, stats),
        "configs": _config_note(stats) + _config_table(frames, meta, stats),
        "trials": _table(frames, meta, stats),
    }


def page(frames: dict[str, pd.DataFrame], meta: dict[str, dict], live: dict[str, str] | None = None) -> str:
    """The report's HTML (see `render`). `live` (explorer.dashboard.live): its running-trials figure, shown
    first, and its script, which updates the page in place."""
    stats = summaries(frames, meta)
    sections = []
    for div, fig in figures(frames, meta, stats).items():
        part = fig.to_html(
            full_html=False, include_plotlyjs=False, div_id=div, config=PLOT_CONFIG,
            post_script="explorerRendered();",
        )
        sections.append(f"<section>{part}</section>")
    title = "explorer: " + ", ".join(frames)
    said = parts(frames, meta, stats)
    live = live or {}
    return f"""<!DOCTYPE html>
<html lang="en" data-figures="{len(FIGURES)}"><head><meta charset="utf-8"><title>{esc(title)}</title>
<style>{_CSS}</style><script>{_STATUS_JS}</script>
<script type="text/javascript">{get_plotlyjs()}</script></head>
<body><h1>{esc(title)}</h1>{live.get("status", "")}<ul id="summary">{said["summary"]}</ul>{live.get("figure", "")}
{sections[0] if sections else ""}<div id="answers">{said["answers"]}</div>{"".join(sections[1:])}
<section><h2>Configurations</h2><div id="configs">{said["configs"]}</div></section>
<section><h2>Trials</h2><p>Click a column to sort.</p><div id="trials">{said["trials"]}</div></section>
<script>{_SORT_JS}</script>{live.get("script", "")}</body></html>
"""


def render(frames: dict[str, pd.DataFrame], out: Path, meta: dict[str, dict]) -> Path:
    """Write the report of one or more studies (name -> `trials_frame`) to `out`; returns `out`.

    `meta[name]` holds `baseline` (config key or None), `objectives`, `metric` and `space`; optionally
    `higher_is_better`, `candidates` (for the shape law) and `first_seed` (the study's first seed: that of
    a trial stored without one; else 0).
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")  # --watch: a reader never sees half a page
    partial.write_text(page(frames, meta), encoding="utf-8")
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


def meta_of(study: Study) -> dict[str, Any]:
    """What `render` needs to know of a study besides its trials."""
    return {
        "baseline": study.space.baseline.key if study.space.baseline else None,
        "objectives": [(o.name, o.direction) for o in study.objectives],
        "metric": study.task.metric,
        "higher_is_better": study.task.higher_is_better,
        "space": study.space.name,
        "first_seed": study.seeds[0],  # what a trial stored without a seed trained with
        "candidates": [(c.key, c.dims, c.params) for c in study.space.configs()],
        "budgets": study.budgets(),
        "decision": study.spec.decision,
        "seed_cap": study.seed_cap,
        **_lengths(study),
    }


def frame_of(ostudy: optuna.Study) -> pd.DataFrame:
    """A stored study's trials as the report reads them: those of an earlier identity are set aside."""
    return current_rows(trials_frame(ostudy), ostudy)


def _lengths(study: Study) -> dict[str, Any]:
    """The meta of a study's lengths (a ladder: the target, the rungs, each rung's epochs of compute) and the
    splits past its space within a budget (`widened`: the past-the-range figure asks for them)."""
    budget = study.spec.budget
    out: dict[str, Any] = {"widened": lambda limit: [(c.key, c.dims, c.params) for c in widened(study.space, limit)]}
    if len(budget.ladder) > 1:
        out.update(epochs=study.target_epochs, lengths=budget.ladder, budget=budget, seeds=study.seeds)
    return out


def render_studies(paths: Sequence[str | Path], out: Path | None = None) -> Path:
    """Render study YAMLs from their storages, read only (`explorer dashboard`); default: `default_output`."""
    studies = [load_study_spec(path) for path in paths]
    frames = {study.spec.name: frame_of(study.read()) for study in studies}
    return render(frames, out or default_output(Path(paths[0]), list(frames)), {s.spec.name: meta_of(s) for s in studies})
