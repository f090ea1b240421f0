"""The Python API: the docs' example as written (docs/getting-started.md), and each call against the CLI's view of a study."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import explorer
from explorer.errors import ExplorerError
from explorer.train import Budget

ROOT = Path(__file__).resolve().parents[1]


def docs_block(page: str, heading: str, language: str) -> str:
    """The first fenced `language` block under `## heading` of the docs' `page`."""
    text = (ROOT / "docs" / page).read_text()
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(rf"```{language}\n(.*?)```", section, re.S)
    assert match, f"no {language} block under {heading!r}"
    return match.group(1)


def test_docs_python_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    exec(compile(docs_block("getting-started.md", "From Python", "python"), "docs/getting-started.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "use 1 / " in printed and "(1 seed;" in printed  # measured, at one seed
    assert (tmp_path / "runs/digits-tiny.yaml").exists() and (tmp_path / "runs/digits-tiny.space.yaml").exists()
    assert (tmp_path / "runs/digits-tiny.html").stat().st_size > 100_000
    again = explorer.load(tmp_path / "runs/digits-tiny.yaml")  # the YAML create wrote is the same study
    trials = again.trials()
    assert len(trials) == 4 and set(trials["state"]) == {"COMPLETE"}
    stats = again.stats()
    assert len(stats) == 4 and (stats["n"] == 1).all() and stats["std"].isna().all() and stats["lo"].isna().all()
    assert {"front_prob", "on_front", "kappa_init_mean", "flops"} <= set(stats)
    assert stats["mean"].is_monotonic_decreasing  # accuracy: best first
    front = again.front()
    assert 1 <= len(front) <= 4 and front["params"].is_monotonic_increasing
    best = trials.loc[trials["params"] <= 4000, "accuracy"].max()
    assert again.recommend(4000).value == best


def test_create_from_models_and_a_space_path_then_run_twice(tmp_path: Path) -> None:
    exp = explorer.create(tmp_path / "a", "vit", space=ROOT / "spaces/vit-digits.yaml", task={"name": "digits"},
                          budget=Budget(epochs=1, max_steps=2, batch_size=64), sampler={"name": "random", "seed": 1},
                          n_trials=2)
    assert isinstance(exp.run(), explorer.Experiment)
    assert len(exp.trials()) == 2
    exp.study.spec.n_trials = 3
    exp.run()  # continues the stored study: one more trial, none repeated
    trials = exp.trials()
    assert len(trials) == 3 and trials["arch"].is_unique  # three distinct measurements (duplicates are not rows)


def test_reading_a_study_never_run_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    exp = explorer.create(tmp_path, "never", space=ROOT / "spaces/vit-digits.yaml", task={"name": "digits"}, n_trials=1)
    with pytest.raises(ExplorerError, match="no study 'never' yet"):
        exp.trials()
    assert not (tmp_path / "never.db").exists()


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"n_trials": 0}, "never.yaml: n_trials: Input should be greater than or equal to 1"),
        ({"n_trials": 1, "budget": {"epochs": "many"}}, "never.yaml: budget.epochs"),
        ({"n_trials": 1, "space": {"name": "s", "family": "image-encoder", "free": {}}}, "space: free"),
    ],
)
def test_bad_python_objects_are_one_line_errors_and_write_nothing(tmp_path: Path, kwargs: dict, words: str) -> None:
    args = {"space": ROOT / "spaces/vit-digits.yaml", "task": {"name": "digits"}, **kwargs}
    with pytest.raises(ExplorerError, match=re.escape(words)):
        explorer.create(tmp_path / "out", "never", **args)
    assert not (tmp_path / "out").exists()


def test_run_rejects_an_unknown_executor(tmp_path: Path) -> None:
    exp = explorer.create(tmp_path, "x", space=ROOT / "spaces/vit-digits.yaml", task={"name": "digits"}, n_trials=1)
    with pytest.raises(ExplorerError, match="executor.name"):
        exp.run(executor="rya")


@pytest.mark.slow  # a fresh interpreter imports torch again
def test_python_dash_m_explorer_is_the_command() -> None:
    result = subprocess.run([sys.executable, "-m", "explorer", "params", "--family", "crammed-bert", "--layers", "10",
                             "--heads", "24", "-f", "csv"], capture_output=True, text=True, cwd=ROOT,
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert pd.read_csv(io.StringIO(result.stdout))["params"].tolist() == [84_265_728]


def test_a_study_whose_trials_all_failed_has_an_empty_front_and_no_stats(tmp_path: Path) -> None:
    exp = explorer.create(tmp_path, "nan", space=ROOT / "spaces/vit-digits.yaml", task={"name": "digits"},
                          budget={"epochs": 1, "max_steps": 2, "lr": 1e6}, sampler={"name": "random"}, n_trials=1)
    exp.run()
    assert exp.trials()["state"].tolist() == ["FAIL"]
    assert exp.front().empty and exp.stats().empty
