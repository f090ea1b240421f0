"""The shape law: recovery of a known optimum, the refusal past the reach, dropped terms, and order_held."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from explorer.errors import ExplorerError
from explorer.extrapolate import REACH, answer, fit, order_held
from conftest import write_study

ROOT = Path(__file__).resolve().parents[1]


def _params(layers: int, width: int) -> int:
    return layers * 8 * width * width + 10 * width  # mlp = 2 x width; heads do not change the count


def _true_err(layers: int, heads: int, width: int) -> float:
    """A surface of the law's form with an optimum: more of each dimension helps, size itself costs."""
    return (0.01 + 0.03 * (layers / 2.5) ** -1.0 + 0.02 * (heads / 2) ** -1.0 + 0.04 * (width / 32) ** -1.5
            + 0.005 * (_params(layers, width) / 30000) ** 1.0)


def _synthetic(widths: tuple[int, ...] = (16, 32, 64), seeds: int = 3, noise: float = 0.05) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for width in widths:
        for layers in range(1, 7):
            for heads in (1, 2, 4, 8):
                for seed in range(seeds):
                    err = _true_err(layers, heads, width) * float(np.exp(rng.normal(0, noise)))
                    rows.append({"key": f"layers={layers},heads={heads},width={width}", "layers": layers,
                                 "heads": heads, "width": width, "mlp": 2 * width,
                                 "params": _params(layers, width), "seed": seed, "metric": 1 - err})
    return pd.DataFrame(rows)


def _candidates(frame: pd.DataFrame) -> list[tuple[str, dict, int]]:
    configs = frame.groupby("key").first()
    return [(k, {d: int(r[d]) for d in ("layers", "heads", "width", "mlp")}, int(r["params"])) for k, r in configs.iterrows()]


def test_fit_recovers_a_known_optimum_within_its_interval() -> None:
    frame = _synthetic()
    model = fit(frame, "metric", higher_is_better=True, bootstrap=60)
    configs = frame.groupby("key").first()
    budget = int(configs["params"].max())
    truth = {k: 1 - _true_err(r["layers"], r["heads"], r["width"]) for k, r in configs.iterrows()}
    best_key = max(truth, key=truth.get)
    assert configs.at[best_key, "params"] < budget  # the optimum is inside: "the largest" would be wrong
    result = answer(model, _candidates(frame), budget)
    picked = [result.best.key, *(r.key for r in result.rivals)]
    assert best_key in picked
    assert result.best.lo <= truth[best_key] <= result.best.hi
    assert result.best.lo < result.best.value < result.best.hi
    assert truth[result.best.key] > np.median(list(truth.values()))  # not a lucky overlap: the pick itself is good
    text = "\n".join(result.lines())
    assert "within the measured range" in text and "predicted, not measured" in text


def test_answer_beyond_the_data_says_how_far_and_refuses_past_the_reach() -> None:
    frame = _synthetic()
    small = frame[frame["params"] <= 40_000]
    model = fit(small, "metric", bootstrap=20)
    top = int(small["params"].max())
    inside = answer(model, _candidates(frame), int(2 * top))
    assert inside.refusal is None and f"{2 * top / top:.1f}x the largest measured configuration" in inside.lines()[0]
    assert inside.best.params > top  # it may pick a configuration larger than any measured
    refused = answer(model, _candidates(frame), int((REACH + 0.5) * top))
    assert refused.best is None and len(refused.lines()) == 1
    assert f"validated to {REACH:g}x" in refused.lines()[0]


def test_one_width_drops_the_terms_the_data_cannot_support() -> None:
    frame = _synthetic(widths=(32,))
    model = fit(frame, "metric", bootstrap=10)
    assert model.terms == ("layers", "heads")
    assert any("width=32" in d for d in model.dropped) and any("mlp=64" in d for d in model.dropped)
    assert "width term dropped" in model.describe()
    few = frame[frame["layers"] <= 1]  # 4 configurations for a law of 7 coefficients
    with pytest.raises(ExplorerError, match="cannot fit"):
        fit(few, "metric", bootstrap=10)


def test_fit_rejects_an_accuracy_above_one() -> None:
    frame = _synthetic().assign(metric=lambda f: f["metric"] + 1)
    with pytest.raises(ExplorerError, match="above 1"):
        fit(frame, "metric", bootstrap=5)


def test_order_held_counts_same_and_equivalent_answers() -> None:
    params = {"a": 10, "b": 20, "c": 30}
    short = {"a": 0.80, "b": 0.90, "c": 0.85}
    same = order_held(short, dict(short), params, [10, 20, 30], margin=0.0)
    assert same.tau == pytest.approx(1.0) and same.held == (True, True, True) and same.share == 1.0
    long = {"a": 0.80, "b": 0.90, "c": 0.95}  # at 30 the long runs prefer c; the short pick b is 5 points behind
    strict = order_held(short, long, params, [10, 20, 30], margin=0.01)
    assert strict.held == (True, True, False) and strict.gaps[-1] == pytest.approx(0.05)
    loose = order_held(short, long, params, [10, 20, 30], margin=0.05)
    assert loose.held == (True, True, True)
    assert 0 < strict.floor < 1 and "held at 2 of 3 budgets" in strict.lines()[1]
    lower = order_held({k: -v for k, v in short.items()}, {k: -v for k, v in long.items()}, params, [30], 0.01,
                       higher_is_better=False)
    assert lower.short_picks == ("b",) and lower.long_picks == ("c",) and lower.held == (False,)


def test_dashboard_draws_the_law_past_the_data_and_its_held_out_check() -> None:
    from explorer.dashboard.extrapolation import extrapolation_figure as _extrapolation_figure

    frame = _synthetic().rename(columns={"key": "arch", "metric": "accuracy"}).assign(state="COMPLETE")
    fig = _extrapolation_figure({"s": frame}, {"s": {"metric": "accuracy"}})
    beyond = [t for t in fig.data if t.name == "s: law's best within budget, beyond the data"]
    assert len(beyond) == 1 and max(beyond[0].x) == pytest.approx(REACH * frame["params"].max())
    assert "held-out check:" in fig.layout.annotations[1].text
    few = frame[(frame["layers"] == 1) & (frame["width"] == 16)]  # 4 configurations for a law of 5 coefficients
    fig = _extrapolation_figure({"s": few}, {"s": {"metric": "accuracy"}})
    assert "no shape law" in fig.layout.annotations[0].text


@pytest.mark.slow
def test_fidelity_runner_trains_each_epoch_count_and_resumes(tmp_path: Path) -> None:
    study = write_study(tmp_path / "s")
    out = tmp_path / "f.csv"
    cmd = [sys.executable, str(ROOT / "bench" / "fidelity.py"), "train", str(study), "--epochs", "1,2", "--seeds", "0",
           "--limit", "1", "--out", str(out)]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    again = subprocess.run([*cmd[:-5], "0-1", *cmd[-4:]], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "2 runs stored, 2 to run" in again.stdout
    table = pd.read_csv(out)
    assert sorted(zip(table["seed"], table["epochs"])) == [(0, 1), (0, 2), (1, 1), (1, 2)]
    assert all(len(c.split(",")) == e for c, e in zip(table["curve"], table["epochs"]))
