"""How the report writes a value: user text escaped, numbers shortened, a mean with its interval.

Its one job is strings. It must not import plotly or compute a statistic: the numbers it writes come
from `explorer.stats` by way of `reading.summaries`.
"""

from __future__ import annotations

import html
import math
from typing import Any

from explorer.formats import split
from explorer.stats import LEVEL

NO_INTERVALS = "one seed per configuration: no intervals"


def esc(value: Any) -> str:
    """`value` as HTML-safe text: plotly renders labels and hovers as HTML, and a study name is user text."""
    return html.escape(str(value), quote=True)


def split_config(key: Any) -> str:
    """A configuration's key as the report writes it: `3 / 8` (explorer.formats.split), HTML-safe."""
    return esc(split(str(key)))


def num(value: Any, digits: int = 4) -> str:
    """A number in `digits` significant digits (an integer as itself); empty for a missing value."""
    if value is None or not math.isfinite(number := float(value)):
        return ""
    return str(int(number)) if number.is_integer() else f"{number:.{digits}g}"


def interval_text(row: Any, digits: int = 4) -> str:
    """'0.9453 ± 0.0091 (95% interval 0.9362 to 0.9544)', or the mean alone where there is no interval."""
    if not math.isfinite(row["hi"]) or not math.isfinite(row["lo"]):
        return num(row["mean"], digits)
    half = (row["hi"] - row["lo"]) / 2
    return (f"{num(row['mean'], digits)} ± {num(half, 2)} "
            f"({LEVEL:.0%} interval {num(row['lo'], digits)} to {num(row['hi'], digits)})")
