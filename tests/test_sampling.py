"""The ordered encoding and the samplers over it: feasible only, no repeats, old `arch` studies resume."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import optuna
import pytest
from conftest import write_study
from hypothesis import given, settings
from hypothesis import strategies as st
from optuna.distributions import IntDistribution

from explorer.dashboard import render_studies
from explorer.executors.local import LocalExecutor
from explorer.frame import trials_frame
from explorer.sampling import ARCH, ArchEncoding, BudgetSampler, Encoding, FeasibleSampler, encoding_of
from explorer.space import load_space
from explorer.study import load_study_spec

ROOT = Path(__file__).parents[1]
TIMM = ("timm-",)


def _spaces() -> list:
    """Every shipped space; timm's count parameters on the meta device (slow), so those are marked slow."""
    import yaml

    out = []
    for path in sorted((ROOT / "spaces").glob("*.yaml")):
        slow = yaml.safe_load(path.read_text())["family"].startswith(TIMM)
        out.append(pytest.param(path, id=path.stem, marks=pytest.mark.slow if slow else ()))
    return out


@pytest.mark.parametrize("path", _spaces())
def test_ordered_encoding_round_trips_every_feasible_configuration(path: Path) -> None:
    space = load_space(path)
    enc, arch = Encoding(space), ArchEncoding(space)
    everything = np.ones(len(enc.configs), dtype=bool)
    for cfg in enc.configs:
        params = enc.params(cfg)
        assert enc.config(params) is cfg and enc.config({d: params[d] for d in enc.dims}) is cfg
        assert arch.config(arch.params(cfg)) is cfg
        assert enc.nearest({d: params[d] for d in enc.dims}, everything) is cfg
        assert all(enc.ordered[d]._contains(enc.ordered[d].to_internal_repr(params[d])) for d in enc.dims)


@pytest.mark.parametrize("path", _spaces())
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_any_proposal_is_repaired_to_a_feasible_untaken_configuration(path: Path, data: st.DataObject) -> None:
    space = load_space(path)
    enc = Encoding(space)
    proposal = {}
    for d, dist in enc.ordered.items():
        if isinstance(dist, IntDistribution):
            proposal[d] = data.draw(st.integers(dist.low, dist.high), label=d)
        else:
            proposal[d] = data.draw(st.sampled_from(dist.choices), label=d)
    allowed = np.array(data.draw(st.lists(st.booleans(), min_size=len(enc.configs), max_size=len(enc.configs)), label="allowed"))
    if not allowed.any():
        allowed[0] = True
    cfg = enc.nearest(proposal, allowed)
    assert allowed[enc.configs.index(cfg)] and space.explain(cfg.dims) == []


def _samplers(enc: Encoding) -> dict[str, optuna.samplers.BaseSampler]:
    return {
        "tpe": FeasibleSampler(enc, optuna.samplers.TPESampler(seed=1, n_startup_trials=3), seed=1),
        "nsga2": FeasibleSampler(enc, optuna.samplers.NSGAIISampler(population_size=4, seed=1), seed=1),
        "random": FeasibleSampler(enc, optuna.samplers.RandomSampler(seed=1), seed=1),
        "budget-ei": BudgetSampler(enc, 0, True, n_startup=3, seed=1),
    }


@pytest.mark.parametrize("name", ["tpe", "nsga2", "random", "budget-ei"])
def test_samplers_cover_the_space_without_repeats_and_workers_do_not_collide(name: str) -> None:
    """Every proposal is feasible and untaken; trials still running (other workers') are not proposed."""
    space = load_space(ROOT / "spaces" / "vit-digits.yaml")
    enc = Encoding(space)
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=_samplers(enc)[name])
    keys = []
    while len(keys) < len(enc.configs):
        trials = [study.ask() for _ in range(2)]  # two workers ask before either tells
        for trial in trials:
            cfg = enc.suggest(trial)
            assert space.explain(cfg.dims) == [] and trial.params[ARCH] == cfg.key
            keys.append(cfg.key)
        for trial, key in zip(trials, keys[-2:]):
            cfg = space.config(key)
            study.tell(trial, [-abs(cfg["layers"] - 3) - abs(np.log2(cfg["heads"]) - 2), cfg.params])
    assert sorted(keys) == sorted(c.key for c in enc.configs)


def test_queued_configuration_is_what_the_trial_gets(tmp_path: Path) -> None:
    """A queued `arch` (grid, retries, `recommend --verify`) fixes the ordered parameters too."""
    space = load_space(ROOT / "spaces" / "digits-wide.yaml")
    enc = Encoding(space)
    for sampler in _samplers(enc).values():
        study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
        key = enc.configs[17].key
        study.enqueue_trial({ARCH: key})
        cfg = enc.suggest(study.ask())
        assert cfg.key == key


def test_study_of_n_trials_trains_n_distinct_configurations(tmp_path: Path) -> None:
    ostudy = _run(write_study(tmp_path, sampler={"name": "tpe", "seed": 0}, n_trials=5))
    done = ostudy.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(done) == 5 and len({t.params[ARCH] for t in done}) == 5
    assert not any("duplicate_of" in t.user_attrs for t in done)
    assert all({"layers", "heads", ARCH} <= set(t.params) for t in done)
    assert ostudy.user_attrs["encoding"] == "ordered"


def test_default_sampler_runs_a_study(tmp_path: Path) -> None:
    ostudy = _run(write_study(tmp_path, sampler={"name": "budget-ei", "seed": 0}, n_trials=6))
    done = ostudy.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len({t.params[ARCH] for t in done}) == 6


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
def test_study_stored_with_arch_before_the_ordered_encoding_resumes(tmp_path: Path) -> None:
    """A study as the categorical-`arch` code stored it (identity recorded, no `encoding`, trials with
    `arch` alone) resumes: its trials are kept, new ones sample `arch` without repeating any, and it renders."""
    path = write_study(tmp_path, sampler={"name": "nsga2", "seed": 0, "population_size": 2}, n_trials=5)
    study = load_study_spec(path)
    keys = list(study.configs)
    old = optuna.create_study(study_name="tiny", storage=study.store.storage(), directions=["maximize", "minimize"])
    for key, value in {"spec": study.spec.model_dump(mode="json"), "space": study.space.to_dict(), "baseline": study.space.baseline.key,
                       "metric": "accuracy", "higher_is_better": True, "objectives": [o.model_dump() for o in study.objectives]}.items():
        old.set_user_attr(key, value)
    old.set_user_attr("identity", study.identity())
    for key in keys[:2]:  # two trials trained and stored as the old code did (two distinct ones: its sampler is unseeded)
        old.enqueue_trial({ARCH: key})
        trial = old.ask({ARCH: optuna.distributions.CategoricalDistribution(keys)})
        attrs = study.evaluator.evaluate(study.configs[trial.params[ARCH]], trial.number)
        for name, value in attrs.items():
            trial.set_user_attr(name, value)
        old.tell(trial, study.evaluator.values(attrs))
    before = {t.number: (t.params, t.values) for t in old.trials}

    resumed = load_study_spec(path)
    ostudy = resumed.open()
    assert isinstance(resumed.encoding(), ArchEncoding) and "encoding" not in ostudy.user_attrs
    LocalExecutor().run(resumed, ostudy)
    trials = ostudy.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert {t.number: (t.params, t.values) for t in trials if t.number in before} == before
    assert len(trials) == 5 and len({t.params[ARCH] for t in trials}) == 5 and all(set(t.params) == {ARCH} for t in trials)
    frame = trials_frame(ostudy)
    assert frame["arch"].notna().all()
    assert "layers=" in render_studies([path], tmp_path / "d.html").read_text()
    assert encoding_of(study.space, ostudy).name == "arch"


def _run(path: Path) -> optuna.Study:
    study = load_study_spec(path)
    ostudy = study.open()
    LocalExecutor().run(study, ostudy)
    return ostudy
