"""recommend past the measured range (the shape law, issue 22) and at a longer budget (--verify --epochs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from conftest import TINY_SPACE, write_study

ONE_EPOCH = {"epochs": 1, "batch_size": 128, "lr": 0.003, "seed": 0}


def cli(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "explorer.cli", *map(str, args)], capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_a_budget_past_the_measured_range_gets_the_shape_law_and_past_its_reach_a_refusal(tmp_path: Path) -> None:
    space = {**TINY_SPACE, "free": {"layers": {"min": 1, "max": 3}, "heads": "divisors"}}
    path = write_study(tmp_path, space_doc=space, budget=ONE_EPOCH, n_trials=9)
    assert cli("run", path, "--no-dashboard").returncode == 0
    space["free"]["layers"]["max"] = 5  # the user now asks about deeper models than any measured
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    sizes = yaml.safe_load(cli("params", tmp_path / "space.yaml", "--format", "json").stdout)
    largest_measured = max(r["params"] for r in sizes if r["layers"] <= 3)
    four = max(r["params"] for r in sizes if r["layers"] == 4)
    near = cli("recommend", path, "--budget", str(four))
    assert near.returncode == 0, near.stderr
    assert f"{four / largest_measured:.1f}x the largest measured configuration" in near.stdout, near.stdout
    assert "predicted best" in near.stdout and "bootstrap prediction interval" in near.stdout
    far = cli("recommend", path, "--budget", str(3 * largest_measured))
    assert far.returncode == 0 and "the shape law is validated to 2x" in far.stdout, far.stdout


def test_verify_at_a_longer_budget_trains_the_pick_and_its_rivals_in_a_study_of_their_own(tmp_path: Path) -> None:
    path = write_study(tmp_path, budget=ONE_EPOCH, n_trials=3, sampler={"name": "grid", "seed": 0})
    assert cli("run", path, "--no-dashboard").returncode == 0
    assert cli("recommend", path, "--budget", "4k", "--epochs", "2").returncode == 1  # --epochs goes with --verify
    out = cli("recommend", path, "--budget", "4k", "--verify", "--epochs", "2")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "at 2 epochs (tiny-2ep, 3 seeds): the order" in out.stdout
    longer = optuna.load_study(study_name="tiny-2ep", storage=f"sqlite:///{tmp_path / 'tiny.db'}")
    complete = longer.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert complete and all(len(t.user_attrs["curve"]) == 2 for t in complete)
    assert {t.user_attrs["seed"] for t in complete} == {0, 1, 2}
    short = optuna.load_study(study_name="tiny", storage=f"sqlite:///{tmp_path / 'tiny.db'}")
    assert all(len(t.user_attrs["curve"]) == 1 for t in short.get_trials(states=(optuna.trial.TrialState.COMPLETE,)))
