"""Does the shape law fitted on small configurations pick the right split at budgets no one measured?

    python bench/extrapolate.py [--bootstrap 200]

On a complete table (every configuration x seeds, real runs: bench/build_tables.py), `explorer.
extrapolate.fit` sees only the configurations up to the k-th quantile of parameters (all their seeds);
at budgets FACTORS x the largest of them (up to the table's largest configuration) it picks the best
split among every configuration of the table within the budget, as `recommend` would among the
space's candidates. Each pick is scored against the table's true means (mean over all its seeds):

- regret: the best true mean within the budget minus the pick's, in metric points (accuracy x 100);
- coverage: whether the pick's 95% prediction interval holds its true mean;
- the same regret for two baselines measured side by side: "keep": the best measured configuration
  (it fits any larger budget); "depth": its shape (heads, width, MLP) at the most layers that fit the
  budget among the table's configurations; and the floor: a configuration drawn at random within the
  budget (its expected regret).

The reach (how far past the largest measured configuration the answer is trusted, explorer.extrapolate.
REACH) is chosen on digits-wide at k = 0.5 (in-sample there): the largest factor f at which the budgets
up to f, pooled, meet the target (the law's mean regret at most half the better baseline's, coverage
>= 0.9). It is confirmed on data not used to choose it: digits-wide at k = 0.25, 0.3, 0.35, 0.4
and 0.6 (pooled on their own line), and the one-width default space at k = 0.5 (digits-vit, 20 epochs; and its 60-epoch runs, 3
seeds, from digits-vit-fidelity), where only the layers and heads terms can be fitted; a smaller k
leaves it fewer configurations than the law has coefficients + 2. The last line pools every held-out
budget of digits-wide within the reach (every k, the choosing one included; the per-k lines above it
separate them):

    extrapolate regret R baseline B coverage C
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from explorer import extrapolate  # noqa: E402

DATA = ROOT / "bench" / "data"
DIMS = ["layers", "heads", "width", "mlp"]
FACTORS = (1.5, 2.0, 3.0, 4.0, 6.0, 8.0)
CHOOSE = ("digits-wide", 0.5)
RUNS = [("digits-wide", 0.5), ("digits-wide", 0.25), ("digits-wide", 0.3), ("digits-wide", 0.35), ("digits-wide", 0.4),
        ("digits-wide", 0.6),
        ("digits-vit", 0.5), ("digits-vit-60", 0.5)]


def table(name: str) -> pd.DataFrame:
    """A table's runs: digits-vit-60 is the 60-epoch half of digits-vit-fidelity."""
    if name == "digits-vit-60":
        frame = pd.read_csv(DATA / "digits-vit-fidelity.csv.gz")
        return frame[frame["epochs"] == 60]
    return pd.read_csv(DATA / f"{name}.csv.gz")


def depth_only(best: pd.Series, configs: pd.DataFrame, budget: int) -> str:
    """The best measured shape with the most layers that fit `budget` (itself when none deeper fits)."""
    same = configs[(configs["heads"] == best["heads"]) & (configs["width"] == best["width"])
                   & (configs["mlp"] == best["mlp"]) & (configs["params"] <= budget)]
    return str(same.sort_values("layers").index[-1])


def evaluate(name: str, k: float, bootstrap: int) -> pd.DataFrame:
    """One row per held-out budget: the law's pick and the baselines' with their regret, and coverage."""
    runs = table(name)
    configs = runs.groupby("key").agg(**{d: (d, "first") for d in DIMS + ["params"]}, true=("metric", "mean"))
    cut = configs["params"].quantile(k)
    seen = configs[configs["params"] <= cut]
    model = extrapolate.fit(runs[runs["key"].isin(seen.index)], "metric", True, bootstrap=bootstrap)
    top = int(seen["params"].max())
    best = seen.loc[seen["true"].idxmax()]  # the measured best: its mean over the seeds it was measured at
    candidates = [(key, {d: row[d] for d in DIMS}, int(row["params"])) for key, row in configs.iterrows()]
    rows = []
    for factor in FACTORS:
        budget = int(factor * top)
        if budget > configs["params"].max() * 1.0001:
            break
        inside = configs[configs["params"] <= budget]
        if inside["params"].max() <= top:
            continue  # nothing larger than the measured configurations fits: not an extrapolation
        answer = extrapolate.answer(model, candidates, budget, top, reach=np.inf)
        pick = answer.best
        ideal = inside["true"].max()
        regret = {"law": ideal - configs.at[pick.key, "true"], "keep": ideal - best["true"],
                  "depth": ideal - configs.at[depth_only(best, configs, budget), "true"],
                  "random": ideal - inside["true"].mean()}
        rows.append({"table": name, "k": k, "factor": factor, "budget": budget, "pick": pick.key,
                     "covered": pick.lo <= configs.at[pick.key, "true"] <= pick.hi, "lo": pick.lo, "hi": pick.hi,
                     "predicted": pick.value, "true": configs.at[pick.key, "true"],
                     **{f"regret_{n}": 100 * v for n, v in regret.items()}, "terms": ",".join(model.terms),
                     "seen": len(seen)})
    return pd.DataFrame(rows)


def reach(rows: pd.DataFrame) -> float:
    """The largest factor f at which the budgets up to f, pooled, meet the target: the law's mean regret at
    most half the better baseline's and coverage >= 0.9 (1.0: none does)."""
    chosen = 1.0
    for factor in sorted(rows["factor"].unique()):
        upto = rows[rows["factor"] <= factor]
        better = min(upto["regret_keep"].mean(), upto["regret_depth"].mean())
        if upto["regret_law"].mean() <= better / 2 and upto["covered"].mean() >= 0.9:
            chosen = float(factor)
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", type=int, default=extrapolate.BOOTSTRAP)
    args = parser.parse_args()
    start = time.perf_counter()
    results = pd.concat([evaluate(name, k, args.bootstrap) for name, k in RUNS], ignore_index=True)
    pd.set_option("display.width", 200)
    print(f"regret in metric points (accuracy x 100) against each table's true means; {args.bootstrap} bootstrap refits")
    print(results[["table", "k", "seen", "terms", "factor", "budget", "pick", "predicted", "lo", "hi", "true", "covered",
                   "regret_law", "regret_depth", "regret_keep", "regret_random"]].round(4).to_string(index=False))
    chosen_rows = results[(results["table"] == CHOOSE[0]) & (results["k"] == CHOOSE[1])]
    chosen = reach(chosen_rows)
    print(f"reach chosen on {CHOOSE[0]} k={CHOOSE[1]} (in-sample): {chosen:g}x the largest measured configuration "
          f"(explorer.extrapolate.REACH = {extrapolate.REACH:g})")
    print("within the reach, per table and k (the first row chose it; the others confirm it):")
    within = results[results["factor"] <= extrapolate.REACH]
    for (name, k), at in within.groupby(["table", "k"], sort=False):
        print(f"  {name} k={k}: {len(at)} budgets, regret law {at['regret_law'].mean():.2f} depth "
              f"{at['regret_depth'].mean():.2f} keep {at['regret_keep'].mean():.2f} random "
              f"{at['regret_random'].mean():.2f}, coverage {at['covered'].mean():.2f} (interval width "
              f"{100 * (at['hi'] - at['lo']).mean():.1f} points)")
    beyond = results[results["factor"] > extrapolate.REACH]
    if len(beyond):
        print(f"beyond the reach ({len(beyond)} budgets): regret law {beyond['regret_law'].mean():.2f}, better baseline "
              f"{min(beyond['regret_depth'].mean(), beyond['regret_keep'].mean()):.2f}, coverage {beyond['covered'].mean():.2f}")
    wide = within[within["table"] == "digits-wide"]
    check = wide[wide["k"] != CHOOSE[1]]
    print(f"confirmation, digits-wide k != {CHOOSE[1]} pooled: {len(check)} budgets, regret law {check['regret_law'].mean():.2f}, "
          f"better baseline {min(check['regret_depth'].mean(), check['regret_keep'].mean()):.2f}, coverage "
          f"{check['covered'].mean():.2f}")
    base = min(wide["regret_depth"].mean(), wide["regret_keep"].mean())
    print(f"({time.perf_counter() - start:.0f} s)")
    print(f"extrapolate regret {wide['regret_law'].mean():.2f} baseline {base:.2f} coverage {wide['covered'].mean():.2f}")


if __name__ == "__main__":
    main()
