"""A local worker trains its configuration's queued seeds with its own trial, as one model, and records each
(configuration, seed) once, as its own trial (explorer.executors.seedgroups): real SQLite, real training."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from conftest import TINY_SPACE, write_study

from explorer.executors import seedgroups
from explorer.executors.local import LocalExecutor
from explorer.study import load_study_spec
from explorer.optuna_compat import storage_of, trial_storage_id

COMPLETE, WAITING, RUNNING = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.WAITING,
                              optuna.trial.TrialState.RUNNING)
BUDGET = {"epochs": 2, "batch_size": 128, "lr": 0.003, "seed": 0, "seeds": 3}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def run_study(folder: Path, seed_batch: str) -> dict[tuple[str, int], optuna.trial.FrozenTrial]:
    space = {**TINY_SPACE, "free": {"layers": [1, 2], "heads": [4]}, "baseline": {"layers": 2, "heads": 4}}
    path = write_study(folder, space, budget={**BUDGET, "seed_batch": seed_batch}, replicates={"policy": "fixed"}, n_trials=2)
    study = load_study_spec(path)
    ostudy = study.open()
    LocalExecutor().run(study, ostudy)
    trials = ostudy.get_trials()
    assert all(t.state == COMPLETE for t in trials), [(t.number, t.state, t.user_attrs.get("fail_reason")) for t in trials]
    done = {(t.params["arch"], t.user_attrs["seed"]): t for t in trials}
    assert len(done) == len(trials) == 2 * 3  # every (configuration, seed) once, each its own trial
    return done


def test_replicates_train_together_and_are_recorded_each_as_alone(tmp_path: Path) -> None:
    alone = run_study(tmp_path / "alone", "off")
    together = run_study(tmp_path / "together", "on")
    assert alone.keys() == together.keys()
    for key, t in together.items():
        a = alone[key]
        # seed 0 trains first, alone; the `fixed` policy then queues seeds 1 and 2, which train as one model
        assert t.user_attrs["seed_batch"] == (1 if key[1] == 0 else 2) and a.user_attrs["seed_batch"] == 1
        assert t.user_attrs["identity"] == a.user_attrs["identity"] and t.params == a.params
        assert t.user_attrs["curve"] == pytest.approx(a.user_attrs["curve"], rel=1e-5)
        assert t.values == pytest.approx(a.values, rel=1e-5)
        assert t.user_attrs.get("replicate", False) == (key[1] != 0) and len(t.user_attrs["curve"]) == 2


def test_a_queued_seed_another_worker_takes_first_is_not_claimed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The claim is one storage transaction that only succeeds on a trial still queued. The interleaving is
    forced: another worker takes seed 2 after this one listed the queue and before it claims."""
    path = write_study(tmp_path, budget={**BUDGET, "seeds": 4, "seed_batch": "on"})
    study = load_study_spec(path)
    ostudy = study.open()
    key = study.keys[0]
    for seed in (1, 2, 3):
        ostudy.enqueue_trial({"arch": key}, user_attrs={"seed": seed, "replicate": True})
    queued = {study.seed_of(t): t for t in ostudy.get_trials(states=(WAITING,)) if t.system_attrs["fixed_params"]["arch"] == key}
    other = optuna.load_study(study_name=study.spec.name, storage=study.store.url)  # a second worker's handle
    listed = seedgroups.current_trials

    def listing_then_other_worker(*args, **kwargs):
        trials = listed(*args, **kwargs)
        assert storage_of(other).set_trial_state_values(trial_storage_id(queued[2]), state=RUNNING)  # it takes seed 2
        return trials

    monkeypatch.setattr(seedgroups, "current_trials", listing_then_other_worker)
    assert storage_of(ostudy).set_trial_state_values(trial_storage_id(queued[1]), state=RUNNING)  # this worker's own
    mine = optuna.Trial(ostudy, trial_storage_id(queued[1]))
    cfg = study.evaluator.suggest(mine)
    claimed = seedgroups.claim(study, ostudy, mine, cfg)
    assert sorted(study.seed_of(t) for t in claimed) == [0, 3]  # the grid's seed-0 trial of it is queued too
    for t in claimed:
        assert t.params["arch"] == key and t.user_attrs["identity"] == study.identity_key
        assert ostudy.get_trials()[t.number].state == RUNNING
    monkeypatch.setattr(seedgroups, "current_trials", listed)
    assert seedgroups.claim(study, ostudy, mine, cfg) == []  # nothing is claimed twice
