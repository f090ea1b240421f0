"""The HTML report of real SQLite studies: every figure present, user text escaped, renders in Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from test_pareto import fill_study, key_of, make_study

from explorer.dashboard import FIGURES, render, render_studies
from explorer.frame import trials_frame
from explorer.study import load_study_spec

EVIL = "<script>alert(1)</script>"
OBJECTIVES = [{"name": "accuracy", "direction": "maximize"}, {"name": "params", "direction": "minimize"}]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two studies on one front; the second's name and failure message try to inject a script."""
    root = tmp_path_factory.mktemp("report")
    frames = {
        "vit-digits": trials_frame(make_study(root / "a.db", name="vit-digits")),
        EVIL: trials_frame(make_study(root / "b.db", name=EVIL, fail_reason=EVIL, seed=1)),
    }
    meta = {
        name: {"baseline": key_of(6, 2), "objectives": OBJECTIVES, "metric": "accuracy", "space": "vit-digits"}
        for name in frames
    }
    return render(frames, root / "out" / "report.html", meta)


def test_report_holds_every_figure_and_one_plotlyjs(report: Path) -> None:
    page = report.read_text()
    for div in FIGURES:
        assert f'id="{div}"' in page
    for title in ("Pareto front", "Depth x heads", "conditioning", "Learning curves", "Hypervolume"):
        assert title in page
    assert 'id="trial-table"' in page and page.count("<tr>") == 1 + 2 * 25
    assert "<script src" not in page and "<link" not in page  # nothing fetched: opens offline
    assert page.count("plotly.js v") == 1  # the library's banner: inlined exactly once
    assert page.count("Plotly.newPlot(") == len(FIGURES)


def test_user_text_is_escaped(report: Path) -> None:
    page = report.read_text()
    assert EVIL not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # shown as text in the table and summary


def test_render_without_completed_trials(tmp_path: Path) -> None:
    study = make_study(tmp_path / "s.db")
    frame = trials_frame(study)
    frame = frame[frame["state"] == "FAIL"]
    out = render({"empty": frame}, tmp_path / "r.html", {"empty": {"metric": "accuracy"}})
    assert "loss is NaN at step 3" in out.read_text()


def test_render_a_lower_is_better_metric(tmp_path: Path) -> None:
    frame = trials_frame(make_study(tmp_path / "lm.db", name="lm"))
    frame = frame.assign(eval_loss=3 - frame.pop("accuracy"))  # a language model's loss: lower is better
    meta = {"lm": {"metric": "eval_loss", "objectives": ["minimize eval_loss", "minimize params"]}}
    page = render({"lm": frame}, tmp_path / "lm.html", meta).read_text()
    front = frame[frame["state"] == "COMPLETE"].sort_values("eval_loss").iloc[0]  # best loss: always on the front
    row = re.search(rf"<tr><td>lm</td><td>{front['number']}</td>.*?</tr>", page).group(0)
    assert "<td>yes</td>" in row and page.count("Plotly.newPlot(") == len(FIGURES)


def test_render_studies_reads_the_yaml_and_its_storage(tmp_path: Path) -> None:
    space = Path(__file__).resolve().parents[1] / "spaces" / "vit-digits.yaml"
    spec = tmp_path / "tiny.yaml"
    spec.write_text(f"name: tiny\nspace: {space}\ntask: {{name: digits}}\nn_trials: 2\n")
    fill_study(load_study_spec(spec).open(create=True))  # storage: <dir>/<name>.db, made as `explorer run` does
    page = render_studies([spec], tmp_path / "tiny.html").read_text()
    assert "tiny" in page and "baseline layers=6,heads=2" in page and page.count("Plotly.newPlot(") == len(FIGURES)


@pytest.mark.browser
def test_report_renders_in_headless_chromium(report: Path, tmp_path: Path) -> None:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    flags = [
        chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=10000",
    ]
    url = report.resolve().as_uri()
    dom = subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    root = re.search(r"<html[^>]*>", dom)
    assert root, dom[:500]
    assert "data-errors" not in root.group(0), root.group(0)
    assert f'data-rendered="{len(FIGURES)}"' in root.group(0), root.group(0)
    assert dom.count('class="main-svg"') >= len(FIGURES)
    shot = tmp_path / "shot.png"
    subprocess.run(
        [*flags, f"--screenshot={shot}", "--window-size=1400,3000", url], capture_output=True, timeout=120
    )
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
