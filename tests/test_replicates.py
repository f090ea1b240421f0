"""Replicate seeds: the statistics against scipy, paired data order, resume, and adaptive replicates."""

from __future__ import annotations

import signal
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import pytest
from typer.testing import CliRunner

from conftest import write_study
from explorer import stats
from explorer.cli import app
from explorer.errors import ExplorerError
from explorer.executors.local import LocalExecutor
from explorer.pareto import pareto_mask
from explorer.recommend import recommend
from explorer.decisions import DecisionSpec
from explorer.replicates import ReplicateSpec, replay, seeds_by_rank
from explorer.study import load_study_spec
from explorer.tasks import get_task
from test_reliability import COMPLETE, QUICK, WIDE_SPACE, await_condition, worker

OBJECTIVES = [("accuracy", "maximize"), ("params", "minimize")]


# -- per-configuration statistics -------------------------------------------------------------------------
def synthetic_frame(table: dict[str, dict[int, float]], params: dict[str, int]) -> pd.DataFrame:
    rows = [{"number": i, "state": "COMPLETE", "arch": k, "seed": s, "params": params[k], "accuracy": v,
             "layers": 1, "heads": 1, "width": 8, "mlp": 8}
            for i, (k, s, v) in enumerate((k, s, v) for k, by in table.items() for s, v in by.items())]
    return pd.DataFrame(rows)


def test_summary_front_probability_and_ties() -> None:
    params = {"small": 100, "mid": 200, "twin": 200, "big": 300, "bad": 250}
    table = {"small": {0: 0.80, 1: 0.81, 2: 0.79}, "mid": {0: 0.90, 1: 0.91, 2: 0.89},
             "twin": {0: 0.899, 1: 0.911, 2: 0.889},  # as good as `mid` at the same size: a coin flip
             "big": {0: 0.95, 1: 0.96, 2: 0.94}, "bad": {0: 0.60, 1: 0.61, 2: 0.59}}
    s = stats.summarize(synthetic_frame(table, params), "accuracy", OBJECTIVES).set_index("arch")
    assert list(s.loc[["small", "mid", "big", "bad"], "n"]) == [3, 3, 3, 3]
    assert s.loc["small", "front_prob"] > 0.99 and s.loc["big", "front_prob"] > 0.99 and s.loc["bad", "front_prob"] < 0.01
    assert 0.2 < s.loc["mid", "front_prob"] < 0.8 and 0.2 < s.loc["twin", "front_prob"] < 0.8
    assert s.loc["twin", "tied_with"] == "mid" and not s.loc["twin", "on_front"]  # marked, not hidden
    assert pd.isna(s.loc["bad", "tied_with"])
    assert s.loc["mid", "lo"] < s.loc["mid", "mean"] < s.loc["mid", "hi"]


def test_front_probability_of_two_objectives_is_the_general_one() -> None:
    """The all-draws-at-once path (two objectives) equals the per-draw Pareto path (three, one constant)."""
    rng = np.random.default_rng(1)
    keys = [f"k{i}" for i in range(12)]
    params = dict(zip(keys, rng.choice([1, 2, 3, 5, 8], 12).tolist()))
    table = {k: {s: float(0.85 + 0.01 * i + 0.015 * rng.standard_normal()) for s in range(3)} for i, k in enumerate(keys)}
    df = synthetic_frame(table, params).assign(z=0.0)
    two = stats.summarize(df, "accuracy", OBJECTIVES)
    three = stats.summarize(df, "accuracy", [*OBJECTIVES, ("z", "minimize")])
    assert ((two["front_prob"] > 0) & (two["front_prob"] < 1)).sum() >= 3  # uncertain memberships: the draws matter
    assert np.array_equal(two["front_prob"].to_numpy(), three["front_prob"].to_numpy())


def test_a_one_seed_summary_has_no_interval() -> None:
    s = stats.summarize(synthetic_frame({"a": {0: 0.9}, "b": {0: 0.8}}, {"a": 1, "b": 2}), "accuracy", OBJECTIVES)
    assert s["lo"].isna().all() and s["front_prob"].isna().all() and list(s["on_front"]) == [True, False]


def test_recommend_reports_ties_the_smallest_and_the_baseline() -> None:
    params = {"small": 100, "mid": 200, "big": 300, "base": 300}
    table = {"small": {0: 0.80, 1: 0.81, 2: 0.79}, "mid": {0: 0.944, 1: 0.955, 2: 0.941},
             "big": {0: 0.95, 1: 0.953, 2: 0.945}, "base": {0: 0.90, 1: 0.91, 2: 0.89}}
    rec = recommend(synthetic_frame(table, params), 300, "base")
    assert rec.key == "big" and rec.n == 3 and rec.tied == ("mid",)
    assert rec.answer.verdict.kind == "beats" and rec.answer.verdict.lo > 0
    text = "\n".join(rec.lines(explain=True))  # the ties are among the details
    assert "the smallest: mid, 200 params" in text and "big beats the baseline base: +" in text
    same = recommend(synthetic_frame(table, {**params, "mid": 300}), 300, "base")
    assert same.tied == ("mid",) and "none of them is smaller" in "\n".join(same.lines(explain=True))


# -- replicates in a real study -----------------------------------------------------------------------------
def test_replicate_seed_sets_one_data_order_across_configurations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Replicate s of every configuration sees the same batches (common random numbers); seeds differ."""
    task = get_task("digits", {})
    first = {s: next(iter(task.load(64, s).train))[1] for s in (0, 1)}
    assert not (first[0] == first[1]).all()
    seen: list[tuple[int, object]] = []
    load = type(task).load

    def recording(self, batch_size: int, seed: int):
        data = load(self, batch_size, seed)
        seen.append((seed, next(iter(data.train))[1].tolist()))
        return data

    monkeypatch.setattr(type(task), "load", recording)
    path = write_study(tmp_path, budget={**QUICK, "seeds": 2}, replicates={"policy": "fixed"})
    study = load_study_spec(path)
    ostudy = study.open()
    LocalExecutor().run(study, ostudy)
    done = {(t.params["arch"], t.user_attrs["seed"]) for t in ostudy.get_trials(states=(COMPLETE,))}
    assert done == {(k, s) for k in study.keys for s in (0, 1)} and len(seen) == 12
    for s in (0, 1):
        orders = [order for seed, order in seen if seed == s]
        assert len(orders) == 6 and all(o == orders[0] for o in orders) and orders[0] == first[s].tolist()
    assert study.reads.finished(ostudy) == 12 and study.queue.remaining(ostudy) == 0
    assert study.reads.replicate_cost(ostudy) == (12, 12)
    shown = CliRunner().invoke(app, ["status", str(path)], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert "6/6 configurations measured, 12 runs" in shown.output
    assert "replicates (fixed), seeds [0, 1]: 12 runs of the 12 that every measured configuration at 2 seeds would take (100%)" in " ".join(
        shown.output.split())  # prose wraps at the console's width
    assert "Pareto front of posterior means" in shown.output and "P(front)" in shown.output
    assert shown.output.startswith("Answers at the study's budgets")  # status leads with the answer at each budget


@pytest.mark.slow
def test_a_study_killed_among_its_replicates_resumes_with_nothing_lost_or_repeated(tmp_path: Path) -> None:
    path = write_study(tmp_path, budget={**QUICK, "max_steps": 30, "seeds": 3}, replicates={"policy": "fixed"})
    study = load_study_spec(path)

    def replicates_done() -> int:
        try:
            return sum(bool(t.user_attrs.get("replicate")) for t in study.read().get_trials(states=(COMPLETE,)))
        except ExplorerError:  # the worker has not created the storage or the study yet
            return 0

    proc = worker(path)
    await_condition(lambda: replicates_done() >= 2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = {t.number: (t.params["arch"], t.user_attrs["seed"], t.values) for t in study.read().get_trials(states=(COMPLETE,))}
    assert 0 < len(before) < 18
    proc = worker(path, "resume")
    assert proc.wait(timeout=300) == 0, proc.stdout.read()
    after = study.read().get_trials(states=(COMPLETE,))
    measured = [(t.params["arch"], t.user_attrs["seed"]) for t in after if "duplicate_of" not in t.user_attrs]
    assert sorted(measured) == sorted((k, s) for k in study.keys for s in (0, 1, 2))  # each once: none lost, none twice
    now = {t.number: (t.params["arch"], t.user_attrs["seed"], t.values) for t in after}
    assert all(now[n] == v for n, v in before.items())


def true_accuracy(dims: dict) -> float:
    """A known surface: more heads help, depth helps up to 3 layers, then hurts."""
    layers, heads = dims["layers"], dims["heads"]
    return 0.90 + 0.02 * np.log2(heads) + 0.015 * min(layers, 3) - 0.015 * max(layers - 3, 0)


@pytest.mark.slow
def test_adaptive_replicates_recover_the_true_front_where_one_seed_does_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """12 configurations with a known accuracy surface and noise of sd 1.5 points per run, through the real
    study, SQLite storage and local executor (only the training is replaced by the surface plus noise
    drawn from (repetition, seed, configuration)). Over 20 repetitions the front of means after adaptive
    replicates (up to 6 seeds, confidence 0.95) is the true front in most; the front of the first seed
    alone (what a one-seed study would measure) in few."""
    noise_sd, reps = 0.015, 20
    rep = {"i": 0}

    def synthetic(self, cfg, lineage, on_epoch=None, device=None, checkpoint_dir=None, seed=None, shared=False, epochs=None):
        rng = np.random.default_rng([rep["i"], seed, cfg.dims["layers"], cfg.dims["heads"]])
        value = true_accuracy(cfg.dims) + noise_sd * rng.standard_normal()
        return {"config": cfg.dims, "layers": cfg.dims["layers"], "heads": cfg.dims["heads"], "params": cfg.params,
                "seed": seed, "accuracy": value, "curve": [value]}

    monkeypatch.setattr("explorer.study.evaluate.Evaluator.evaluate", synthetic)
    recovered = {"one seed": 0, "adaptive": 0}
    spent = []
    for rep["i"] in range(reps):
        path = write_study(tmp_path / str(rep["i"]), space_doc=WIDE_SPACE, n_trials=12, budget={**QUICK, "seeds": 6},
                           replicates={"policy": "adaptive", "confidence": 0.95}, objectives=["maximize accuracy", "minimize params"])
        study = load_study_spec(path)
        ostudy = study.open()
        LocalExecutor().run(study, ostudy)
        summary = study.reads.summary(ostudy, draws=0)
        truth = pareto_mask(np.column_stack([[true_accuracy(c) for c in summary[["layers", "heads"]].to_dict("records")],
                                             summary["params"]]), ["maximize", "minimize"])
        first = np.array([values[0] for values in summary["values"]])  # every configuration's first seed
        one_seed = pareto_mask(np.column_stack([first, summary["params"]]), ["maximize", "minimize"])
        recovered["adaptive"] += bool((summary["on_front"].to_numpy() == truth).all())
        recovered["one seed"] += bool((one_seed == truth).all())
        runs, at_max = study.reads.replicate_cost(ostudy)
        spent.append(runs / at_max)
    print(f"true front recovered in {reps} repetitions: adaptive {recovered['adaptive']}, one seed {recovered['one seed']}; "
          f"adaptive compute {np.mean(spent):.2f} of 6 seeds everywhere")
    # measured 17 and 4 of 20 (the per-configuration intervals before issue 26: 15 or more; the posterior
    # pulling noisy configurations all the way onto the surface: 14)
    assert recovered["adaptive"] >= 15 and recovered["one seed"] <= reps // 2, recovered
    assert np.mean(spent) < 0.7, spent  # well short of every configuration at 6 seeds


def test_replay_spends_seeds_only_where_the_front_is_uncertain() -> None:
    params = {"a": 1, "b": 2, "c": 3, "far": 3}
    tables = {"a": {s: 0.5 + 0.01 * (s % 2) for s in range(4)}, "b": {s: 0.7 + 0.01 * (s % 2) for s in range(4)},
              "c": {s: 0.705 - 0.01 * (s % 2) for s in range(4)}, "far": {s: 0.1 for s in range(4)}}
    got = replay(tables, params, [0, 1, 2, 3], ReplicateSpec(policy="adaptive"), draws=500)
    assert got["far"] == [0] and len(got["c"]) == 4 and len(got["b"]) >= 2  # b vs c is close: c is resolved no sooner than the maximum
    assert replay(tables, params, [0, 1], ReplicateSpec(policy="fixed")) == {k: [0, 1] for k in tables}


def vit_table() -> tuple[dict[str, dict[int, float]], dict[str, int], dict[str, float]]:
    frame = pd.read_csv(Path(__file__).resolve().parents[1] / "bench" / "data" / "digits-vit.csv.gz")
    tables = {k: dict(zip(g["seed"], g["metric"])) for k, g in frame.groupby("key")}
    return tables, frame.groupby("key")["params"].first().to_dict(), frame.groupby("key")["metric"].mean().to_dict()


def test_adaptive_replicates_do_not_starve_the_best() -> None:
    """Defect 1: replayed on digits-vit (seeds 0-2, confidence 0.8), the three configurations with the best
    true means got 1.0 seeds on average and the rest 1.8: same-cost siblings split the front probability,
    so each fell below 1 - confidence after one seed. Settled now only when a cheaper one beats it. (Since
    the posterior stopped pulling noisy configurations onto the surface, their wider intervals draw seeds
    too: on seeds 0-2 the best three get 2.33 on average and the rest 2.43; starving is the best at 1.)"""
    tables, params, truth = vit_table()
    for seeds in ([0, 1, 2], [3, 4, 5]):
        got = replay(tables, params, seeds, ReplicateSpec(policy="adaptive", confidence=0.8), draws=500)
        best, rest = seeds_by_rank(got, truth)
        assert best >= min(rest, 2.0), (seeds, best, rest)


def test_decide_spends_seeds_on_undecided_questions_only() -> None:
    """b and c are near-tied at the largest budget: not even every seed up to the cap would tell them apart
    within 0.1 point, so they get no seeds past the first rounds (futile buying stops, issue 42); far is clearly
    worse and never gets a second seed. Twelve other configurations rank above far, so the first rounds that
    bring the noise estimate to decisions.MIN_NOISE_DOF degrees of freedom reach it without far."""
    params = {"a": 1, "b": 2, "c": 3, "far": 3, **{f"m{i:02d}": 1 + i % 3 for i in range(12)}}
    tables = {"a": {s: 0.5 + 0.01 * (s % 2) for s in range(4)}, "b": {s: 0.7 + 0.01 * (s % 2) for s in range(4)},
              "c": {s: 0.705 - 0.01 * (s % 2) for s in range(4)}, "far": {s: 0.1 + 0.01 * (s % 3) for s in range(4)},
              **{f"m{i:02d}": {s: 0.55 + 0.008 * i + 0.01 * ((s + i) % 2) for s in range(4)} for i in range(12)}}
    got = replay(tables, params, [0, 1, 2, 3], ReplicateSpec(policy="decide"), budgets=[1, 2, 3],
                 decision=DecisionSpec(delta=0.001))
    assert len(got["c"]) < 4 and len(got["b"]) < 4 and got["far"] == [0]  # b vs c cannot be decided: not bought to the cap
    capped = replay(tables, params, [0, 1, 2, 3], ReplicateSpec(policy="decide"), budgets=[3],
                    decision=DecisionSpec(delta=0.001, max_seeds=2))
    assert max(map(len, capped.values())) == 2


def synthetic_evaluate(pause: float):
    """Study.evaluate replaced by the known surface plus seeded noise, taking `pause` seconds."""
    import time

    def evaluate(self, cfg, lineage, on_epoch=None, device=None, checkpoint_dir=None, seed=None, shared=False, epochs=None):
        time.sleep(pause)
        value = true_accuracy(cfg.dims) + 0.01 * np.random.default_rng([seed, cfg.dims["layers"], cfg.dims["heads"]]).standard_normal()
        return {"config": cfg.dims, "layers": cfg.dims["layers"], "heads": cfg.dims["heads"], "params": cfg.params,
                "seed": seed, "accuracy": value, "curve": [value]}
    return evaluate


@pytest.mark.parametrize("sampler, n_trials, seeds", [("grid", 12, 2), ("grid", 11, 1), ("budget-ei", 5, 2)])
def test_trials_in_threads_start_only_what_is_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sampler: str, n_trials: int,
                                                   seeds: int) -> None:
    """Two threads whose trials end together (same length) never both take the last unstarted trial, and
    never sample at the same moment: no configuration past n_trials, every replicate once, nothing
    answered from storage."""
    monkeypatch.setattr("explorer.study.evaluate.Evaluator.evaluate", synthetic_evaluate(0.05))
    path = write_study(tmp_path, space_doc=WIDE_SPACE, n_trials=n_trials, budget={**QUICK, "seeds": seeds},
                       replicates={"policy": "fixed"}, sampler={"name": sampler, "seed": 0},
                       executor={"name": "local", "cpu": 1, "n_jobs": 2})
    study = load_study_spec(path)
    ostudy = study.open()
    LocalExecutor().run(study, ostudy)
    finished = [t for t in ostudy.get_trials() if t.state != optuna.trial.TrialState.WAITING]  # a grid past n_trials keeps the rest queued
    assert all(t.state == COMPLETE for t in finished)
    trials = [t for t in finished if "duplicate_of" not in t.user_attrs]
    assert trials == finished
    keys = {t.params["arch"] for t in trials}
    assert len(keys) == n_trials
    assert sorted((t.params["arch"], t.user_attrs.get("seed", 0)) for t in trials) == sorted((k, s) for k in keys for s in range(seeds))
