"""How the command line writes to a terminal: tables that fit its width without breaking a word, and
prose that wraps between words, in plain text for a pipe or `NO_COLOR`.

A table's cells are strings already written for people (explorer.formats); each column either never
wraps (a split, a number, a budget: its width is its longest cell) or wraps between words (a verdict, a
list), and the widths are chosen here rather than by rich, whose own shrinking may cut a word. Columns
marked droppable leave first when the terminal is too narrow for all of them; a table that still does
not fit is printed wider than the terminal, never with a word or a number cut.
"""

from __future__ import annotations

import math
import numbers
import os
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:  # pandas loads with the library, not with `explorer --help`
    import pandas as pd

UNLIMITED = 100_000  # columns: a console this wide measures a table's own width
GAP = 2  # columns between two table columns (one space of padding each side, collapsed, and the divider)


@dataclass(frozen=True)
class Col:
    """How one column is laid out: numbers right-aligned; `wrap` lets long text wrap between words;
    `drop` > 0 lets the column leave when the table does not fit (the highest first)."""

    right: bool = False
    wrap: bool = False
    drop: int = 0


def console(stderr: bool = False, **options: Any) -> Console:
    """A console for stdout or stderr: styled on a terminal, plain text in a pipe or under NO_COLOR
    (no-color.org: set and not empty), where rich alone would still write bold. `options` go to rich's Console."""
    plain = os.environ.get("NO_COLOR", "") != ""
    return Console(stderr=stderr, highlight=False, color_system=None if plain else "auto", **options)


def say(con: Console, text: str, wrap: bool = True) -> None:
    """A paragraph of prose, wrapped between words at the console's width: the terminal's, or 80 columns
    in a pipe (`COLUMNS` changes it). `wrap=False` keeps it one line whatever its length (an error, for
    grep and logs)."""
    for line in wrapped(text, con.width) if wrap else [text]:
        con.print(line, markup=False, highlight=False, soft_wrap=True)


def wrapped(text: str, width: int) -> list[str]:
    """`text`'s lines wrapped between words at `width`, a continuation indented two columns past its
    line; a word wider than that (a path, a URL) is kept whole on a line of its own, never cut."""
    out = []
    for line in text.split("\n"):
        indent = line[:len(line) - len(line.lstrip())]
        out += textwrap.wrap(line, max(width, 20), subsequent_indent=indent + "  ", break_long_words=False,
                             break_on_hyphens=False) or [""]
    return out


def _words(text: str) -> list[str]:
    return [w for line in text.split("\n") for w in line.split()] or [""]


def _bounds(header: str, cells: Sequence[str], col: Col) -> tuple[int, int, int]:
    """(narrowest, widest body line, widest) content width: a wrapping column down to its longest word, any
    other at its longest line; a header wraps between its words either way."""
    lines = [line for cell in cells for line in cell.split("\n")]
    body = max(map(cell_len, lines), default=0)
    header_min = max(map(cell_len, _words(header)))
    body_min = max(map(cell_len, [w for c in cells for w in _words(c)]), default=0) if col.wrap else body
    return max(header_min, body_min), max(header_min, body), max(cell_len(header), body)


def _fit(bounds: list[tuple[int, int, int]], room: int) -> list[int]:
    """Widths within `bounds` summing to at most `room`: headers wrap first (widest first), then the
    widest wrapping column narrows towards its longest word."""
    widths = [hi for _, _, hi in bounds]
    for floor in ([max(lo, body) for lo, body, _ in bounds], [lo for lo, _, _ in bounds]):
        while sum(widths) > room:
            narrowable = [i for i, w in enumerate(widths) if w > floor[i]]
            if not narrowable:
                break
            widths[max(narrowable, key=lambda j: widths[j])] -= 1
    return widths


def table(frame: pd.DataFrame, layout: Mapping[str, Col], width: int) -> Table:
    """`frame` (strings; a cell may hold several lines) as a table at most `width` columns wide where its
    columns allow; columns with `drop` leave, highest first, until it fits."""
    cells = {c: ["" if v is None else str(v) for v in frame[c]] for c in frame.columns}
    keep = list(frame.columns)

    def need(cols: list[str]) -> int:
        return sum(_bounds(str(c), cells[c], layout.get(c, Col()))[0] for c in cols) + GAP * (len(cols) - 1)

    while need(keep) > width and any(layout.get(c, Col()).drop for c in keep):
        keep.remove(max(keep, key=lambda c: layout.get(c, Col()).drop))
    specs = [layout.get(c, Col()) for c in keep]
    widths = _fit([_bounds(str(c), cells[c], s) for c, s in zip(keep, specs)], width - GAP * (len(keep) - 1))
    out = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1), collapse_padding=True,
                header_style="bold")
    for c, s, w in zip(keep, specs, widths):  # a header wraps between words, also over a column that never wraps
        header = "\n".join(textwrap.wrap(str(c), w, break_long_words=False, break_on_hyphens=False)) or str(c)
        out.add_column(header, justify="right" if s.right else "left", width=w, no_wrap=not s.wrap, overflow="fold")
    for i in range(len(frame)):
        out.add_row(*(cells[c][i] for c in keep))
    return out


def print_table(con: Console, frame: pd.DataFrame, layout: Mapping[str, Col], title: str | None = None,
                notes: Sequence[str] = ()) -> None:
    """A titled table with its notes below, on `con`; wider than the terminal only where no word would fit."""
    if title:
        say(con, title)
    shown = table(frame, layout, con.width)
    needed = Console(width=UNLIMITED).measure(shown).maximum
    (con if needed <= con.width else Console(width=needed, file=con.file, color_system=con.color_system)).print(shown)
    for line in notes:
        say(con, line)


def cell(value: object) -> str:
    """A raw value as a table shows it: 4 significant digits, thousands separated, blank where missing."""
    import numpy as np
    import pandas as pd

    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else ""
    if isinstance(value, numbers.Integral):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, numbers.Real):
        return f"{value:.4g}"
    return str(value)


HEADERS = {"n": "seeds", "front_prob": "P(front)", "kappa_init_mean": "κ at init", "kappa_final_mean": "κ trained",
           "flops": "FLOPs", "M": "rounded", "head_dim": "head dim", "kappa": "κ", "kappa_first": "κ first block",
           "kappa_last": "κ last block", "kappa_channel": "κ channel", "kappa_inner": "κ inner",
           "train_time_s": "train s", "kv_heads": "kv heads"}


def raw_table(frame: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, Col]]:
    """A frame of raw values (`explorer params`, `condition`) as strings under word headers; numbers right-aligned,
    text wrapping between words."""
    import pandas as pd

    shown = pd.DataFrame({HEADERS.get(str(c), str(c)): [cell(v) for v in frame[c]] for c in frame.columns})
    layout = {HEADERS.get(str(c), str(c)): Col(right=frame[c].dtype.kind in "iuf", wrap=frame[c].dtype.kind not in "iufb")
              for c in frame.columns}
    return shown, layout
