"""The noise model, the one posterior, and the answers read off it (issue 26's defects, each with its test)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from explorer import noise, posterior, stats
from explorer.decisions import DecisionSpec, answer, distinct, verdict
from explorer.policy import next_seeds
from explorer.recommend import recommend

OBJECTIVES = [("accuracy", "maximize"), ("params", "minimize")]
DATA = Path(__file__).resolve().parents[1] / "bench" / "data"


def frame(values: np.ndarray, params: list[int] | None = None, layers: list[int] | None = None) -> pd.DataFrame:
    """A trials frame with `values[i, s]` as configuration i's metric at seed s (NaN: not run)."""
    params = params or [1000 * (i + 1) for i in range(len(values))]
    layers = layers or [i + 1 for i in range(len(values))]
    return pd.DataFrame([{"number": i * values.shape[1] + s, "state": "COMPLETE", "arch": f"c{i:02d}", "seed": s,
                          "params": params[i], "accuracy": float(values[i, s]), "layers": layers[i], "heads": 1,
                          "width": 8, "mlp": 8}
                         for i in range(len(values)) for s in range(values.shape[1]) if np.isfinite(values[i, s])])


def table(name: str, seeds: list[int], epochs: int | None = None) -> pd.DataFrame:
    """A shipped table's runs at `seeds`, as a trials frame."""
    t = pd.read_csv(DATA / f"{name}.csv.gz")
    if epochs is not None:
        t = t[t["epochs"] == epochs]
    t = t[t["seed"].isin(seeds)].reset_index(drop=True)
    return pd.DataFrame({"number": range(len(t)), "state": "COMPLETE", "arch": t["key"], "seed": t["seed"],
                         "layers": t["layers"], "heads": t["heads"], "width": t["width"], "mlp": t["mlp"],
                         "params": t["params"], "accuracy": t["metric"]})


# -- the noise model -----------------------------------------------------------------------------------------
def test_the_noise_model_finds_a_level_dependent_variance_and_the_shared_seed_part() -> None:
    """Runs drawn with a logit sd of 0.25 at every level and a shared seed effect: the model recovers both,
    and in accuracy points the sd is larger at 0.7 than at 0.95 (binomial-like)."""
    rng = np.random.default_rng(0)
    level = np.linspace(0.5, 3.0, 40)
    seed_effect = 0.12 * rng.standard_normal(6)
    groups = {f"c{i}": {s: float(1 / (1 + np.exp(-(m + seed_effect[s] + 0.22 * rng.standard_normal())))) for s in range(6)}
              for i, m in enumerate(level)}
    model = noise.fit_noise(groups, True)
    assert model.scale.name == "logit"
    assert np.sqrt(model.prior_var(level.mean())) == pytest.approx(0.25, rel=0.2)
    assert np.sqrt(model.seed_var) == pytest.approx(0.12, abs=0.06)
    sd = {p: float(np.sqrt(model.prior_var(model.scale.latent([p])[0])) * model.scale.slope(p)) for p in (0.7, 0.95)}
    assert sd[0.7] > 2 * sd[0.95]  # in accuracy points
    assert noise.fit_noise({"a": {0: 0.9}, "b": {0: 0.8}}, True) is None  # no replicate: no noise estimate


def test_an_unstable_configuration_keeps_its_own_variance() -> None:
    rng = np.random.default_rng(1)
    groups = {f"c{i}": {s: 0.9 + 0.01 * rng.standard_normal() for s in range(4)} for i in range(12)}
    groups["wild"] = {0: 0.95, 1: 0.80, 2: 0.93, 3: 0.70}
    model = noise.fit_noise(groups, True)
    latent = model.scale.latent(list(groups["wild"].values()))
    var, dof = model.moderated(np.array([latent.mean()]), np.array([4]), np.array([latent.var(ddof=1)]))
    assert var[0] == pytest.approx(latent.var(ddof=1)) and dof[0] == 3


# -- defect 1: zero-width intervals --------------------------------------------------------------------------
def test_equal_paired_differences_never_make_a_zero_width_claim() -> None:
    """Defect 1: the answer said 'c07 beats the baseline: +0.6 ± 0.0 points' from 2 seeds whose paired
    differences happened to be equal (accuracy moves in steps of 1/360), with variances too unlike for a
    shared prior. Every comparison now has the pooled noise model's floor."""
    step = 1 / 360
    values = np.array([[0.5, 0.9], [0.7, 0.72], [0.8, 0.95], [0.85, 0.86], [0.6, 0.9], [0.9, 0.901],
                       [0.9, 0.92], [0.9 + 2 * step, 0.92 + 2 * step]])
    rec = recommend(frame(values, [1000] * 6 + [2000, 2000]), 2000, "c06")
    text = "\n".join(rec.lines())
    assert not re.search(r"± 0\.0 points", text), text
    t = stats.summarize(frame(values), "accuracy", OBJECTIVES, draws=0)
    assert (t["hi"] - t["lo"] > 0.002).all()
    post = t.attrs["posterior"]
    d = post.difference("c07", "c06")
    assert np.quantile(d, 0.975) - np.quantile(d, 0.025) > 0.002


# -- defect 2: absurd intervals ------------------------------------------------------------------------------
def test_accuracy_intervals_stay_inside_0_and_1_and_never_exceed_the_range() -> None:
    """Defect 2: with 2 seeds and per-configuration 1-dof variances the dashboard's headline read '0.885 to
    1.026' and a difference '+0.8 ± 325.4 points'. Posterior draws on the logit scale stay inside [0, 1]."""
    rng = np.random.default_rng(3)
    values = np.clip(0.93 + np.array([0.002, 0.03, 0.004, 0.05] * 6)[:, None] * rng.standard_normal((24, 2)), 0, 1)
    values[0] = [0.95, 0.99]
    t = stats.summarize(frame(values), "accuracy", OBJECTIVES, draws=0)
    assert (t["lo"] >= 0).all() and (t["hi"] <= 1).all()
    rec = recommend(frame(values), 10**6, "c05")
    assert rec.answer.verdict is None or abs(rec.answer.verdict.hi - rec.answer.verdict.lo) < 1.0
    from explorer.dashboard.text import interval_text

    best = t.sort_values("mean").iloc[-1]
    numbers = [float(x) for x in re.findall(r"\d\.\d+", interval_text(best).split("(")[1])]
    assert all(0 <= x <= 1 for x in numbers)


def test_digits_wide_intervals_are_not_per_configuration_two_dof_ones() -> None:
    """Defect 5: on digits-wide Bartlett always rejected, so every interval was the configuration's own on 2
    degrees of freedom: half-widths 6.7 to 60 points. The pooled, level-dependent model moderates them;
    only the few unstable configurations (runs like 0.40, 0.73, 0.73) keep wide intervals of their own."""
    t = stats.summarize(table("digits-wide", [0, 1, 2]), "accuracy", OBJECTIVES, draws=0)
    half = 100 * (t["hi"] - t["lo"]) / 2
    assert half.median() < 3 and (t["hi"] <= 1).all()
    wide = t[half > 10]
    assert len(wide) <= 0.05 * len(t)
    assert all(max(v) - min(v) > 0.1 for v in wide["values"])


def test_noisy_configurations_off_the_surface_keep_their_coverage() -> None:
    """bench/coverage.py found the posterior's intervals holding the true mean of digits-wide's noisiest
    tenth in 79% of simulated studies (one configuration 12%): a noisy configuration was pulled onto the
    surface, and noisy ones sit further off it. Here 24 configurations on a smooth surface (sd 1 point)
    and four noisy ones 4 points below it (sd 5 points, one 12): their intervals, now pulled at most
    halfway (an unstable one not at all), hold the true means in most of 40 simulated studies of 3 seeds
    (their coverage under this model, a pull of 4 points against noise of 2.9 on a 3-seed mean, is below 95%:
    the test is that it is no longer a quarter)."""
    rng = np.random.default_rng(11)
    layers, heads = np.meshgrid([1, 2, 3, 4, 6, 8], [1, 2, 4, 8], indexing="ij")
    layers, heads = layers.ravel(), heads.ravel()
    truth = 0.90 + 0.01 * np.log(layers) + 0.005 * np.log(heads)
    sd = np.full(len(truth), 0.01)
    noisy = np.array([3, 10, 15, 20])
    truth[noisy] -= 0.04
    sd[noisy] = [0.05, 0.05, 0.05, 0.12]
    hits = np.zeros(len(truth))
    for _ in range(40):
        values = np.clip(truth[:, None] + sd[:, None] * rng.standard_normal((len(truth), 3)), 0, 1)
        f = frame(values, layers=list(layers)).assign(heads=lambda d: heads[d["arch"].str[1:].astype(int)])
        t = stats.summarize(f, "accuracy", OBJECTIVES, draws=0).set_index("arch").loc[[f"c{i:02d}" for i in range(len(truth))]]
        hits += (t["lo"].to_numpy() <= truth) & (truth <= t["hi"].to_numpy())
    assert hits[noisy].mean() / 40 >= 0.7 and hits.mean() / 40 >= 0.9  # 0.80 and 0.95 measured; before, 0.24


def test_one_seed_per_configuration_has_no_interval_and_says_what_would_give_one() -> None:
    values = np.array([[0.9], [0.8], [0.85]])
    t = stats.summarize(frame(values), "accuracy", OBJECTIVES)
    assert t["lo"].isna().all() and t["front_prob"].isna().all()
    text = "\n".join(recommend(frame(values), 10**6, None).lines())
    assert "no interval" in text and "second seed" in text and "undecided" in text


# -- defect 3: one answer ------------------------------------------------------------------------------------
def test_every_statement_of_the_answer_is_about_the_pick() -> None:
    """Defect 3: the pick was c03 while the decided sentence was 'c02 is the smallest configuration not worse
    than the baseline': two answers. Now the lines speak of the configuration to use, and its verdict."""
    base = [0.90, 0.91, 0.92, 0.90, 0.91, 0.92]
    values = np.array([[v - 0.1 for v in base], [v + 0.008 for v in base], [v + 0.010 for v in base],
                       [v + 0.05 for v in base], base])
    rec = recommend(frame(values, [100, 200, 200, 400, 300]), 400, "c04")
    lines = rec.lines()
    assert rec.key == "c03" and lines[0].startswith("budget 400: use c03: within")
    assert not any("smallest configuration not worse" in line for line in lines)
    assert "c03 beats the baseline c04" in "\n".join(lines)


# -- defect 4: budgets past the space ------------------------------------------------------------------------
def test_a_budget_past_the_space_gets_one_answer_from_the_one_posterior() -> None:
    """Defect 4, then issue 33: at 300k on the default space (every configuration measured, the largest 203k)
    recommend first repeated the 250k answer, then gave two answers from two models (the posterior's "use
    6 / 2", then the shape law's "predicted best 7 / 8" with an 11-point interval). Now the splits past the
    declared ranges (more layers, the space's constraints kept) are candidates of the same posterior:
    one "use" line, and a predicted split's interval is twice as wide as a typical measured one's (never sure
    of what no run measured)."""
    from explorer.space import load_space, widened

    space = load_space(Path(__file__).resolve().parents[1] / "spaces" / "vit-digits.yaml")
    trials = table("digits-vit", [0, 1, 2])
    inside = [(c.key, c.dims, c.params) for c in space.configs()]
    wider = [(c.key, c.dims, c.params) for c in widened(space, 300_000)]
    assert wider and all(c[1]["layers"] > 6 and c[2] <= 300_000 for c in wider)
    rec = recommend(trials, 300_000, "layers=6,heads=2", candidates=inside, outside=wider)
    lines = rec.lines()
    assert sum(" use " in line for line in lines) == 1 and lines[0].startswith("budget 300.0k: use ")
    assert not any("predicted best" in line or "shape law" in line for line in lines)
    post = stats.summarize(trials, "accuracy", OBJECTIVES, draws=0, candidates=inside + wider).attrs["posterior"]
    lo, hi = post.interval()
    measured = post.n > 0
    assert min((hi - lo)[~measured]) > 2 * np.median((hi - lo)[measured])  # twice as wide as the typical measured one
    if rec.outside is None:  # the best measured, and the splits past the space that could still be better
        assert rec.kind == "measured" and (not rec.past or "splits past the space" in "\n".join(lines))
    else:
        assert "past the space's declared ranges" in "\n".join(lines)


# -- defect 5: the statistics behind "undecided" --------------------------------------------------------------
def test_the_pick_minimises_the_bound_not_the_raw_mean() -> None:
    """Defect 5: the pick was the best raw mean, the best of many (1.2 points of regret on digits-wide). One lucky
    seed of a configuration whose neighbours are all lower is shrunk towards them; where its bound is still the
    smallest it is no decision on one seed (issue 41), and more seeds at its neighbours' level end it."""
    rng = np.random.default_rng(5)
    values = 0.92 + 0.012 * rng.standard_normal((12, 6))
    values[3, 1:] = np.nan
    values[3, 0] = 0.965  # one seed, 4 points above everything around it
    t = stats.summarize(frame(values), "accuracy", OBJECTIVES, draws=0)
    post = t.attrs["posterior"]
    said = answer(post, 10**6, None, 0.01)
    assert t.set_index("arch").loc["c03", "mean"] < 0.955 and not said.decided
    assert said.pick != "c03" or said.advice.get("c03", 0) >= 1
    values[3, 1:3] = 0.918, 0.915  # two more seeds at its neighbours' level
    again = answer(stats.summarize(frame(values), "accuracy", OBJECTIVES, draws=0).attrs["posterior"], 10**6, None, 0.01)
    assert again.pick != "c03"


def test_verdicts_read_the_two_sided_interval_for_direction_and_the_90_percent_one_for_equivalence() -> None:
    """Defect 5: TOST at a 95% interval (too strict) and one-sided 5% claims of a direction chosen after seeing
    the data (a pick equal to the baseline was said to beat it or lose to it in 10% of studies)."""
    rng = np.random.default_rng(6)
    values = 0.93 + 0.004 * rng.standard_normal((10, 6))
    post = stats.summarize(frame(values), "accuracy", OBJECTIVES, draws=0).attrs["posterior"]
    d = post.difference("c01", "c02")
    v = verdict(post, "c01", "c02", 0.01)
    assert v.lo == pytest.approx(np.quantile(d, 0.025)) and v.hi == pytest.approx(np.quantile(d, 0.975))
    lo90, hi90 = np.quantile(d, [0.05, 0.95])
    assert v.kind == ("equivalent" if -0.01 < lo90 and hi90 < 0.01 else v.kind)
    assert v.kind != "beats" or v.lo > 0


def test_budgets_holding_the_same_configurations_are_one_question() -> None:
    """Defect 5: 4 of the default study's 10 budgets hold the same candidates and were counted as 4 questions."""
    values = 0.9 + 0.01 * np.random.default_rng(7).standard_normal((6, 2))
    post = stats.summarize(frame(values, [100, 100, 200, 200, 300, 300]), "accuracy", OBJECTIVES, draws=0).attrs["posterior"]
    groups = distinct(post, [100, 150, 199, 250, 300, 301])
    assert list(groups.values()) == [[100, 150, 199], [250], [300, 301]]


def test_the_decide_policy_spends_seeds_where_the_bound_shrinks() -> None:
    """Two near-tied best configurations and far worse ones: the next seeds go to the top pair; none at a margin
    every seed up to the cap could not reach (futile, issue 42), nor at one already met."""
    rng = np.random.default_rng(8)
    means = np.array([0.70, 0.72, 0.75, 0.78, 0.80, 0.82, 0.94, 0.945])
    values = means[:, None] + 0.012 * rng.standard_normal((8, 3))
    post = stats.summarize(frame(values), "accuracy", OBJECTIVES, draws=0).attrs["posterior"]
    room = {k: 3 for k in post.keys}
    assert 0.007 < post.regret(post.keys, 0.95).eps < 0.01
    chosen = next_seeds(post, [10**6], 0.007, 0.95, room)
    assert chosen and set(chosen) <= {"c06", "c07"}
    assert next_seeds(post, [10**6], 0.002, 0.95, room) == []  # 0.2 points: not even 6 seeds each would decide it
    assert next_seeds(post, [10**6], 0.5, 0.95, room) == []  # decided at a 50-point margin: no seed


def test_a_claim_against_a_baseline_with_fewer_seeds_than_the_pick_gives_the_baseline_seeds() -> None:
    """bench/decide.py's fidelity table: picks at six seeds were said non-inferior to a noisy baseline measured
    at one or two, falsely (2 of 40 studies at a 1-point margin). The decide policy gives the baseline seeds while a verdict
    claims something against it for a pick with more seeds than it has, and stops once it has caught up."""
    rng = np.random.default_rng(9)
    means = np.array([0.70, 0.74, 0.78, 0.82, 0.86, 0.90, 0.92, 0.94])
    values = means[:, None] + 0.005 * rng.standard_normal((8, 6))
    thin = values.copy()
    thin[6, 1:] = np.nan  # the baseline, c06, at one seed

    def policy(v: np.ndarray, baseline: str | None) -> list[str]:
        post = stats.summarize(frame(v), "accuracy", OBJECTIVES, draws=0).attrs["posterior"]
        room = {k: 6 - int(n) for k, n in zip(post.keys, post.n)}
        assert post.regret(post.keys, 0.95).pick == "c07"
        assert verdict(post, "c07", "c06", 0.05).kind in ("beats", "equivalent", "non-inferior")
        return next_seeds(post, [10**6], 0.05, 0.95, room, baseline=baseline)

    assert policy(thin, None) == []  # decided at a 5-point margin: before, no seed at all
    assert policy(thin, "c06") == ["c06"]
    assert policy(values, "c06") == []  # caught up: six seeds each


def test_status_says_what_would_decide_a_budget_after_the_policy_spent_its_seeds() -> None:
    """The default study ends with 138k-203k undecided and its top configurations at the 6-seed cap: status's
    "more seeds would go to" was empty there (the advice was limited to the cap), while recommend said
    about 20 more seeds of which configurations would decide it. Both now give that advice, said as what
    raising the cap would buy (issue 35: never as seeds the study would run past its cap)."""
    from types import SimpleNamespace

    from explorer.study.read import Reads

    rng = np.random.default_rng(8)
    means = np.array([0.70, 0.72, 0.75, 0.78, 0.80, 0.82, 0.94, 0.945])
    values = means[:, None] + 0.012 * rng.standard_normal((8, 3))
    summary = stats.summarize(frame(values), "accuracy", OBJECTIVES, draws=0)
    study = SimpleNamespace(space=SimpleNamespace(baseline=None), seeds=[0, 1, 2], seed_cap=3, task=SimpleNamespace(higher_is_better=True),
                            spec=SimpleNamespace(decision=DecisionSpec(delta=0.002)), budgets=lambda: [10**6])
    (at, said), = Reads(study).answers(summary)  # every configuration already at the study's 3 seeds
    assert not said.decided and said.advice and set(said.advice) <= set(summary["arch"]) and said.past_cap
    assert any("seeds below the study's cap of 3 per configuration cannot decide it" in line and "raised" in line
               for line in said.words())


# -- the smooth model and its check --------------------------------------------------------------------------
def test_the_smooth_model_falls_back_where_held_out_seeds_miss_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """24 configurations alternating 35 points apart along their depth. The fitted surface follows them (a
    large deviation `tau`); a surface forced flat (as a misfit would be) is caught by the held-out seeds,
    and the posterior is per configuration, saying why."""
    from explorer import gp

    rng = np.random.default_rng(9)
    means = np.where(np.arange(24) % 2 == 0, 0.6, 0.95)
    values = means[:, None] + 0.004 * rng.standard_normal((24, 4))
    fitted = stats.summarize(frame(values), "accuracy", OBJECTIVES, draws=0).attrs["posterior"]
    assert fitted.model == "smooth" and fitted.check.passed
    monkeypatch.setattr(gp, "fit", lambda rows, y, noise, warm=None: (gp.Hyper(0.01, (100.0,), 0.001), gp.Mean(4.0, np.zeros(0))))
    post = stats.summarize(frame(values), "accuracy", OBJECTIVES, draws=0).attrs["posterior"]
    assert post.model == "per-configuration" and "fits badly" in post.note
    smooth = stats.summarize(frame(0.9 + 0.01 * np.log(np.arange(1, 13))[:, None]
                                   + 0.01 * rng.standard_normal((12, 4))), "accuracy", OBJECTIVES, draws=0)
    assert smooth.attrs["posterior"].model == "smooth"


def test_intervals_cover_in_simulated_studies_of_digits_vit() -> None:
    """Fresh runs from digits-vit's means and seed sds (3 seeds): the 95% intervals hold the true means in
    most configurations (bench/coverage.py measures it at 200 studies per case)."""
    t = pd.read_csv(DATA / "digits-vit.csv.gz")
    truth = t.groupby("key")["metric"].agg(["mean", "std"])
    dims = t.groupby("key")[["layers", "heads", "params"]].first()
    rng = np.random.default_rng(10)
    hits = []
    for _ in range(8):
        rows = [{"number": 0, "state": "COMPLETE", "arch": k, "seed": s, "layers": dims.loc[k, "layers"],
                 "heads": dims.loc[k, "heads"], "params": dims.loc[k, "params"],
                 "accuracy": float(np.clip(truth.loc[k, "mean"] + truth.loc[k, "std"] * rng.standard_normal(), 0, 1))}
                for k in truth.index for s in range(3)]
        s = stats.summarize(pd.DataFrame(rows), "accuracy", OBJECTIVES, draws=0).set_index("arch").loc[truth.index]
        hits.append(((s["lo"] <= truth["mean"]) & (truth["mean"] <= s["hi"])).mean())
    assert np.mean(hits) >= 0.85


# -- the table ----------------------------------------------------------------------------------------------
def test_decision_spec_budgets_and_the_default_margin() -> None:
    spec = DecisionSpec()
    at = spec.budget_list([1000, 5000, 100000])
    assert len(at) == 10 and at[0] == 1000 and at[-1] == 100000
    assert DecisionSpec(budgets=["50k", "baseline"]).budget_list([1], 80000) == [50000, 80000]
    assert spec.margin(True, 0.9) == 0.01 and spec.margin(False, 2.0) == pytest.approx(0.02)


def test_tied_with_names_only_a_front_member_that_dominates() -> None:
    values = np.array([[0.93, 0.98, 0.935], [0.96, 0.97, 0.98], [0.95, 0.975, 0.96]])  # c02 off the front
    t = stats.summarize(frame(values, [100, 200, 300]), "accuracy", OBJECTIVES, draws=0).set_index("arch")
    assert not t.loc["c02", "on_front"] and t.loc["c02", "tied_with"] == "c01"  # not c00, cheaper but worse


def test_trials_without_a_seed_read_as_the_first_seed() -> None:
    df = frame(np.array([[0.9], [0.8]])).assign(seed=[np.nan, 3])
    t = stats.summarize(df, "accuracy", OBJECTIVES, draws=0, first_seed=3)
    assert list(t["seeds"]) == [[3], [3]]


def test_the_posterior_is_one_object_shared_by_every_reader() -> None:
    values = 0.9 + 0.01 * np.random.default_rng(11).standard_normal((8, 3))
    t = stats.summarize(frame(values), "accuracy", OBJECTIVES, draws=0)
    post = t.attrs["posterior"]
    assert isinstance(post, posterior.Posterior) and t.sort_values("mean").attrs["posterior"] is post
    i = post.index["c00"]
    assert t.set_index("arch").loc["c00", "mean"] == pytest.approx(post.mean[i])


def test_a_summary_row_holds_its_own_runs_and_its_first_run_s_dimensions() -> None:
    """Each configuration's seeds, values and other objectives come from its own runs (a repeated
    (configuration, seed): its first run), its dimensions from its first stored run (a missing one stays missing)."""
    three = [("time", "minimize"), *OBJECTIVES]
    df = pd.DataFrame([
        {"number": 0, "state": "COMPLETE", "arch": "b", "seed": 1, "params": 20, "accuracy": 0.7, "time": 4.0, "layers": 2},
        {"number": 1, "state": "COMPLETE", "arch": "a", "seed": 0, "params": 10, "accuracy": 0.6, "time": 1.0, "layers": pd.NA},
        {"number": 2, "state": "COMPLETE", "arch": "b", "seed": 0, "params": 20, "accuracy": 0.9, "time": 2.0, "layers": 2},
        {"number": 3, "state": "FAIL", "arch": "a", "seed": 1, "params": 10, "accuracy": np.nan, "time": 9.0, "layers": pd.NA},
        {"number": 4, "state": "COMPLETE", "arch": "a", "seed": 0, "params": 10, "accuracy": 0.5, "time": 3.0, "layers": pd.NA},
    ]).astype({"layers": "Int64"})
    t = stats.summarize(df, "accuracy", three, draws=0).set_index("arch")
    assert t.loc["b", "seeds"] == [0, 1] and t.loc["b", "values"] == [0.9, 0.7] and t.loc["b", "n"] == 2
    assert t.loc["b", "time"] == pytest.approx(3.0) and t.loc["b", "layers"] == 2
    assert t.loc["a", "seeds"] == [0] and t.loc["a", "time"] == pytest.approx(1.0) and pd.isna(t.loc["a", "layers"])
    assert t.loc["a", "values"] == [0.6]  # trial 4 repeats trial 1's seed


def test_the_evidence_is_the_likelihood_the_fit_maximises_and_its_gradient_is_the_likelihood_s() -> None:
    """`evidence` skips the gradient (and the inverse it needs): the same value as the fit's objective,
    whose analytic gradient matches central differences."""
    from explorer import gp

    rng = np.random.default_rng(3)
    x = rng.normal(size=(30, 2))
    rows, y, noise_cov = gp.Rows.of(x), rng.normal(size=30), np.diag(rng.uniform(0.05, 0.2, 30))
    hyper, mean = gp.fit(rows, y, noise_cov)
    args = (gp._sq(x, x), y - y.mean(), noise_cov, mean.cov(rows, rows), rows.same)
    value, grad = gp._nll(hyper.theta(), *args)
    assert gp.evidence(hyper, mean, rows, y, noise_cov) == -value
    theta = np.log([0.7, 0.9, 1.3, 0.2])
    _, grad = gp._nll(theta, *args)
    step = 1e-6
    numeric = [(gp._nll(theta + step * e, *args)[0] - gp._nll(theta - step * e, *args)[0]) / (2 * step) for e in np.eye(4)]
    assert grad == pytest.approx(numeric, rel=1e-4, abs=1e-6)
