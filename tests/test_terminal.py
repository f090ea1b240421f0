"""What a user reads in a terminal (issue 35, item 1): the tables and lines `run`, `status`, `recommend`,
`params` and `export` print keep every word whole at 80 columns and use the room at 120; a split is
written one way (`3 / 8`, `3 / 8 / w96`) in the terminal and the dashboard; numbers are written per
column under word headers; a pipe and NO_COLOR get plain text."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from conftest import write_study
from rich.cells import cell_len
from rich.console import Console
from typer.testing import CliRunner

import explorer
from explorer import cli, cli_app, reports, terminal
from explorer.formats import bound, margin, plural, same_precision, split, split_header
from explorer.terminal import Col

ROOT = Path(__file__).resolve().parents[1]
QUICK = {"epochs": 1, "max_steps": 2, "batch_size": 64, "lr": 0.003, "seed": 0}
RULE = re.compile(r"^[─━═\s]+$")


def rendered(frame: pd.DataFrame, layout: dict[str, Col], width: int) -> list[str]:
    con = Console(width=width, file=io.StringIO(), color_system=None)
    con.print(terminal.table(frame, layout, width))
    return con.file.getvalue().splitlines()


def assert_whole(frame: pd.DataFrame, layout: dict[str, Col], lines: list[str]) -> None:
    """Every word of every cell and header on one line; a cell of a column that never wraps, whole."""
    for col in frame.columns:
        wraps = layout.get(col, Col()).wrap
        for cell in [*map(str, frame[col])]:
            for piece in (cell.split() if wraps else cell.split("\n")):
                assert any(piece in line for line in lines), (col, piece, "\n".join(lines))
        for word in str(col).split():
            assert any(word in line for line in lines), (col, word)


def words(text: str) -> Counter:
    """The words of a command's output, rules left out: the same at any width unless a word was broken."""
    return Counter(w for line in text.splitlines() if not RULE.match(line) for w in line.split())


def shown_at(width: int, *args: object, monkeypatch: pytest.MonkeyPatch) -> str:
    """A command's stdout on a terminal `width` columns wide (plain: NO_COLOR), prose wrapped by rich."""
    monkeypatch.setenv("NO_COLOR", "1")
    buf = io.StringIO()
    monkeypatch.setattr(cli_app, "out", terminal.console(file=buf, width=width, force_terminal=True))
    result = CliRunner().invoke(cli.app, [str(a) for a in args])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return buf.getvalue()


def assert_fits(text: str, width: int) -> None:
    assert "\x1b[" not in text, "NO_COLOR: plain text"
    assert max(map(cell_len, text.splitlines())) <= width, text


# -- the split and the numbers ------------------------------------------------------------------------------
def test_one_compact_form_for_a_split() -> None:
    assert split("layers=3,heads=8") == "3 / 8"
    assert split("layers=3,heads=8,width=96") == "3 / 8 / w96"
    assert split("layers=3,heads=8,width=96,mlp=256") == "3 / 8 / w96 / mlp256"
    assert split("layers=2,heads=4,kv_heads=2") == "2 / 4 / kv2"
    assert split({"layers": 3, "heads": 8, "width": 96}) == "3 / 8 / w96"
    assert split("layers=4") == "layers=4" and split("c03") == "c03"  # no split to write: the name as it is
    assert split_header(["layers", "heads", "width"]) == "layers / heads / width"
    assert plural(1, "run") == "1 run" and plural(2, "run") == "2 runs" and plural(0, "seed") == "0 seeds"
    assert same_precision(0.0123, "0.746") == "0.012" and same_precision(0.0123, "0.7461") == "0.0123"


def test_a_bound_is_shown_rounded_up_so_it_never_reads_as_the_margin_it_exceeds() -> None:
    assert [bound(x) for x in (0.0, 0.0086, 0.01, 0.0104, 0.262)] == ["0.0", "0.9", "1.0", "1.1", "26.2"]
    assert margin(0.0104, 100, "points") == "1.1 points" and margin(0.01, 100, "points") == "1 point"
    assert margin(0.01, 100, "points", exact=True) == "1 point"  # a margin the user chose is shown as chosen


def test_status_tables_keep_words_whole_at_80_columns_and_use_the_room_at_120(replicated: Path) -> None:
    st = explorer.load(replicated).status()
    for shown in (reports.answers(st), reports.front(st)):
        assert shown is not None
        for width in (80, 120):
            lines = rendered(shown.frame, shown.layout, width)
            assert_whole(shown.frame, shown.layout, lines)
            assert max(map(cell_len, lines)) <= width
            if width == 120:  # room enough: one line per header and per row
                assert len(lines) == 2 + len(shown.frame), "\n".join(lines)


def test_a_table_too_wide_for_the_terminal_wraps_between_words_and_drops_what_may_go() -> None:
    """The widest cells the tables hold (a budget range, a split with width and MLP free, the longest verdict):
    narrower than they need, text wraps between words and the droppable column leaves; at 120 every row is one line."""
    frame = pd.DataFrame({"budget": ["138.0k to 167.4k", "35.7k"], "use": ["12 / 48 / w1024 / mlp4096", "1 / 8"],
                          "params": ["169.6M", "35.7k"], "accuracy": ["0.938", "0.908"], "±": ["0.012", "0.020"],
                          "vs baseline": ["is the baseline", "no evidence"], "κ at init": ["1.37e+04", "2.1e+03"]})
    layout = {"budget": Col(wrap=True), "params": Col(right=True), "accuracy": Col(right=True), "±": Col(right=True),
              "vs baseline": Col(wrap=True), "κ at init": Col(right=True, drop=1)}
    narrow = rendered(frame, layout, 72)
    assert_whole(frame.drop(columns="κ at init"), layout, narrow)
    assert max(map(cell_len, narrow)) <= 72 and "κ" not in "\n".join(narrow)
    wide = rendered(frame, layout, 120)
    assert_whole(frame, layout, wide)
    assert len(wide) == 2 + len(frame) and "1.37e+04" in wide[2]


def test_a_table_that_cannot_fit_is_printed_wider_never_with_a_word_cut(capsys: pytest.CaptureFixture) -> None:
    frame = pd.DataFrame({f"column {i}": [f"value-{i}-that-is-long"] for i in range(6)})
    terminal.print_table(Console(width=80, color_system=None), frame, {})
    text = capsys.readouterr().out
    assert "…" not in text and all(f"value-{i}-that-is-long" in text for i in range(6))


def test_status_and_recommend_read_the_same_at_80_and_120_columns(replicated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every word `status` and `recommend` print at 80 columns is a word they print on a wide terminal: none is
    broken, tables and prose included; at 80 nothing passes the edge."""
    for args in (["status", replicated, "--list-ties"], ["recommend", replicated, "--budget", "150k", "--list-ties"]):
        narrow, wide = shown_at(80, *args, monkeypatch=monkeypatch), shown_at(10_000, *args, monkeypatch=monkeypatch)
        assert_fits(narrow, 80)
        assert words(narrow) == words(wide), (narrow, wide)
    status = shown_at(120, "status", replicated, monkeypatch=monkeypatch)
    assert "layers / heads" in status and "6 / 8" in status and "layers=" not in status
    for raw in ("front_prob", "kappa_init_mean", " n "):  # headers are words
        assert raw not in status
    row = next(line for line in status.splitlines() if line.startswith("3 / 8 "))  # the front: 3 decimals, ± alike
    assert re.search(r" 0\.\d{3} +0\.\d{3} +[01]\.\d{2}", row), row
    ties = shown_at(120, "status", replicated, "--list-ties", monkeypatch=monkeypatch).splitlines()
    listed = [line for line in ties if re.fullmatch(r"  \d+ / \d+ with \d+ / \d+", line.rstrip())]  # one a line
    tied = explorer.load(replicated).stats()["tied_with"].notna().sum()
    assert tied > 1 and len(listed) == tied, ties


def test_run_params_and_export_read_the_same_at_80_and_120_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_study(tmp_path / "s", budget=QUICK, n_trials=2)
    monkeypatch.chdir(tmp_path)
    narrow = shown_at(80, "run", path, "--no-dashboard", monkeypatch=monkeypatch)  # trains; the second run reads only
    wide = shown_at(10_000, "run", path, "--no-dashboard", monkeypatch=monkeypatch)
    assert_fits(narrow, 80)
    assert words(narrow) == words(wide) and "2/2 configurations measured, 2 runs" in wide
    for args in (["params", ROOT / "spaces" / "crammed-bert.yaml"], ["params", "--family", "crammed-bert"],
                 ["export", path, "--out", "t.csv"]):  # relative: a long temp path (pytest-xdist's) is wrapped at 80
        narrow, wide = shown_at(80, *args, monkeypatch=monkeypatch), shown_at(120, *args, monkeypatch=monkeypatch)
        assert_fits(narrow, 80)
        assert words(narrow) == words(wide), (narrow, wide)
    counted = shown_at(120, "params", ROOT / "spaces" / "crammed-bert.yaml", monkeypatch=monkeypatch)
    assert "119,664,384" in counted and "84,265,728" in counted and "FLOPs" in counted and "flops" not in counted


def test_a_pipe_and_no_color_give_plain_text(monkeypatch: pytest.MonkeyPatch) -> None:
    frame = pd.DataFrame({"layers": ["1"], "params": ["2.8k"]})
    for plain in (False, True):
        monkeypatch.setenv("NO_COLOR", "1" if plain else "")
        buf = io.StringIO()
        terminal.print_table(terminal.console(file=buf, force_terminal=True, width=80), frame, {})
        assert ("\x1b[" in buf.getvalue()) is not plain  # bold headers on a terminal; none under NO_COLOR
    monkeypatch.delenv("NO_COLOR")
    piped = subprocess.run([sys.executable, "-m", "explorer.cli", "params", str(ROOT / "spaces" / "vit-digits.yaml")],
                           capture_output=True, text=True)
    assert piped.returncode == 0 and "\x1b[" not in piped.stdout and "parameters" not in piped.stdout
    assert max(map(cell_len, piped.stdout.splitlines())) <= 80  # a pipe is 80 columns


def test_the_dashboard_writes_splits_as_the_terminal_does(replicated: Path, tmp_path: Path) -> None:
    from explorer.dashboard import render_studies

    page = render_studies([replicated], tmp_path / "d.html").read_text()
    assert "highest mean 6 / 8" in page and "baseline 6 / 2" in page and "<td>3 / 8</td>" in page
