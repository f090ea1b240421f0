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
from explorer.stats import summarize
from explorer.study import Study, load_study_spec
from explorer.study.read import peers

COMPLETE = optuna.trial.TrialState.COMPLETE


def run(path: Path, **open_kwargs) -> optuna.Study:
    study = load_study_spec(path)
    ostudy = study.open(**open_kwargs)
    LocalExecutor().run(study, ostudy)
    return ostudy


def outcomes(ostudy: optuna.Study) -> list[tuple[str, tuple[float, ...]]]:
    """The measurements: completed trials, less duplicates answered from storage."""
    return [(t.params["arch"], tuple(t.values)) for t in ostudy.get_trials(states=(COMPLETE,)) if "duplicate_of" not in t.user_attrs]


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
    first = outcomes(run(tiny_study))
    again = run(tiny_study)
    assert outcomes(again) == first and len(again.trials) == 6


def test_duplicates_are_answered_from_storage_and_never_counted_as_measurements(tmp_path: Path) -> None:
    """A configuration queued twice (samplers propose only untaken ones, explorer.sampling, but queues,
    retries and `--verify` can repeat one) is trained once, its repeat is recorded as a duplicate
    (Optuna learns from it) and no consumer counts it: n_trials, pruning peers, the frame, the surface fit."""
    path = write_study(tmp_path, sampler={"name": "random", "seed": 0}, n_trials=12)
    study = load_study_spec(path)
    ostudy = study.open()
    for _ in range(2):
        ostudy.enqueue_trial({"arch": study.keys[0]})
    LocalExecutor().run(study, ostudy)
    trials = ostudy.get_trials(states=(COMPLETE,))
    duplicates = [t for t in trials if "duplicate_of" in t.user_attrs]
    assert duplicates and all(t.values == ostudy.trials[t.user_attrs["duplicate_of"]].values for t in duplicates)
    assert sorted(a for a, _ in outcomes(ostudy)) == sorted(study.keys)  # every configuration measured once, then it stops
    assert study.reads.finished(ostudy) == 6 and study.queue.remaining(ostudy) == 0
    assert len(peers(ostudy.get_trials(), -1)) == 6 and len(trials_frame(ostudy)) == 6
    table = summarize(trials_frame(ostudy, duplicates=True), "accuracy", [("accuracy", "maximize"), ("params", "minimize")], draws=0)
    assert len(table) == 6 and (table["n"] == 1).all()  # distinct measurements, not trials


def test_n_trials_counts_distinct_measurements(tmp_path: Path) -> None:
    ostudy = run(write_study(tmp_path, sampler={"name": "random", "seed": 0}, n_trials=4))
    assert len(outcomes(ostudy)) == len({a for a, _ in outcomes(ostudy)}) == 4


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
    study = load_study_spec(path)
    waiting = study.open(create=False)
    deadline = time.monotonic() + 60
    while waiting.trials[running.number].state != optuna.trial.TrialState.FAIL:  # stale after the grace period: failed, retried
        assert time.monotonic() < deadline
        study.queue.waiting(waiting)
        time.sleep(0.1)
    ostudy = run(path, create=False)

    trials = ostudy.trials
    for number, (arch, values, acc) in before.items():  # finished before the kill: unchanged
        assert (trials[number].params["arch"], tuple(trials[number].values), trials[number].user_attrs["accuracy"]) == (arch, values, acc)
    assert trials[running.number].state == optuna.trial.TrialState.FAIL  # marked failed ...
    done = [t for t in trials if t.state == COMPLETE]
    retried = [t for t in done if t.user_attrs.get("retry_of") == running.number]
    assert retried and retried[0].params["arch"] == running.params["arch"]  # ... and its config re-run
    archs = [t.params["arch"] for t in done]
    assert len(archs) == len(set(archs)) == 6  # nothing ran twice to completion; n_trials reached


def test_nan_trial_fails_with_reason_and_the_study_goes_on(tmp_path: Path) -> None:
    path = write_study(tmp_path, budget={"epochs": 1, "batch_size": 128, "lr": 1e12, "seed": 0, "grad_clip": None}, n_trials=2)
    ostudy = run(path)
    failed = [t for t in ostudy.trials if t.state == optuna.trial.TrialState.FAIL]
    assert len(failed) == 2 and all("nan" in t.user_attrs["fail_reason"] or "inf" in t.user_attrs["fail_reason"] for t in failed)


@pytest.mark.parametrize("seeds", [1, 2])  # 2: the seeds train as one model (explorer.executors.seedgroups)
def test_a_storage_that_fails_as_an_epoch_is_stored_fails_no_configuration(tmp_path: Path, seeds: int,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A database restarting mid-trial (seen under load in test_postgres) made storing an epoch raise, and the
    trial was stored as failed by itself: its configuration given up. The run now stops with the storage's
    one line, the trial is failed without a reason, and the next run trains it."""
    import explorer.executors.local as local

    path = write_study(tmp_path, budget={"epochs": 2, "batch_size": 128, "lr": 0.003, "seed": 0, "seeds": seeds},
                       replicates={"policy": "fixed"}, n_trials=2)
    calls = {"n": 0}
    real = local.flush_due

    def failing(storage, seconds=1.0):
        calls["n"] += 1
        if calls["n"] == 2:
            raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.")
        return real(storage, seconds)

    monkeypatch.setattr(local, "flush_due", failing)
    with pytest.raises(ExplorerError, match="storage"):
        run(path)
    ostudy = load_study_spec(path).open(create=False)
    failed = ostudy.get_trials(states=(optuna.trial.TrialState.FAIL,))
    assert failed and not [t for t in failed if "fail_reason" in t.user_attrs], [t.user_attrs for t in failed]
    ostudy = run(path)
    done = [(t.params["arch"], t.user_attrs.get("seed", 0)) for t in ostudy.get_trials(states=(optuna.trial.TrialState.COMPLETE,))]
    assert len(done) == len(set(done)) == 2 * seeds and not ostudy.get_trials(states=(optuna.trial.TrialState.RUNNING,))


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
        ({"storage": "nosuchdb://user@host/db"}, "storage", "is not a storage URL: write sqlite:///PATH"),
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
    with pytest.raises(ExplorerError, match=r"another space \(free\.layers \[1, 2\] -> \[1, 2, 3\]\); rerun with --force"):
        load_study_spec(tiny_study).open()
    with pytest.raises(ExplorerError, match=r"--force cannot continue this study: the new space changes the choices of"):
        load_study_spec(tiny_study).open(force=True)  # Optuna would refuse the new configurations' parameter
    kept = {**TINY_SPACE, "baseline": {"layers": 1, "heads": 1}}  # changed, its configurations the same
    write_study(tiny_study.parent, space_doc=kept, n_trials=1)
    with pytest.raises(ExplorerError, match=r"another space"):
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
    study.spec.budget.seeds = None  # one run: a grid past n_trials replicates what it ran (issue 42)
    ostudy = study.open()
    LocalExecutor().run(study, ostudy)
    (trial,) = ostudy.get_trials(states=(COMPLETE,))
    assert trial.user_attrs["params"] == study.configs[trial.params["arch"]].params


def test_checkpoints_belong_to_a_trial_and_its_retries_under_one_budget(tmp_path: Path) -> None:
    """Two trials of one configuration never share a checkpoint; a retry (same lineage) resumes its
    own; after the budget changes (`--force` with new epochs) an old checkpoint is not resumed."""
    path = write_study(tmp_path, budget={"epochs": 3, "batch_size": 128, "lr": 0.003, "seed": 0})
    study = load_study_spec(path)
    cfg = study.configs[study.keys[0]]

    def interrupt(epoch: int, metrics: dict) -> None:
        raise KeyboardInterrupt

    for lineage in (0, 2):  # two trials of the same configuration, each stopped after its first epoch
        with pytest.raises(KeyboardInterrupt):
            study.evaluator.evaluate(cfg, lineage, interrupt)
    assert study.checkpoint_dir(cfg, 0) != study.checkpoint_dir(cfg, 2)
    epochs: list[int] = []
    study.evaluator.evaluate(cfg, 1, lambda e, m: epochs.append(e))
    assert epochs == [0, 1, 2]  # a third trial trains from scratch, the others' checkpoints untouched
    epochs.clear()
    study.evaluator.evaluate(cfg, 0, lambda e, m: epochs.append(e))
    assert epochs == [1, 2] and not study.checkpoint_dir(cfg, 0).exists()  # the retry resumed and spent it
    changed = load_study_spec(write_study(tmp_path, budget={"epochs": 4, "batch_size": 128, "lr": 0.003, "seed": 0}))
    epochs.clear()
    changed.evaluator.evaluate(cfg, 2, lambda e, m: epochs.append(e))
    assert epochs == [0, 1, 2, 3]  # the old budget's checkpoint was not resumed


def test_a_retry_knows_the_trial_it_continues() -> None:
    first = optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, params={}, distributions={})
    first.number = 3
    optuna_retry = optuna.trial.create_trial(state=optuna.trial.TrialState.WAITING, system_attrs={"failed_trial": 3})
    explorer_retry = optuna.trial.create_trial(state=optuna.trial.TrialState.WAITING, user_attrs={"retry_of": 3},
                                               system_attrs={"failed_trial": 7})  # Optuna's retry of an explorer retry
    assert {Study.lineage(t) for t in (first, optuna_retry, explorer_retry)} == {3}


def test_objectives_are_named_for_optuna(tiny_study: Path) -> None:
    assert load_study_spec(tiny_study).open().metric_names == ["accuracy", "params"]


def test_a_grid_queue_spreads_any_prefix_over_the_space(tmp_path: Path) -> None:
    space = {**TINY_SPACE, "free": {"layers": [1, 2, 3, 4, 5, 6], "heads": "divisors"}}  # 6 depths x 3 heads
    study = load_study_spec(write_study(tmp_path, space_doc=space, n_trials=6))
    queue = [t.system_attrs["fixed_params"]["arch"] for t in study.open().get_trials()]
    assert sorted(queue) == sorted(study.keys)
    first = [study.configs[k].dims for k in queue[:6]]
    assert [(d["layers"], d["heads"]) for d in first[:4]] == [(1, 1), (6, 4), (1, 4), (6, 1)]  # the corners first
    assert {d["heads"] for d in first[:5]} == {1, 2, 4} and {d["layers"] for d in first[:5]} == {1, 3, 6}  # then the middle
