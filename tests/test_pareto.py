"""Fronts and hypervolume against brute force; trials_frame and recommend on real SQLite studies."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pandas as pd
import optuna
import pytest

from explorer.errors import ExplorerError
from explorer.frame import columns, trials_frame
from explorer.pareto import front_over_time, hypervolume, knee, pareto_mask, reference_point
from explorer.decisions import parse_budget
from explorer.recommend import recommend
from explorer import stats

WIDTH, MLP = 64, 128
LAYERS, HEADS = (1, 2, 3, 4, 5, 6), (1, 2, 4, 8)


def params_of(layers: int) -> int:
    """Params of a fixed-width encoder: heads split the width, so they do not change the count."""
    return layers * (4 * WIDTH * WIDTH + 2 * WIDTH * MLP) + 1000


def accuracy_of(layers: int, heads: int) -> float:
    return 0.6 + 0.05 * math.log(layers) + 0.03 * math.log(heads) + 0.004 * math.log(layers) * math.log(heads)


def key_of(layers: int, heads: int) -> str:
    return f"layers={layers},heads={heads}"


def dims_of(layers: int, heads: int) -> dict:
    return {"layers": layers, "heads": heads, "width": WIDTH, "mlp": MLP, "img_size": 8, "patch": 2}


def make_study(path: Path, name: str = "synthetic", **kwargs) -> optuna.Study:
    """A real SQLite study shaped like explorer's: every (layers, heads) once, one failed trial."""
    study = optuna.create_study(study_name=name, storage=f"sqlite:///{path}", directions=["maximize", "minimize"])
    study.set_user_attr("metric", "accuracy")
    return fill_study(study, **kwargs)


def fill_study(
    study: optuna.Study,
    skip_layers: tuple[int, ...] = (),
    fail_reason: str = "loss is NaN at step 3",
    noise: float = 0.001,
    seed: int = 0,
) -> optuna.Study:
    """Add the synthetic trials (accuracy_of plus noise; params_of) to `study`."""
    rng = np.random.default_rng(seed)
    study.set_user_attr("baseline", key_of(6, 2))
    keys = [key_of(d, h) for d in LAYERS for h in HEADS]
    dist = {"arch": optuna.distributions.CategoricalDistribution(keys)}
    trials = []
    for layers, heads in itertools.product(LAYERS, HEADS):
        if layers in skip_layers:
            continue
        acc = accuracy_of(layers, heads) + rng.normal(0, noise)
        kappa = 40.0 / heads + rng.random()
        attrs = {
            "config": dims_of(layers, heads), "layers": layers, "heads": heads, "width": WIDTH, "mlp": MLP,
            "params": params_of(layers), "flops": 64 * params_of(layers), "accuracy": acc,
            "kappa_init": [kappa] * layers, "kappa_final": [2 * kappa] * layers,
            "kappa_init_mean": kappa, "kappa_final_mean": 2 * kappa, "train_time_s": 1.5, "device": "cpu",
        }
        curve = {2: acc, 0: acc - 0.2, 1: acc - 0.05}  # stored out of order on purpose
        trials.append(
            optuna.trial.create_trial(
                params={"arch": key_of(layers, heads)}, distributions=dist, values=[acc, params_of(layers)],
                user_attrs=attrs, intermediate_values=curve,
            )
        )
    trials.append(
        optuna.trial.create_trial(
            params={"arch": key_of(2, 8)}, distributions=dist, state=optuna.trial.TrialState.FAIL,
            user_attrs={"fail_reason": fail_reason, "layers": 2, "heads": 8, "width": WIDTH, "mlp": MLP,
                        "params": params_of(2), "config": dims_of(2, 8)},
        )
    )
    study.add_trials(trials)
    return study


@pytest.fixture(scope="module")
def studies(tmp_path_factory: pytest.TempPathFactory):
    """Build each variant of the synthetic study once per module: creating SQLite storage is slow."""
    cache: dict[tuple, optuna.Study] = {}

    def get(**kwargs) -> optuna.Study:
        key = tuple(sorted(kwargs.items()))
        if key not in cache:
            cache[key] = make_study(tmp_path_factory.mktemp("study") / "s.db", **kwargs)
        return cache[key]

    return get


def brute_mask(values: np.ndarray, directions: list[str]) -> np.ndarray:
    loss = values * np.array([-1 if d == "maximize" else 1 for d in directions])
    out = []
    for p in loss:
        if np.isnan(p).any():
            out.append(False)
            continue
        out.append(not any(np.all(q <= p) and np.any(q < p) for q in loss if not np.isnan(q).any()))
    return np.array(out, dtype=bool)


@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_pareto_mask_matches_brute_force_with_ties_and_duplicates(m: int) -> None:
    rng = np.random.default_rng(m)
    for case in range(40):
        n = int(rng.integers(1, 60))
        # few distinct values: many ties in single objectives and whole duplicated points
        values = rng.integers(0, 4 if case % 2 else 50, size=(n, m)).astype(float)
        if case % 5 == 0:
            values = np.vstack([values, values[: n // 2]])
        if case % 7 == 0:
            values[rng.integers(0, len(values))] = np.nan
        directions = [str(d) for d in rng.choice(["maximize", "minimize"], size=m)]
        np.testing.assert_array_equal(pareto_mask(values, directions), brute_mask(values, directions))


def test_identical_front_points_are_all_on_the_front() -> None:
    values = np.array([[0.9, 10], [0.9, 10], [0.8, 20], [0.95, 30]])
    assert pareto_mask(values, ["maximize", "minimize"]).tolist() == [True, True, False, True]


def brute_hypervolume(loss: np.ndarray, ref: np.ndarray) -> float:
    """Count the unit cells of the integer grid that some point dominates."""
    cells = itertools.product(*(range(int(lo), int(r)) for lo, r in zip(loss.min(axis=0), ref, strict=True)))
    return float(sum(any(np.all(p <= c) for p in loss) for c in map(np.array, cells)))


@pytest.mark.parametrize("m", [2, 3])
def test_hypervolume_matches_grid_count(m: int) -> None:
    rng = np.random.default_rng(10 + m)
    for _ in range(25):
        n = int(rng.integers(1, 15))
        values = rng.integers(0, 6, size=(n, m)).astype(float)
        values = np.vstack([values, values[:2]])  # duplicates
        directions = [str(d) for d in rng.choice(["maximize", "minimize"], size=m)]
        signs = np.array([-1 if d == "maximize" else 1 for d in directions])
        ref = np.where(signs < 0, -1.0, 6.0)  # just worse than every point, in the objective's own units
        expected = brute_hypervolume(values * signs, ref * signs)
        assert hypervolume(values, directions, ref) == pytest.approx(expected)


def test_hypervolume_ignores_points_beyond_the_reference() -> None:
    values = np.array([[0.5, 1.0], [0.9, 5.0], [0.1, 0.5]])
    assert hypervolume(values, ["maximize", "minimize"], [0.2, 2.0]) == pytest.approx(0.3 * 1.0)


def test_fronts_of_100k_points() -> None:
    """Scale (its speed is measured by bench/pareto.py, side by side with Optuna's own front)."""
    values = np.random.default_rng(0).random((100_000, 2))
    mask = pareto_mask(values, ["maximize", "minimize"])
    volume = hypervolume(values, ["maximize", "minimize"], [0.0, 1.0])
    front = values[mask]
    assert 0 < mask.sum() < 100 and 0.99 < volume < 1.0
    assert volume == pytest.approx(hypervolume(front, ["maximize", "minimize"], [0.0, 1.0]))
    dominated = (values[:, None, 0] <= front[None, :, 0]) & (values[:, None, 1] >= front[None, :, 1])
    assert dominated[~mask].any(axis=1).all()  # every point off the front is matched by one on it


def test_knee_is_the_bend_and_ignores_direction() -> None:
    front = np.array([[1.0, 0.50], [2.0, 0.85], [3.0, 0.88], [6.0, 0.90]])
    assert knee(front) == 1
    assert knee(front * [1, -1]) == 1
    assert knee(front[:2]) == 0
    with pytest.raises(ExplorerError):
        knee(np.zeros((3, 3)))


def test_trials_frame_schema(studies) -> None:
    study = studies()
    df = trials_frame(study)
    assert list(df.columns[: len(columns())]) == columns()
    assert len(df) == len(study.trials) == 25
    failed = df[df["state"] == "FAIL"].iloc[0]
    assert failed["fail_reason"] == "loss is NaN at step 3" and math.isnan(failed["accuracy"])
    done = df[df["state"] == "COMPLETE"].iloc[0]
    assert done["curve"] == pytest.approx([done["accuracy"] - 0.2, done["accuracy"] - 0.05, done["accuracy"]])
    assert done["config"]["width"] == WIDTH and done["arch"] == key_of(done["layers"], done["heads"])


def test_front_agrees_with_optuna_best_trials(studies) -> None:
    study = studies(noise=0.02)
    df = trials_frame(study)
    done = df[df["state"] == "COMPLETE"]
    mask = pareto_mask(done[["accuracy", "params"]].to_numpy(float), ["maximize", "minimize"])
    assert set(done["number"][mask]) == {t.number for t in study.best_trials}


def test_front_over_time_grows_to_the_study_hypervolume(studies) -> None:
    df = trials_frame(studies(noise=0.02))
    objectives = [("accuracy", "maximize"), ("params", "minimize")]
    hv = front_over_time(df, objectives)
    assert hv["number"].tolist() == sorted(df["number"])
    assert np.all(np.diff(hv["hypervolume"]) >= 0)
    done = df[df["state"] == "COMPLETE"]
    values = done[["accuracy", "params"]].to_numpy(float)
    ref = reference_point(values, ["maximize", "minimize"])
    for number in (3, 10, 24):
        upto = done[done["number"] <= number][["accuracy", "params"]].to_numpy(float)
        at = hv.loc[hv["number"] == number, "hypervolume"].item()
        assert at == pytest.approx(hypervolume(upto, ["maximize", "minimize"], ref))


@pytest.mark.parametrize(
    ("text", "expected"),
    [("60M", 60_000_000), ("1.5e6", 1_500_000), ("250k", 250_000), ("400000", 400_000),
     ("10%-below-baseline", 900_000), ("29 % below baseline", 710_000), ("baseline", 1_000_000)],
)
def test_parse_budget(text: str, expected: int) -> None:
    assert parse_budget(text, baseline_params=1_000_000) == expected


@pytest.mark.parametrize("text", ["lots", "-5M", "0", "10%-below-baseline", "100%-below-baseline", "5MB"])
def test_parse_budget_rejects_nonsense(text: str) -> None:
    baseline = None if text == "10%-below-baseline" else 1_000_000
    with pytest.raises(ExplorerError, match="budget"):
        parse_budget(text, baseline_params=baseline)


def test_recommend_measured_within_budget_and_on_the_front(studies) -> None:
    df = trials_frame(studies())
    budget = params_of(4) + 10
    rec = recommend(df, budget, key_of(6, 2))
    assert rec.kind == "measured" and rec.params <= budget
    assert (rec.layers, rec.heads) == (4, 8)
    done = df[df["state"] == "COMPLETE"]
    on_front = done[pareto_mask(done[["accuracy", "params"]].to_numpy(float), ["maximize", "minimize"])]
    assert rec.trial in set(on_front["number"])
    baseline = done[done["arch"] == key_of(6, 2)]["accuracy"].item()
    assert rec.answer.verdict.diff == pytest.approx(rec.value - baseline) and rec.answer.verdict.diff > 0
    assert set(rec.verify) == {key_of(d, h) for d in (3, 4) for h in (4, 8)}
    # one seed per configuration: a better value, but no interval, so no claim
    lines = "\n".join(rec.lines())
    assert "no interval" in lines and "beats" not in lines and "undecided" in lines


def replicated(skip_layers: tuple[int, ...] = (), noise: float = 0.005, seeds: int = 3) -> pd.DataFrame:
    """A trials frame of the synthetic surface at `seeds` seeds each."""
    rng = np.random.default_rng(0)
    rows = [{"number": 0, "state": "COMPLETE", "arch": key_of(d, h), "seed": s,
             "layers": d, "heads": h, "width": WIDTH, "mlp": MLP, "params": params_of(d), "config": dims_of(d, h),
             "accuracy": accuracy_of(d, h) + rng.normal(0, noise)}
            for d in LAYERS for h in HEADS if d not in skip_layers for s in range(seeds)]
    return pd.DataFrame(rows).assign(number=lambda f: range(len(f)))


def test_recommend_predicts_unmeasured_configurations_within_the_budget() -> None:
    """Layers 5 was never run: the surface predicts its configurations (with their uncertainty), they count
    among the configurations within the budget, and a predicted pick says so."""
    df = replicated(skip_layers=(5,))
    candidates = [(key_of(d, h), dims_of(d, h), params_of(d)) for d in LAYERS for h in HEADS]
    rec = recommend(df, params_of(5), key_of(6, 2), candidates=candidates)
    assert key_of(5, 8) in rec.answer.regret.keys
    post = stats.summarize(df, "accuracy", [("accuracy", "maximize"), ("params", "minimize")], draws=0,
                           candidates=candidates).attrs["posterior"]
    lo, hi = post.interval()
    i = post.index[key_of(5, 8)]
    assert post.n[i] == 0 and lo[i] <= accuracy_of(5, 8) <= hi[i]
    if rec.kind == "predicted":
        assert "predicted by the surface" in "\n".join(rec.lines())
    without = recommend(df, params_of(5), None)  # without the space's candidates only the measured count
    assert without.kind == "measured" and key_of(5, 8) not in without.answer.regret.keys


def test_recommend_keeps_measured_when_the_prediction_is_too_uncertain() -> None:
    df = replicated(skip_layers=(5,), noise=0.05)
    candidates = [(key_of(5, h), dims_of(5, h), params_of(5)) for h in HEADS]
    rec = recommend(df, params_of(5), None, candidates=candidates)
    assert rec.kind == "measured" and rec.layers <= 4


def test_recommend_with_nothing_within_budget_is_an_error(studies) -> None:
    df = trials_frame(studies())
    with pytest.raises(ExplorerError, match="budget"):
        recommend(df, 100, None)
