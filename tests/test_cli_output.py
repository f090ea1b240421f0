"""What a new user reads (issue 43, items 1-5, 11 and 13's words): the answer first and short, the model behind
`--explain`; every count naming its length; progress in a pipe; tables and prose within 80 columns when piped;
an export whose rows are the runs, whose counts are integers and whose configurations carry their length.

Commands run through the entry point in this process as in a pipe (stdout captured, `COLUMNS=80`); the
studies are stored, not trained: a replicated one on the default space, and a ladder (1 and 2 epochs) whose
one-layer configurations have only 1-epoch runs."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import pytest
import yaml
from conftest import write_study
from rich.cells import cell_len
from rich.console import Console
from test_cli_mistakes import main

import explorer
from explorer import reports
from explorer.decisions import Answer
from explorer.posterior import Regret
from explorer.recommend import Recommendation

ROOT = Path(__file__).resolve().parents[1]
QUICK = {"epochs": 1, "max_steps": 2, "batch_size": 64, "lr": 0.003, "seed": 0}
TINY = {"width": 16, "mlp": 32, "img_size": 8, "patch": 4, "in_chans": 1, "num_classes": 10}


def piped(*args: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    """`explorer ARGS` as in a pipe at 80 columns: (exit code, stdout, stderr)."""
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("NO_COLOR", "1")
    return main(*args, monkeypatch=monkeypatch, capsys=capsys)


def widest(text: str) -> int:
    return max(map(cell_len, text.splitlines()), default=0)


def logical(text: str) -> list[str]:
    """The lines a command said, each wrapped continuation (indented two more columns) joined back."""
    out: list[str] = []
    for line in text.splitlines():
        if out and line.startswith("  ") and not out[-1].startswith("  "):
            out[-1] += " " + line.strip()
        else:
            out.append(line)
    return out


@pytest.fixture(scope="module")
def ladder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A grid study of 1 to 3 layers x 1 or 2 heads on a ladder of 1 and 2 epochs, 3 seeds each, stored as the
    decide policy leaves it with the one-layer splits measured at 1 epoch only; n_trials 3 of a grid of 6 leaves
    queued trials that never start."""
    from explorer.study import load_study_spec

    folder = tmp_path_factory.mktemp("ladder")
    (folder / "space.yaml").write_text(yaml.safe_dump({"name": "ladder", "family": "image-encoder", "fixed": TINY,
                                                       "free": {"layers": [1, 2, 3], "heads": [1, 2]},
                                                       "baseline": {"layers": 3, "heads": 1}}))
    (folder / "study.yaml").write_text(yaml.safe_dump({
        "name": "ladder", "space": "space.yaml", "task": {"name": "digits"}, "budget": {"epochs": [1, 2], "seeds": 3},
        "replicates": {"policy": "decide"}, "sampler": {"name": "grid"}, "n_trials": 3}))
    study = load_study_spec(folder / "study.yaml")
    ostudy = study.open(create=True)  # records the identity and queues the grid
    rng, trials = np.random.default_rng(0), []
    dist = {"arch": optuna.distributions.CategoricalDistribution(list(study.configs))}
    for c in study.configs.values():
        level = 0.6 + 0.02 * c.dims["layers"] + 0.01 * c.dims["heads"]
        for seed in range(3):
            for epochs in (1,) if c.dims["layers"] == 1 else (1, 2):
                rungs = {str(e): level + 0.1 * (e - 1) + rng.normal(0, 0.01) for e in range(1, epochs + 1)}
                attrs = {"config": c.dims, "layers": c.dims["layers"], "heads": c.dims["heads"], "width": 16, "mlp": 32,
                         "params": c.params, "accuracy": rungs[str(epochs)], "seed": seed, "epochs": epochs, "rungs": rungs,
                         "device": "cpu", "execution": "cpu float32", "train_time_s": float(epochs),
                         "identity": study.identity_key}
                trials.append(optuna.trial.create_trial(params={"arch": c.key}, distributions=dist, user_attrs=attrs,
                                                        values=[rungs[str(epochs)], c.params]))
    ostudy.add_trials(trials)
    return folder / "study.yaml"


# -- 1. the answer, readable ------------------------------------------------------------------------------------
def test_recommend_says_a_decided_answer_in_six_lines_and_the_model_with_explain(
        replicated: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    code, out, _ = piped("recommend", replicated, "--budget", "100k", monkeypatch=monkeypatch, capsys=capsys)
    said = logical(out)
    assert code == 0 and said[0].startswith("budget 100.0k: use 3 / 8: within ") and said[0].endswith("; decided"), out
    assert len(out.splitlines()) <= 6 and widest(out) <= 80, out
    assert "model:" not in out and "noise" not in out and said[-1].startswith("--explain says more: the model"), out
    for flag in ("--explain", "-v"):
        code, explained, _ = piped("recommend", replicated, "--budget", "100k", flag, monkeypatch=monkeypatch, capsys=capsys)
        lines = logical(explained)
        assert code == 0 and lines[:2] == said[:2] and widest(explained) <= 80, explained
        assert any(line.startswith("model: ") and "noise" in line for line in lines), explained
        assert any(line.startswith("to check it, measure its neighbours") for line in lines) and "--explain says" not in explained


def test_the_dashboard_shows_the_posteriors_model(replicated: Path, tmp_path: Path) -> None:
    from explorer.api import dashboard

    page = dashboard([replicated], tmp_path / "d.html").read_text()
    model = page.split("<p>The model of rep: ", 1)[1].split("</p>", 1)[0]
    assert "smooth surface over the free dimensions" in model and "run noise" in model, model


# -- 2. every count names its length ------------------------------------------------------------------------------
def test_status_names_the_length_of_every_count(ladder: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture) -> None:
    code, out, _ = piped("status", ladder, monkeypatch=monkeypatch, capsys=capsys)
    said = logical(out)
    assert code == 0 and widest(out) <= 80, out
    assert "ladder: 6/3 configurations measured" not in out  # the grid's queued trials are no measurements
    counts = next(line for line in said if line.startswith("ladder: "))
    assert "30 runs (18 at 1 epoch, 12 at 2 epochs)" in counts, counts
    replicates = next(line for line in said if line.startswith("replicates (decide)"))
    assert "18 at 1 epoch (100%), 12 at 2 epochs (67%)" in replicates, replicates
    front = out.split("Pareto front of posterior means at 2 epochs", 1)[1]
    assert "runs at 1 / 2 epochs" in " ".join(front.split()) and "seeds" not in front.split("\n─")[0], front
    row = next(line for line in front.splitlines() if line.startswith("1 / "))  # one layer: 1-epoch runs only
    assert " 3 / 0 " in row, front


def test_more_configurations_than_n_trials_says_why(ladder: Path) -> None:
    st = explorer.load(ladder).status()
    line = reports.counts(replace(st, n_trials=4))[0]
    assert line.startswith("ladder: 6 configurations measured (n_trials 4, and 2 more measured on purpose)"), line
    assert "6/4" not in line


# -- 3. progress where no terminal shows a bar ------------------------------------------------------------------
def test_run_in_a_pipe_says_each_run_as_it_ends(tmp_path: Path) -> None:
    path = write_study(tmp_path, budget=QUICK, n_trials=2)
    proc = subprocess.run([sys.executable, "-m", "explorer.cli", "run", str(path), "--no-dashboard"], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert "0 of 2 runs planned so far done; a line as each ends" in lines, proc.stderr
    ends = [line for line in lines if " runs: trial " in line]
    assert [line.split(":")[0] for line in ends] == ["1/2 runs", "2/2 runs"], proc.stderr
    assert all("seed 0, 1 epoch): accuracy 0." in line for line in ends), proc.stderr
    assert widest(proc.stdout + proc.stderr) <= 80 or all(" " not in line.strip() for line in lines if cell_len(line) > 80)


def test_condition_shows_progress_on_a_terminal_and_in_a_pipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture) -> None:
    from explorer import cli_app, cli_count

    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"name": "s", "family": "image-encoder", "fixed": TINY,
                                     "free": {"layers": [1], "heads": [1, 2, 4]}}))
    monkeypatch.setattr(cli_count.Measuring, "EVERY_S", 0.0)  # a line per configuration in a pipe
    code, out, err = piped("condition", space, "--seeds", "1", monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0 and [line for line in err.splitlines() if "configurations measured" in line] == [
        "κ at initialisation, 1 seed each: 1 of 3 configurations measured",
        "κ at initialisation, 1 seed each: 2 of 3 configurations measured"], err
    buf = io.StringIO()
    monkeypatch.setattr(cli_app, "err", Console(file=buf, force_terminal=True, width=80, color_system=None))
    code, out, _ = piped("condition", space, "--seeds", "1", monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0 and "κ at initialisation, 1 seed each" in buf.getvalue() and "3/3" in buf.getvalue(), buf.getvalue()


# -- 4 and 5. tables and prose within 80 columns in a pipe ----------------------------------------------------------
def test_condition_of_both_regimes_fits_80_columns_a_table_each(monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"  # the default space's widths and parameter counts, its deepest and shallowest splits
    doc = yaml.safe_load((ROOT / "spaces" / "vit-digits.yaml").read_text())
    space.write_text(yaml.safe_dump({**doc, "free": {"layers": [1, 6], "heads": "divisors"}, "baseline": None}))
    code, out, _ = piped("condition", space, "--regime", "both", "--seeds", "1", monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0 and widest(out) <= 80, out
    titles = [line for line in out.splitlines() if line.startswith("κ at initialisation")]
    assert [t.split(" on ")[0] for t in titles] == ["κ at initialisation, fixed width", "κ at initialisation, fixed head dim"]
    assert "regime" not in out and "203,082" in out  # the regime in each title, not in a column of the table
    rows = json.loads(piped("condition", space, "--regime", "both", "--seeds", "1", "-f", "json", monkeypatch=monkeypatch,
                            capsys=capsys)[1])
    assert {r["regime"] for r in rows} == {"fixed-width", "fixed-head-dim"}  # for other programs the column stays


def test_params_of_one_configuration_fits_80_columns_and_names_its_given_dimensions(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from explorer import cli_app

    args = ["params", "--family", "image-encoder", "--layers", "12", "--heads", "12", "--width", "768", "--mlp", "3072",
            "--dim", "img_size=224", "--dim", "patch=16", "--dim", "in_chans=3", "--dim", "num_classes=1000"]
    monkeypatch.setattr(cli_app, "out", Console(file=io.StringIO(), force_terminal=True, width=80, color_system=None))
    code, _, _ = piped(*args, monkeypatch=monkeypatch, capsys=capsys)
    shown = cli_app.out.file.getvalue()
    assert code == 0 and widest(shown) <= 80, shown
    assert "given: img_size 224, patch 16, in_chans 3, num_classes 1000" in " ".join(shown.split()), shown
    rows = json.loads(piped(*args, "-f", "json", monkeypatch=monkeypatch, capsys=capsys)[1])
    assert rows[0]["img_size"] == 224 and rows[0]["patch"] == 16  # csv and json keep every dimension as a column


def test_prose_is_wrapped_at_80_columns_in_a_pipe_and_errors_stay_one_line(
        replicated: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    for args in (["status", replicated], ["recommend", replicated, "--budget", "150k", "--explain", "--list-ties"]):
        code, out, err = piped(*args, monkeypatch=monkeypatch, capsys=capsys)
        assert code == 0 and widest(out) <= 80 and widest(err) <= 80, out
        assert len(out.splitlines()) > len(logical(out))  # some lines were wrapped, none cut: words are whole
    title = logical(piped("status", replicated, monkeypatch=monkeypatch, capsys=capsys)[1])[0]
    assert title.startswith("Answers at the study's budgets: use X") and title.endswith("± half the 95% interval")
    code, out, err = piped("recommend", replicated, "--budget", "5", monkeypatch=monkeypatch, capsys=capsys)
    assert code == 1 and len(err.splitlines()) == 1 and cell_len(err) > 80  # an error is one line, for grep and logs


# -- 11. export ---------------------------------------------------------------------------------------------------
def test_export_writes_the_runs_with_integer_counts_and_each_configuration_at_each_length(
        ladder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    code, out, _ = piped("export", ladder, "--out", tmp_path / "t.csv", monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, out
    said = " ".join(out.split())
    assert f"30 trials (6 queued, never started, left out) -> {tmp_path / 't.csv'}" in said, out
    assert f"6 configurations at 1 and 2 epochs (12 rows) -> {tmp_path / 't.configs.csv'}" in said, out
    trials = pd.read_csv(tmp_path / "t.csv")
    assert len(trials) == 30 and "WAITING" not in set(trials["state"])
    for col in ("epochs", "seed"):
        assert trials[col].dtype == "int64", col
    configs = pd.read_csv(tmp_path / "t.configs.csv")
    assert list(configs.columns[:8]) == ["arch", "layers", "heads", "width", "mlp", "params", "epochs", "n"]
    one = configs[configs["layers"] == 1].set_index(["heads", "epochs"])
    assert one.loc[(1, 1), "n"] == 3 and len(json.loads(one.loc[(1, 1), "values"])) == 3  # the 1-epoch runs, at 1 epoch
    assert one.loc[(1, 2), "n"] == 0 and json.loads(one.loc[(1, 2), "values"]) == []  # none at 2, and it says so
    piped("export", ladder, "--out", tmp_path / "t.parquet", monkeypatch=monkeypatch, capsys=capsys)
    table = pd.read_parquet(tmp_path / "t.parquet")
    assert str(table["epochs"].dtype) == "Int64" and str(table["seed"].dtype) == "Int64"


# -- 13. words --------------------------------------------------------------------------------------------------
def test_one_epoch_is_singular_and_a_cheap_rung_is_not_free(ladder: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture) -> None:
    from explorer.learning import StillLearning

    code, out, _ = piped("recommend", ladder, "--budget", "6k", "--epochs", "1", "--explain", monkeypatch=monkeypatch,
                         capsys=capsys)
    said = " ".join(out.split())
    assert code == 0 and said.startswith("budget 6.0k at 1 epoch: use ") and "1 epochs" not in said, out
    words = StillLearning(0.05, 0.03, 0.07, 12, "1 epoch", "2 epochs", 4, 0.2).words()
    assert "costs under a second a run here" in words and "0 s" not in words
    assert "costs about 3 s a run" in StillLearning(0.05, 0.03, 0.07, 12, "1 epoch", "2 epochs", 4, 3.0).words()


def test_an_answer_off_the_ladder_blames_the_length_not_the_cap() -> None:
    """Item 10: `--epochs 15` on a 10/20 ladder said `its cap: 4 seeds` as why no run narrows it."""
    said = Answer(100_000, Regret("layers=2,heads=8", 0.02, 0.01, ("layers=2,heads=8",)), 0.01, 0.95, cap=4, measured=False)
    rec = Recommendation(budget=100_000, key="layers=2,heads=8", dims={"layers": 2, "heads": 8}, params=69_194,
                         metric="accuracy", value=0.94, lo=0.93, hi=0.95, kind="predicted", answer=said, epochs=15,
                         shorter=((10, 4), (20, 4)), ladder=(10, 20))
    text = "\n".join(rec.lines())
    assert "its cap" in said.seeds_words() and "its cap" not in text, text
    assert "15 epochs is not a length the study trains (10, 20 epochs): `explorer recommend ... --verify --epochs 15`" in text
    assert text.count("--verify --epochs 15") == 1, text
