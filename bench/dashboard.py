"""Render time and HTML size of explorer's dashboard vs optuna's plot_pareto_front, same 10k-trial study.

    .venv/bin/python bench/dashboard.py [--trials 10000]

Both read the same real SQLite storage (load: optuna's `get_trials`, the same for both); render
(best of --repeat) is figures + HTML written, with plotly.js embedded once in each file.
explorer's HTML holds six figures, the configuration table and the full trial table, optuna's the front alone.

The study is written by `study.add_trials` for its first 100 trials and, since that costs ~30-50 ms
a trial (one query per user attr), by one bulk transaction into optuna's own tables for the rest;
a sample of the bulk rows is checked to load back as the very trials `add_trials` was given.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from datetime import timezone
from pathlib import Path

import numpy as np
import optuna
from optuna.distributions import distribution_to_json
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import func, insert, select

from explorer.dashboard import render
from explorer.frame import trials_frame
from explorer.optuna_compat import rdb_models  # noqa: E402

WIDTHS, LAYERS, HEADS = (384, 768), range(1, 25), (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48)


def make_trials(n: int, seed: int = 0) -> list[FrozenTrial]:
    """Trials shaped like explorer's (user attrs, curves, ~2% failures) over ~480 architectures."""
    rng = np.random.default_rng(seed)
    archs = [(w, d, h) for w in WIDTHS for d in LAYERS for h in HEADS if w % h == 0 and w // h >= 8]
    keys = [f"width={w},layers={d},heads={h}" for w, d, h in archs]
    dist = {"arch": optuna.distributions.CategoricalDistribution(keys)}
    trials = []
    for i in rng.integers(0, len(archs), size=n):
        w, depth, h = archs[i]
        params = depth * 12 * w * w + 1000 * w
        acc = 0.5 + 0.04 * math.log(depth) + 0.02 * math.log(h) + 0.05 * (w == 768) + rng.normal(0, 0.01)
        kappa = 50.0 / h * (1 + rng.random())
        attrs = {
            "config": {"layers": depth, "heads": h, "width": w, "mlp": 4 * w, "img_size": 32, "patch": 4},
            "layers": depth, "heads": h, "width": w, "mlp": 4 * w, "params": params, "flops": 65 * params,
            "accuracy": acc, "kappa_init_mean": kappa, "kappa_final_mean": 2 * kappa,
            "train_time_s": float(rng.uniform(5, 50)), "device": "cuda:0",
        }
        failed = rng.random() < 0.02
        if failed:
            attrs["fail_reason"] = "loss is NaN at step 12"
        trials.append(
            optuna.trial.create_trial(
                params={"arch": keys[i]}, distributions=dist, user_attrs=attrs,
                state=TrialState.FAIL if failed else TrialState.COMPLETE,
                values=None if failed else [acc, params],
                intermediate_values={} if failed else {e: acc - 0.1 / (e + 1) for e in range(3)},
            )
        )
    return trials


def _utc(when):
    return when.astimezone(timezone.utc).replace(tzinfo=None)


def bulk_add(url: str, name: str, trials: list[FrozenTrial]) -> None:
    """The rows `study.add_trials` would write, in one transaction through optuna's own tables.

    `add_trials` spends ~30 ms per trial here (one query per user attr), 5 minutes for 10k;
    `main` checks that these rows load back as the same trials.
    """
    storage = optuna.storages.RDBStorage(url)
    sid = storage.get_study_id_from_name(name)
    models = rdb_models()
    table = {m: m.__table__ for m in (models.TrialModel, models.TrialValueModel, models.TrialParamModel,
                                       models.TrialUserAttributeModel, models.TrialIntermediateValueModel)}
    trial_t = table[models.TrialModel]
    with storage.engine.begin() as conn:
        first = conn.execute(select(func.count()).select_from(trial_t).where(trial_t.c.study_id == sid)).scalar_one()
        conn.execute(insert(trial_t), [
            {"number": first + i, "study_id": sid, "state": t.state,
             "datetime_start": _utc(t.datetime_start), "datetime_complete": _utc(t.datetime_complete)}
            for i, t in enumerate(trials)
        ])
        ids = dict(conn.execute(select(trial_t.c.number, trial_t.c.trial_id).where(
            trial_t.c.study_id == sid, trial_t.c.number >= first)).all())
        values, params, attrs, steps = [], [], [], []
        for i, t in enumerate(trials):
            tid = ids[first + i]
            for objective, v in enumerate(t.values or []):
                stored, kind = models.TrialValueModel.value_to_stored_repr(v)
                values.append({"trial_id": tid, "objective": objective, "value": stored, "value_type": kind})
            for key, v in t.params.items():
                d = t.distributions[key]
                params.append({"trial_id": tid, "param_name": key, "param_value": d.to_internal_repr(v),
                               "distribution_json": distribution_to_json(d)})
            attrs += [{"trial_id": tid, "key": k, "value_json": json.dumps(v)} for k, v in t.user_attrs.items()]
            for step, v in t.intermediate_values.items():
                stored, kind = models.TrialIntermediateValueModel.intermediate_value_to_stored_repr(v)
                steps.append({"trial_id": tid, "step": step, "intermediate_value": stored,
                              "intermediate_value_type": kind})
        for model, rows in ((models.TrialValueModel, values), (models.TrialParamModel, params),
                            (models.TrialUserAttributeModel, attrs), (models.TrialIntermediateValueModel, steps)):
            if rows:
                conn.execute(insert(table[model]), rows)
    storage.engine.dispose()


def make_study(path: Path, n: int, through_api: int = 100) -> optuna.Study:
    """A real SQLite study of `n` trials: the first `through_api` by `add_trials`, the rest in bulk."""
    url = f"sqlite:///{path}"
    study = optuna.create_study(study_name="bench", storage=url, directions=["maximize", "minimize"])
    study.set_user_attr("metric", "accuracy")
    trials = make_trials(n)
    start = time.perf_counter()
    study.add_trials(trials[:through_api])
    per_trial = (time.perf_counter() - start) / max(through_api, 1)
    start = time.perf_counter()
    bulk_add(url, "bench", trials[through_api:])
    bulk = time.perf_counter() - start
    loaded = optuna.load_study(study_name="bench", storage=url)
    stored = loaded.get_trials(deepcopy=False)
    assert len(stored) == n
    for i in range(0, n, max(n // 50, 1)):  # bulk rows load back as the trials add_trials would store
        a, b = stored[i], trials[i]
        assert (a.number, a.state, a.params, a.values, a.user_attrs, a.intermediate_values) == (
            i, b.state, b.params, b.values, b.user_attrs, b.intermediate_values), i
    print(f"stored {n} trials: add_trials {per_trial * 1000:.0f} ms/trial ({through_api}), "
          f"bulk {bulk:.1f} s for the other {n - through_api}")
    return loaded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3, help="renders per tool; the fastest is reported")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_study(root / "bench.db", args.trials)

        rows = []
        for tool in ("explorer dashboard (6 views)", "optuna plot_pareto_front"):
            study = optuna.load_study(study_name="bench", storage=f"sqlite:///{root / 'bench.db'}")
            start = time.perf_counter()
            study.get_trials(deepcopy=False)  # cached by optuna's storage for what follows
            loaded = time.perf_counter()
            draws = []
            for _ in range(args.repeat):  # the machine is shared: best of a few renders
                begin = time.perf_counter()
                if tool.startswith("explorer"):
                    out = render({"bench": trials_frame(study)}, root / "explorer.html",
                                 {"bench": {"metric": "accuracy", "space": "bench"}})
                else:
                    out = root / "optuna.html"
                    fig = optuna.visualization.plot_pareto_front(study, target_names=["accuracy", "params"])
                    fig.write_html(out)
                draws.append(time.perf_counter() - begin)
            draw = min(draws)
            rows.append((tool, loaded - start, draw, loaded - start + draw, out.stat().st_size / 1e6))
        print(f"{'':30}{'load (s)':>10}{'render (s)':>12}{'total (s)':>11}{'HTML (MB)':>11}")
        for tool, load, draw, total, size in rows:
            print(f"{tool:30}{load:>10.2f}{draw:>12.2f}{total:>11.2f}{size:>11.2f}")
        (_, _, ours, ours_total, ours_mb), (_, _, theirs, theirs_total, theirs_mb) = rows
        print(f"explorer / optuna: render x{ours / theirs:.2f}, total x{ours_total / theirs_total:.2f}, "
              f"HTML size x{ours_mb / theirs_mb:.2f}")


if __name__ == "__main__":
    main()
