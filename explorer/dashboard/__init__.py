"""The study report: one self-contained HTML file of plotly figures and sortable configuration and trial tables.

Every figure and table that speaks of a configuration reads its statistics from `explorer.stats.summarize`
(`summaries`): the front is drawn at the posterior means with their 95% intervals, coloured by the
probability of being on the Pareto front, with every replicate visible; nothing here averages trials.
A study with one seed per configuration says so where the intervals would be.

The only package that imports plotly. The map, one job a module:

    reading.py        what the report reads: metric, objectives, measurements, `stats.summarize` tables
    text.py           how it writes a value: escaped user text, short numbers, a mean with its interval
    plots.py          the figures (front, heatmap, κ, curves, hypervolume) and `figures`, all by div id
    extrapolation.py  the shape-law figure past the measured range, and its held-out check
    page.py           the HTML page: summary, tables, scripts, `render`, `render_studies`, `default_output`
    live.py           `explorer dashboard --serve`: the page served locally, updating in place as trials run
"""

from explorer.dashboard.page import PLOT_CONFIG, default_output, render, render_studies
from explorer.dashboard.plots import FIGURES, figures
from explorer.dashboard.reading import objectives, summaries
from explorer.dashboard.text import NO_INTERVALS

__all__ = ["FIGURES", "NO_INTERVALS", "PLOT_CONFIG", "default_output", "figures", "objectives", "render",
           "render_studies", "summaries"]
