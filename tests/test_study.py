"""Studies end to end on a temp SQLite file: run, resume after SIGKILL, determinism, bad input."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from conftest import TINY_SPACE, write_study

from explorer.errors import ExplorerError
from explorer.executors.local import LocalExecutor
from explorer.frame import trials_frame
from explorer.study import load_study_spec

COMPLETE = optuna.trial.TrialState.COMPLETE


def run(path: Path, **open_kwargs) -> optuna.Study:
    study = load_study_spec(path)
    ostudy = study.open(**open_kwargs)
    LocalExecutor().run(study, ostudy)
    return ostudy


def outcomes(ostudy: optuna.Study) -> list[tuple[str, tuple[float, ...]]]:
    return [(t.params["arch"], tuple(t.values)) for t in ostudy.get_trials(states=(COMPLETE,))]


def test_tiny_study_runs_to_completion_and_stores_everything(tiny_study: Path) -> None:
    ostudy = run(tiny_study)
    trials = ostudy.get_trials(states=(COMPLETE,))
    assert len(trials) == 6
    assert {t.params["arch"] for t in trials} == {f"layers={l},heads={h}" for l in (1, 2) for h in (1, 2, 4)}
    for t in trials:
        a = t.user_attrs
        assert 0.0 <= a["accuracy"] <= 1.0 and t.values == [a["accuracy"], a["params"]]
        assert a["params"] == load_study_spec(tiny_study).configs[t.params["arch"]].params
        assert len(a["kappa_init"]) == a["layers"] and all(k >= 1 for k in a["kappa_init"] + a["kappa_final"])
        assert len(a["curve"]) == 2 and a["flops"] > 0 and a["train_time_s"] > 0 and a["device"] == "cpu"
    frame = trials_frame(ostudy)
    assert list(frame["curve"].map(len)) == [2] * 6
    assert not (tiny_study.parent / "tiny.ckpt").exists() or not any((tiny_study.parent / "tiny.ckpt").iterdir())


def test_same_seed_same_trials_and_metrics(tmp_path: Path) -> None:
    a = run(write_study(tmp_path / "a", sampler={"name": "nsga2", "seed": 3, "population_size": 2}, n_trials=3))
    b = run(write_study(tmp_path / "b", sampler={"name": "nsga2", "seed": 3, "population_size": 2}, n_trials=3))
    assert outcomes(a) == outcomes(b) and len(outcomes(a)) == 3


def test_rerun_of_a_finished_study_does_nothing(tiny_study: Path) -> None:
    first = outcomes(run(tiny_study, n_trials=None) if False else run(tiny_study))
    again = run(tiny_study)
    assert outcomes(again) == first and len(again.trials) == 6


def test_resampled_configuration_is_not_trained_twice(tmp_path: Path) -> None:
    ostudy = run(write_study(tmp_path, sampler={"name": "random", "seed": 0}, n_trials=12))
    trials = ostudy.get_trials(states=(COMPLETE,))
    trained = [t for t in trials if "duplicate_of" not in t.user_attrs]
    assert len(trials) == 12 and len({t.params["arch"] for t in trained}) == len(trained)
    for t in trials:
        if "duplicate_of" in t.user_attrs:
            assert t.values == ostudy.trials[t.user_attrs["duplicate_of"]].values


@pytest.mark.slow
def test_sigkill_mid_trial_then_resume_loses_nothing(tmp_path: Path) -> None:
    path = write_study(tmp_path, budget={"epochs": 6, "batch_size": 32, "lr": 0.003, "seed": 0})
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "explorer.cli", "run", str(path), "--no-dashboard"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    storage = f"sqlite:///{tmp_path / 'tiny.db'}"
    before: dict[int, tuple] = {}
    running = None
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None:
            time.sleep(0.2)
            try:
                trials = optuna.load_study(study_name="tiny", storage=storage).trials
            except Exception:  # the study may not exist yet
                continue
            done = [t for t in trials if t.state == COMPLETE]
            # after its first or second epoch (so its checkpoint exists), with 4 epochs left: the kill lands mid-trial
            live = [t for t in trials if t.state == optuna.trial.TrialState.RUNNING and 1 <= len(t.user_attrs.get("curve", [])) <= 2]
            if done and live:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                before = {t.number: (t.params["arch"], tuple(t.values), t.user_attrs["accuracy"]) for t in done}
                running = live[0]
                break
    finally:
        if proc.poll() is None:
            proc.kill()
    assert running is not None, "the run finished before it could be killed"
    time.sleep(3.5)  # past the heartbeat grace period (3 x heartbeat_s): the trial is stale
    ostudy = run(path, create=False)

    trials = ostudy.trials
    for number, (arch, values, acc) in before.items():  # finished before the kill: unchanged
        assert (trials[number].params["arch"], tuple(trials[number].values), trials[number].user_attrs["accuracy"]) == (arch, values, acc)
    assert trials[running.number].state == optuna.trial.TrialState.FAIL  # marked failed ...
    done = [t for t in trials if t.state == COMPLETE]
    retried = [t for t in done if t.system_attrs.get("failed_trial") == running.number]
    assert retried and retried[0].params["arch"] == running.params["arch"]  # ... and its config re-run
    archs = [t.params["arch"] for t in done]
    assert len(archs) == len(set(archs)) == 6  # nothing ran twice to completion; n_trials reached


def test_nan_trial_fails_with_reason_and_the_study_goes_on(tmp_path: Path) -> None:
    path = write_study(tmp_path, budget={"epochs": 1, "batch_size": 128, "lr": 1e12, "seed": 0, "grad_clip": None}, n_trials=2)
    ostudy = run(path)
    failed = [t for t in ostudy.trials if t.state == optuna.trial.TrialState.FAIL]
    assert len(failed) == 2 and all("nan" in t.user_attrs["fail_reason"] or "inf" in t.user_attrs["fail_reason"] for t in failed)


def test_max_failures_stops_the_study(tmp_path: Path) -> None:
    path = write_study(tmp_path, budget={"epochs": 1, "batch_size": 128, "lr": 1e12, "seed": 0, "grad_clip": None}, max_failures=2)
    with pytest.raises(ExplorerError, match="stopped after 2 failed trials"):
        run(path)


@pytest.mark.parametrize(
    "change, field, words",
    [
        ({"sampler": {"name": "annealing"}}, "sampler.name", "Input should be"),
        ({"n_trials": 0}, "n_trials", "greater than or equal to 1"),
        ({"budget": {"epochs": 1, "lr": "fast"}}, "budget.lr", "valid number"),
        ({"colour": 1}, "colour", "unknown field"),
        ({"space": "missing.yaml"}, "space", "does not exist"),
        ({"task": {"name": "mnist"}}, "task.name", "unknown task"),
        ({"task": {"name": "digits", "img_size": 16}}, "task", "img_size=16"),
        ({"objectives": ["maximize speed"]}, "objectives.0", "unknown objective"),
        ({"objectives": ["fastest params"]}, "objectives", "maximize NAME"),
        ({"objectives": ["minimize params"]}, "objectives", "no objective uses"),
        ({"storage": "sqlite:////nonexistent/dir/x.db"}, "storage", "cannot open storage"),
        ({"storage": "nosuchdb://user@host/db"}, "storage", "cannot open storage"),
        ({"name": "../escape"}, "name", "should match pattern"),
    ],
)
def test_bad_study_is_one_line_naming_file_and_field(tmp_path: Path, change: dict, field: str, words: str) -> None:
    path = write_study(tmp_path, **change)
    with pytest.raises(ExplorerError) as info:
        load_study_spec(path).open()
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}: {field}"), message
    assert words in message, message


def test_changed_space_is_refused_unless_forced(tiny_study: Path) -> None:
    run(write_study(tiny_study.parent, n_trials=1))
    changed = {**TINY_SPACE, "free": {"layers": [1, 2, 3], "heads": "divisors"}}
    write_study(tiny_study.parent, space_doc=changed, n_trials=1)
    with pytest.raises(ExplorerError, match="another space; rerun with --force"):
        load_study_spec(tiny_study).open()
    assert len(load_study_spec(tiny_study).open(force=True).get_trials(states=(COMPLETE,))) == 1


def test_journal_storage(tmp_path: Path) -> None:
    ostudy = run(write_study(tmp_path, storage="journal:tiny.log", n_trials=2))
    assert len(ostudy.get_trials(states=(COMPLETE,))) == 2 and (tmp_path / "tiny.log").exists()


STUDIES = sorted(Path(__file__).parents[1].joinpath("studies").glob("*.yaml"))


@pytest.mark.parametrize("path", STUDIES, ids=[p.stem for p in STUDIES])
def test_shipped_studies_load_and_run_a_short_trial(path: Path, tmp_path: Path) -> None:
    study = load_study_spec(path)
    assert study.spec.n_trials >= 1 and study.keys
    study.spec.storage = f"sqlite:///{tmp_path / 'shipped.db'}"
    study.spec.budget.epochs, study.spec.budget.max_steps, study.spec.n_trials = 1, 2, 1
    ostudy = study.open()
    LocalExecutor().run(study, ostudy)
    (trial,) = ostudy.get_trials(states=(COMPLETE,))
    assert trial.user_attrs["params"] == study.configs[trial.params["arch"]].params
