"""Pruning fair to small models: the dominated rule, the binned rules, and a real pruned study."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import optuna
import pytest
from conftest import write_study

from explorer.executors.local import LocalExecutor
import pandas as pd

from explorer.pruning import BinnedPruner, Peer, come_back, pruned_within
from explorer.sampling import BudgetSampler, Encoding
from explorer.study import load_study_spec

PRUNED = optuna.trial.TrialState.PRUNED


def dominated(**kw) -> BinnedPruner:
    return BinnedPruner("dominated", True, np.array([]), **{"warmup": 2, "startup": 1, "epochs": 3, **kw})


def test_a_trial_that_cannot_catch_a_cheaper_configuration_is_pruned() -> None:
    """The cheaper peer finished at 0.9 and gained 0.4 after epoch 2: a trial at 0.4 after epoch 2
    would need more than the largest gain seen to catch it."""
    cheaper = [Peer(100, [0.2, 0.5, 0.9], "a")]
    assert dominated().should_prune(2, 0.4, 200, cheaper, "b")
    assert dominated().should_prune(2, 0.4, 100, cheaper, "b")  # as cheap counts: same cost, worse metric
    assert not dominated().should_prune(2, 0.55, 200, cheaper, "b")  # 0.55 + 0.4 could still beat 0.9
    assert not dominated(margin=0.2).should_prune(2, 0.4, 200, cheaper, "b")  # within the margin
    assert not dominated().should_prune(1, 0.0, 200, cheaper, "b")  # before warmup
    assert not dominated(startup=2).should_prune(2, 0.4, 200, cheaper, "b")  # too few complete peers
    assert not dominated().should_prune(2, 0.4, 200, [Peer(100, [0.2, 0.9], "a")], "b")  # a running peer is no bar yet


def test_a_dearer_configuration_or_the_trials_own_replicates_never_prune() -> None:
    """A small model worse than a big one may still be on the budget front; another seed of the same
    configuration is not another configuration."""
    assert not dominated().should_prune(2, 0.1, 100, [Peer(200, [0.8, 0.9, 0.9], "big")], "small")
    assert not dominated().should_prune(2, 0.1, 100, [Peer(100, [0.8, 0.9, 0.9], "small")], "small")
    lower = BinnedPruner("dominated", False, np.array([]), warmup=1, startup=1, epochs=2)  # a loss: lower is better
    peer = [Peer(100, [1.0, 0.8], "a")]
    assert lower.should_prune(1, 2.0, 200, peer) and not lower.should_prune(1, 0.5, 200, peer)


def test_one_unlucky_seed_of_a_cheaper_configuration_does_not_prune() -> None:
    """Defect 4: with noise allowed for, a cheaper configuration's single lucky run is no bar; its mean
    over several seeds, less a smaller allowance, is."""
    lucky = [Peer(100, [0.2, 0.5, 0.95], "a")]  # b at 0.49 after epoch 2 + the 0.45 gain seen = 0.94 < 0.95
    assert dominated().should_prune(2, 0.49, 200, lucky, "b")  # single runs trusted: pruned
    assert not dominated(noise=0.02).should_prune(2, 0.49, 200, lucky, "b")  # 0.95 - 1.645 x 0.02 x sqrt(2) = 0.903
    seeds = [Peer(100, [0.2, 0.5, v], "a") for v in (0.95, 0.96, 0.94, 0.95)]  # four seeds at 0.95: allowance 0.037
    assert dominated(noise=0.02).should_prune(2, 0.40, 200, seeds, "b") and not dominated(noise=0.02).should_prune(2, 0.49, 200, seeds, "b")


def test_the_noise_allowance_defaults_to_the_study_s_own_noise_model() -> None:
    """Issue 26: the allowance defaulted to 0, so single runs were trusted and the dominated pruner hit
    true-front configurations (117 of 5,166 prunes in bench/search.py's replays). It now reads the same
    noise model as the posterior, fitted on the complete peers' seeds; 0 before any replicate."""
    seeds = [Peer(100, [0.2, 0.5, v], "a") for v in (0.95, 0.93, 0.97)] + [Peer(100, [0.2, 0.5, v], "c") for v in (0.90, 0.86, 0.92)]
    assert dominated(noise=0.0).should_prune(2, 0.47, 200, seeds, "b")  # 0.47 + the 0.47 gain seen = 0.94 < a's 0.95
    assert not dominated().should_prune(2, 0.47, 200, seeds, "b")  # the allowance from the seeds' own scatter
    assert dominated().should_prune(2, 0.30, 200, seeds, "b")  # far below, pruned all the same
    assert dominated().should_prune(2, 0.49, 200, [Peer(100, [0.2, 0.5, 0.95], "a")], "b")  # no replicate: no estimate


def test_pruned_configurations_are_listed_and_come_back_when_their_bar_falls() -> None:
    def frame(a_finals: list[float]) -> pd.DataFrame:
        rows = [{"state": "COMPLETE", "arch": "a", "params": 100, "curve": [0.2, 0.5, v]} for v in a_finals]
        rows += [{"state": "PRUNED", "arch": "b", "params": 200, "curve": [0.3, 0.45]},
                 {"state": "PRUNED", "arch": "big", "params": 900, "curve": [0.1, 0.1]}]
        return pd.DataFrame(rows)

    pruner = dominated(noise=0.02)
    assert pruned_within(frame([0.95]), 500) == ["b"] and pruned_within(frame([0.95]), 1000) == ["b", "big"]
    assert come_back(pruner, frame([0.99, 0.99])) == []  # a is still far ahead of b's best reach (0.45 + 0.49)
    assert come_back(pruner, frame([0.99, 0.85, 0.86])) == ["b"]  # a's later seeds pulled its mean down: b comes back


def test_median_compares_within_the_parameter_bin_only() -> None:
    pruner = BinnedPruner("median", True, np.array([150.0]), warmup=1, startup=2)
    small = [Peer(100, [0.3], "a"), Peer(110, [0.5], "b")]
    big = [Peer(200, [0.9], "c"), Peer(300, [0.95], "d")]
    assert pruner.should_prune(1, 0.35, 120, small + big, "e")
    assert not pruner.should_prune(1, 0.45, 120, small + big, "e")  # above its own bin's median, below the big ones


@pytest.mark.slow
def test_a_study_prunes_only_dominated_trials_and_never_a_replicate(tmp_path: Path) -> None:
    path = write_study(tmp_path, n_trials=6, budget={"epochs": 4, "batch_size": 128, "lr": 0.003, "seed": 0, "seeds": 2},
                       pruner={"name": "dominated", "warmup_epochs": 1, "startup_trials": 1, "param_bins": 1},
                       replicates={"policy": "fixed"})
    study = load_study_spec(path)
    ostudy = study.open()
    LocalExecutor().run(study, ostudy)
    trials = [t for t in ostudy.trials if "curve" in t.user_attrs]
    assert {t.user_attrs["seed"] for t in trials if t.user_attrs.get("replicate")} == {1}
    assert not any(t.state == PRUNED for t in trials if t.user_attrs.get("replicate"))
    pruned = [t for t in trials if t.state == PRUNED]
    assert pruned, [(t.params["arch"], t.user_attrs["curve"]) for t in trials]  # (deterministic on CPU)
    for t in pruned:  # stopped when no gain a complete trial made from that epoch on would take it past a cheaper one
        curve, params = t.user_attrs["curve"], t.user_attrs["params"]
        done = [p.user_attrs["curve"] for p in trials if p.number < t.number and p.params["arch"] != t.params["arch"]
                and p.state == optuna.trial.TrialState.COMPLETE]
        gain = max(c[-1] - c[len(curve) - 1] for c in done)
        assert curve[-1] + gain < max(p.user_attrs["curve"][-1] for p in trials if p.number < t.number and p.params["arch"] != t.params["arch"]
                                      and p.state == optuna.trial.TrialState.COMPLETE and p.user_attrs["params"] <= params)


def test_budget_sampler_learns_from_pruned_trials(tmp_path: Path) -> None:
    """A pruned trial enters the GP at its last metric plus the median gain complete trials made after that epoch."""
    study = load_study_spec(write_study(tmp_path))
    enc = Encoding(study.space)
    ostudy = optuna.create_study(directions=["maximize", "minimize"])
    for cfg, curve, state in [(enc.configs[0], [0.2, 0.5, 0.6], "complete"), (enc.configs[1], [0.1, 0.4, 0.8], "complete"),
                              (enc.configs[2], [0.05], "pruned")]:
        ostudy.add_trial(optuna.trial.create_trial(
            params=enc.params(cfg), distributions=enc.distributions, user_attrs={"curve": curve},
            state=PRUNED if state == "pruned" else optuna.trial.TrialState.COMPLETE,
            values=None if state == "pruned" else [curve[-1], cfg.params]))
    seen = dict(BudgetSampler(enc, 0, True)._observations(ostudy))
    assert seen[0] == 0.6 and seen[1] == 0.8
    assert seen[2] == pytest.approx(0.05 + np.median([0.6 - 0.2, 0.8 - 0.1]))


def test_budget_sampler_does_not_count_answers_from_storage(tmp_path: Path) -> None:
    """Defect 6: a trial answered from storage (`duplicate_of`) repeats a measurement; counting it again
    told the GP the configuration was measured twice (and filled the startup bins with one point)."""
    study = load_study_spec(write_study(tmp_path))
    enc = Encoding(study.space)
    ostudy = optuna.create_study(directions=["maximize", "minimize"])
    for attrs in ({"curve": [0.5, 0.7]}, {"curve": [0.5, 0.7], "duplicate_of": 0}):
        ostudy.add_trial(optuna.trial.create_trial(params=enc.params(enc.configs[0]), distributions=enc.distributions,
                                                   user_attrs=attrs, values=[0.7, enc.configs[0].params]))
    assert BudgetSampler(enc, 0, True)._observations(ostudy) == [(0, 0.7)]


def test_the_queue_brings_a_pruned_configuration_back_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between rounds the queue asks `come_back` (tested above) and queues each answer once, on top of n_trials."""
    study = load_study_spec(write_study(tmp_path, n_trials=1, sampler={"name": "random", "seed": 0},
                                        pruner={"name": "dominated", "warmup_epochs": 1, "startup_trials": 1}))
    ostudy = study.open()
    asked: list[int] = []

    def pruned_then_cleared(pruner: BinnedPruner, frame: pd.DataFrame) -> list[str]:
        asked.append(len(frame))
        return ["layers=1,heads=1"]

    monkeypatch.setattr("explorer.study.queue.come_back", pruned_then_cleared)
    study.queue.replicates(ostudy)
    study.queue.replicates(ostudy)  # queued and waiting: no second copy, and no call while it waits
    (back,) = ostudy.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert back.user_attrs["came_back"] and back.system_attrs["fixed_params"]["arch"] == "layers=1,heads=1"
    assert asked == [0] and study.queue.remaining(ostudy) == 1 + 1  # n_trials' one configuration, plus it
