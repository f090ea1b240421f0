"""The HTML report of real SQLite studies: every figure present, user text escaped, replicates shown as
their statistics say, renders in Chromium."""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import optuna
import pytest
from test_pareto import HEADS, LAYERS, MLP, WIDTH, accuracy_of, dims_of, fill_study, key_of, make_study, params_of

from explorer.dashboard import FIGURES, NO_INTERVALS, default_output, render, render_studies
from explorer.formats import split
from explorer.frame import trials_frame
from explorer.stats import summarize
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


def fill_replicates(study: optuna.Study, noise: float = 0.01, seed: int = 0) -> optuna.Study:
    """Every (layers, heads) under 2, 3 or 4 seeds (the user attr `seed`), accuracy_of plus noise, one failure."""
    rng = np.random.default_rng(seed)
    study.set_user_attr("metric", "accuracy")
    study.set_user_attr("baseline", key_of(6, 2))
    dist = {"arch": optuna.distributions.CategoricalDistribution([key_of(d, h) for d in LAYERS for h in HEADS])}
    trials = []
    for i, (layers, heads) in enumerate(itertools.product(LAYERS, HEADS)):
        for s in range(2 + i % 3):
            acc = accuracy_of(layers, heads) + rng.normal(0, noise)
            attrs = {"config": dims_of(layers, heads), "layers": layers, "heads": heads, "width": WIDTH, "mlp": MLP,
                     "params": params_of(layers), "accuracy": acc, "seed": s, "device": "cpu", "train_time_s": 1.0}
            trials.append(optuna.trial.create_trial(
                params={"arch": key_of(layers, heads)}, distributions=dist, values=[acc, params_of(layers)],
                user_attrs=attrs, intermediate_values={0: acc - 0.1, 1: acc}))
    trials.append(optuna.trial.create_trial(
        params={"arch": key_of(2, 8)}, distributions=dist, state=optuna.trial.TrialState.FAIL,
        user_attrs={"fail_reason": "loss is NaN at step 3", "layers": 2, "heads": 8, "seed": 4}))
    study.add_trials(trials)
    return study


def make_replicate_study(path: Path, name: str = "replicates") -> optuna.Study:
    study = optuna.create_study(study_name=name, storage=f"sqlite:///{path}", directions=["maximize", "minimize"])
    return fill_replicates(study)


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    """The report of a study with 2 to 4 seeds per configuration, and its frame."""
    root = tmp_path_factory.mktemp("replicated")
    frame = trials_frame(make_replicate_study(root / "r.db"))
    meta = {"rep": {"baseline": key_of(6, 2), "objectives": OBJECTIVES, "metric": "accuracy", "space": "vit-digits"}}
    return render({"rep": frame}, root / "rep.html", meta), frame


def plotted(page: str) -> dict[str, tuple[list, dict]]:
    """Each figure's data and layout as the browser receives them: Plotly.newPlot's arguments."""
    decoder = json.JSONDecoder()
    out = {}
    for m in re.finditer(r'Plotly\.newPlot\(\s*"([^"]+)",\s*', page):
        data, end = decoder.raw_decode(page, m.end())
        layout, _ = decoder.raw_decode(page, end + re.match(r"\s*,\s*", page[end:]).end())
        out[m.group(1)] = (data, layout)
    return out


def values(v) -> np.ndarray:
    """A plotly array: a list, or plotly's base64 typed array."""
    if isinstance(v, dict) and "bdata" in v:
        out = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
        return out.reshape([int(n) for n in v["shape"].split(",")]) if "shape" in v else out
    return np.asarray(v, dtype=object)


def by_arch(traces: list[dict]) -> dict[str, dict]:
    """Per configuration point (trace `ids`): its y, error bar, colour, symbol and hover text."""
    out = {}
    for t in traces:
        if "ids" not in t:
            continue
        bars = t.get("error_y") or {}
        for i, arch in enumerate(t["ids"]):
            out[arch] = {
                "y": float(values(t["y"])[i]), "name": t["name"], "hover": t["hovertext"][i],
                "plus": float(values(bars["array"])[i]) if bars else None,
                "minus": float(values(bars["arrayminus"])[i]) if bars else None,
                "colour": values(t["marker"]["color"])[i] if not isinstance(t["marker"]["color"], str) else None,
                "symbol": t["marker"]["symbol"],
            }
    return out


def test_front_shows_each_configuration_with_its_interval_front_probability_and_replicates(replicated) -> None:
    report, frame = replicated
    page = report.read_text()
    summary = summarize(frame, "accuracy", [("accuracy", "maximize"), ("params", "minimize")])
    data, layout = plotted(page)["fig-front"]
    points = by_arch(data)
    assert set(points) == set(summary["arch"]) and len(points) == 24
    assert "P(on front)" in layout["title"]["text"] and layout["coloraxis"]["colorbar"]["title"]["text"] == "P(on front)"
    assert (summary["front_prob"] > 0.5).any() and (summary["front_prob"] < 0.5).any()
    ties = summary[summary["tied_with"].map(lambda t: isinstance(t, str))]
    assert len(ties) and not ties["on_front"].any()
    for row in summary.itertuples():
        point = points[row.arch]
        assert point["y"] == pytest.approx(row.mean, abs=1e-12)
        assert point["y"] - point["minus"] == pytest.approx(row.lo, abs=1e-12)
        assert point["y"] + point["plus"] == pytest.approx(row.hi, abs=1e-12)
        assert point["colour"] == pytest.approx(row.front_prob)
        assert f"P(on front) {row.front_prob:.2f}" in point["hover"] and f"{row.n} seeds" in point["hover"]
        trials = frame[(frame["arch"] == row.arch) & (frame["state"] == "COMPLETE")]
        assert len(trials) == row.n
        for t in trials.itertuples():  # every replicate's seed, value and trial
            assert f"seed {t.seed}: {t.accuracy:.4g} (trial {t.number})" in point["hover"]
        if isinstance(row.tied_with, str):
            assert point["symbol"].endswith("-open") and f"tied with {split(row.tied_with)}" in point["hover"]
            assert "tied with a front member" in point["name"]
        else:
            assert not point["symbol"].endswith("-open") and "tied with" not in point["hover"]
    replicates = [t for t in data if "replicates" in t["name"]]
    assert len(replicates) == 1
    done = frame[frame["state"] == "COMPLETE"]
    assert sorted(values(replicates[0]["y"]).astype(float)) == pytest.approx(sorted(done["accuracy"]))
    assert NO_INTERVALS not in page


def test_heatmap_and_tables_show_means_with_their_spread(replicated) -> None:
    report, frame = replicated
    page = report.read_text()
    summary = summarize(frame, "accuracy", [("accuracy", "maximize"), ("params", "minimize")])
    (heat,), layout = plotted(page)["fig-heatmap"]
    assert "±" in layout["title"]["text"]
    rows, cols = [int(y) for y in heat["y"]], [int(x) for x in heat["x"]]
    for row in summary.itertuples():
        r, c = rows.index(row.layers), cols.index(row.heads)
        assert values(heat["z"])[r][c] == pytest.approx(row.mean)
        assert heat["text"][r][c] == f"{row.mean:.3f} ± {(row.hi - row.lo) / 2:.3f}"
        assert f"n {row.n} seeds" in heat["hovertext"][r][c]
    table = re.search(r'<table id="config-table".*?</table>', page, re.S).group(0)
    assert table.count("<tr>") == 1 + len(summary) and "smooth surface" in page  # the note says what the means are
    answers = re.search(r'<table id="answer-table".*?</table>', page, re.S).group(0)  # budget -> pick and its bound
    assert answers.count("<tr>") >= 2 and "decided" in answers and page.index("answer-table") < page.index("fig-heatmap")
    assert re.search(r'<table id="trial-table".*?</table>', page, re.S).group(0).count("<tr>") == 1 + len(frame)


def test_a_one_seed_study_says_it_has_no_intervals(report: Path) -> None:
    page = report.read_text()
    data, layout = plotted(page)["fig-front"]
    assert NO_INTERVALS in layout["title"]["text"] and NO_INTERVALS in plotted(page)["fig-heatmap"][1]["title"]["text"]
    assert page.count(f"; {NO_INTERVALS}") == 2  # in each study's summary line
    assert NO_INTERVALS.capitalize() in page  # where the configuration table's intervals would be
    assert not any(t.get("error_y") for t in data) and not any("replicates" in t["name"] for t in data)
    assert "P(on front)" not in page


def test_report_holds_every_figure_and_one_plotlyjs(report: Path) -> None:
    page = report.read_text()
    for div in FIGURES:
        assert f'id="{div}"' in page
    for title in ("Pareto front", "Depth x heads", "conditioning", "Learning curves", "Hypervolume"):
        assert title in page
    trials = re.search(r'<table id="trial-table".*?</table>', page, re.S).group(0)
    configs = re.search(r'<table id="config-table".*?</table>', page, re.S).group(0)
    assert trials.count("<tr>") == 1 + 2 * 25 and configs.count("<tr>") == 1 + 2 * 24
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


ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("study, lands", [
    ("studies/x.yaml", "dashboards/x.html"),
    ("studies/hf/x.yaml", "dashboards/x.html"),  # the nearest `studies` above decides, not the YAML's own folder
    ("proj/studies/deep/er/x.yaml", "proj/dashboards/x.html"),
    ("elsewhere/x.yaml", "elsewhere/dashboards/x.html"),
])
def test_default_output_is_beside_the_nearest_studies_folder(tmp_path: Path, study: str, lands: str) -> None:
    assert default_output(tmp_path / study, ["x"]) == tmp_path / lands


def test_every_shipped_study_writes_to_the_one_dashboards_folder_and_no_html_is_shipped() -> None:
    studies = sorted((ROOT / "studies").rglob("*.yaml"))
    assert {default_output(path, ["n"]).parent for path in studies} == {ROOT / "dashboards"}
    try:
        tracked = subprocess.run(["git", "ls-files", "dashboards"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: which files are shipped is unknown")
    assert tracked and not [f for f in tracked if f.endswith(".html")], tracked


def test_render_studies_reads_the_yaml_and_its_storage(tmp_path: Path) -> None:
    space = Path(__file__).resolve().parents[1] / "spaces" / "vit-digits.yaml"
    spec = tmp_path / "tiny.yaml"
    spec.write_text(f"name: tiny\nspace: {space}\ntask: {{name: digits}}\nn_trials: 2\nbudget: {{seed: 3}}\n")
    ostudy = fill_study(load_study_spec(spec).open(create=True))  # storage: <dir>/<name>.db, as `explorer run` makes it
    page = render_studies([spec], tmp_path / "tiny.html").read_text()
    assert "tiny" in page and "baseline 6 / 2" in page and page.count("Plotly.newPlot(") == len(FIGURES)
    # its trials carry no seed: each trained with the study's first seed, 3, and is shown under it
    points = by_arch(plotted(page)["fig-front"][0])
    for trial in ostudy.get_trials(states=[optuna.trial.TrialState.COMPLETE]):
        hover = points[trial.params["arch"]]["hover"]
        assert f"seed 3: {trial.user_attrs['accuracy']:.4g} (trial {trial.number})" in hover
    table = re.search(r'<table id="config-table".*?</table>', page, re.S).group(0)
    assert table.count("<td>3: ") == len(points) and "<td>0: " not in table


@pytest.mark.browser
@pytest.mark.parametrize("which", ["report", "replicated"])
def test_report_renders_in_headless_chromium(which: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    report = request.getfixturevalue(which)
    report = report[0] if isinstance(report, tuple) else report
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    flags = [
        chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=10000",
    ]
    url = report.resolve().as_uri()
    # fontconfig and Chromium write caches and settings under $HOME whatever --user-data-dir says: keep them here
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    dom = subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True, timeout=120, env=env).stdout
    root = re.search(r"<html[^>]*>", dom)
    assert root, dom[:500]
    assert "data-errors" not in root.group(0), root.group(0)
    assert f'data-rendered="{len(FIGURES)}"' in root.group(0), root.group(0)
    assert dom.count('class="main-svg"') >= len(FIGURES)
    shot = tmp_path / "shot.png"
    subprocess.run(
        [*flags, f"--screenshot={shot}", "--window-size=1400,3000", url], capture_output=True, timeout=120, env=env
    )
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
