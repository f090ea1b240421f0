"""recommend past the measured range (one posterior, issue 33) and at a longer budget (--verify --epochs)."""

from __future__ import annotations

import re
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
def test_a_budget_past_the_measured_range_gets_one_answer_and_past_its_reach_a_refusal(tmp_path: Path) -> None:
    """Past the space the one posterior answers (one "use" line); past SIZE_REACH it says how far and what to measure,
    and its bound still counts the splits past the space within the reach (it once bounded the space alone there)."""
    space = {**TINY_SPACE, "free": {"layers": {"min": 1, "max": 3}, "heads": "divisors"}}
    path = write_study(tmp_path, space_doc=space, budget={**ONE_EPOCH, "seeds": 2}, n_trials=9)  # 2 seeds: a bound
    assert cli("run", path, "--no-dashboard").returncode == 0
    sizes = yaml.safe_load(cli("params", tmp_path / "space.yaml", "--format", "json").stdout)
    largest = max(r["params"] for r in sizes)
    near = cli("recommend", path, "--budget", str(int(1.3 * largest)))
    assert near.returncode == 0, near.stderr
    assert len(re.findall(r"(?m)^budget .*: use ", near.stdout)) == 1 and "validated to" not in near.stdout, near.stdout
    far = cli("recommend", path, "--budget", str(3 * largest))
    assert far.returncode == 0 and len(re.findall(r"(?m)^budget .*: use ", far.stdout)) == 1, far.stdout
    assert "3.0x the largest measured configuration" in far.stdout and "validated to 2x" in far.stdout, far.stdout
    at_reach = cli("recommend", path, "--budget", str(2 * largest))
    found = [re.search(r"within ([\d.]+) points?", out.stdout) for out in (at_reach, far)]
    assert all(found), (at_reach.stdout, far.stdout)
    bound = [float(f.group(1)) for f in found]
    assert bound[1] >= bound[0], (at_reach.stdout, far.stdout)  # past the reach no surer than at it: the same splits fit


def test_verify_at_a_longer_budget_trains_the_pick_and_its_rivals_in_a_study_of_their_own(tmp_path: Path) -> None:
    path = write_study(tmp_path, budget=ONE_EPOCH, n_trials=3, sampler={"name": "grid", "seed": 0})
    assert cli("run", path, "--no-dashboard").returncode == 0
    assert cli("recommend", path, "--budget", "4k", "--epochs", "2").returncode == 1  # a one-length study answers at no other length
    out = cli("recommend", path, "--budget", "4k", "--verify", "--epochs", "2")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "at 2 epochs (tiny-2ep, 3 seeds): the order" in out.stdout
    longer = optuna.load_study(study_name="tiny-2ep", storage=f"sqlite:///{tmp_path / 'tiny.db'}")
    complete = longer.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert complete and all(len(t.user_attrs["curve"]) == 2 for t in complete)
    assert {t.user_attrs["seed"] for t in complete} == {0, 1, 2}
    short = optuna.load_study(study_name="tiny", storage=f"sqlite:///{tmp_path / 'tiny.db'}")
    assert all(len(t.user_attrs["curve"]) == 1 for t in short.get_trials(states=(optuna.trial.TrialState.COMPLETE,)))
