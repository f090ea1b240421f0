"""The `explorer` typer app and what its commands share: the two consoles, the words of shared options,
tables of raw values, and opening a study to read. The commands live in cli_run.py (run, resume),
cli_read.py (status, export, dashboard, recommend) and cli_count.py (params, condition); cli.py is the
entry point. Each goes through the Python API (explorer.api), never deeper.
"""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from explorer import terminal
from explorer.cli_usage import explorer_version
from explorer.errors import ExplorerError
from explorer.terminal import say

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Which (layers, heads) split gives the best accuracy for a parameter budget?")
out = terminal.console()
err = terminal.console(stderr=True)


def _version(shown: bool) -> None:
    if shown:
        say(out, explorer_version())
        raise typer.Exit()


@app.callback()
def _explorer(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                     help="Print explorer's version and exit.")] = False) -> None:
    """Which (layers, heads) split gives the best accuracy for a parameter budget?"""


class Format(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"


FORMAT_HELP = "a table, or csv or json for other programs"
STUDY = "a study YAML"


def print_frame(frame: Any, fmt: Format, title: str | None = None) -> None:
    """A pandas frame as a table (explorer.terminal: it fits the terminal where words allow), CSV or JSON on stdout."""
    if fmt is Format.csv:
        sys.stdout.write(frame.to_csv(index=False))
    elif fmt is Format.json:
        sys.stdout.write(frame.to_json(orient="records", indent=1) + "\n")
    else:
        terminal.print_table(out, *terminal.raw_table(frame), title=title)


def say_table(shown: Any) -> None:
    """A table of explorer.reports (the answers at the study's budgets, the front) with its title and notes."""
    if shown is not None:
        terminal.print_table(out, shown.frame, shown.layout, shown.title, shown.notes)


def scalar(text: str) -> Any:
    """A NAME=VALUE option's value as YAML would read it: an int, a float, a bool or the text."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def pairs(items: list[str], flag: str) -> dict[str, Any]:
    """Repeated `--flag NAME=VALUE` options as a mapping; a pair without `=` is one line naming the flag."""
    given = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise ExplorerError(f"{flag} {item!r}: write NAME=VALUE", field=flag)
        given[name] = scalar(value)
    return given


def read_study(path: Path) -> tuple[Any, str | None]:
    """A study for a read-only command, and how its YAML changed since the study was made (said in one line)."""
    from explorer import api

    exp = api.load(path)
    changed = exp.changed()
    if changed:
        say(err, f"note: {path}: {changed.replace('rerun with --force', '`explorer run --force`')}; showing the stored trials")
    return exp, changed
