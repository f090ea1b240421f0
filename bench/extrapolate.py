"""Does the one posterior pick the right split at budgets past the largest configuration it measured?

    python bench/extrapolate.py [--quick]

On a complete table (every configuration x seeds: real runs from bench/build_tables.py, or a synthetic
surface with a known truth), the posterior (explorer.stats.summarize, as `recommend` reads it) sees only
the configurations up to the k-th quantile of parameters (all their seeds); the table's larger
configurations are its unmeasured candidates, predicted by the surface, as the splits past a space are
in `recommend`. At budgets FACTORS x the largest measured configuration (up to the table's largest) it
answers (explorer.decisions.answer: the pick with the smallest regret bound among every configuration
within the budget). Each pick is scored against the table's true means:

- regret: the best true mean within the budget minus the pick's, in points (accuracy x 100);
- coverage: whether the pick's 95% posterior interval holds its true mean;
- beside it, measured side by side: "keep" (the best measured configuration: it fits any larger
  budget), "depth" (its shape at the most layers that fit the budget), and the floor, a configuration
  drawn at random within the budget (its expected regret).

Tables: digits-wide (168 configurations x 3 seeds, widths 32-128), digits-vit (24 x 6, one width),
digits-vit-60 (the fidelity table's 60-epoch half), and `nonmono`, a synthetic surface whose best depth
per width is not monotone (widths 32-128, depths 1-12; its truth and seed noise are generated here:
`nonmono_table`). k = 0.25, 0.3, 0.35, 0.4, 0.5, 0.6 (digits-vit k >= 0.5: fewer configurations leave
no surface to fit). Targets (issue 33): within SIZE_REACH, regret at most 0.5x the better of keep and
depth, and coverage within 0.90-0.98 on every table and k. The last line pools every held-out budget
within the reach:

    extrapolate regret R baseline B coverage C worst W
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from explorer.decisions import answer  # noqa: E402
from explorer.stats import summarize  # noqa: E402
from explorer.transfer import SIZE_REACH  # noqa: E402

DATA = ROOT / "bench" / "data"
DIMS = ["layers", "heads", "width", "mlp"]
FACTORS = (1.25, 1.5, 2.0, 3.0, 4.0)
KS = (0.25, 0.3, 0.35, 0.4, 0.5, 0.6)
TABLES = ("digits-wide", "nonmono", "digits-vit", "digits-vit-60")
OBJECTIVES = [("accuracy", "maximize"), ("params", "minimize")]


def nonmono_table(seeds: int = 3) -> pd.DataFrame:
    """A surface whose best depth per width is not monotone: widths 32, 48, 64, 96, 128, depths 1-12, heads 1-8
    (head dim >= 8), MLP 2x width; accuracy = 0.97 - capacity shortfall - an over-depth penalty whose best
    depth goes 4, 8, 3, 7, 5 across the widths - a one-head penalty, plus a seed effect and own noise."""
    rng = np.random.default_rng(0)
    best_depth = {32: 4, 48: 8, 64: 3, 96: 7, 128: 5}
    rows = []
    for width, top in best_depth.items():
        for layers in range(1, 13):
            for heads in (1, 2, 4, 8):
                if width // heads < 8:
                    continue
                params = layers * (4 * width * width + 2 * 2 * width * width) + 10 * width
                acc = (0.97 - 0.25 * np.exp(-params / 40_000) - 0.004 * (np.log2(layers / top)) ** 2
                       - (0.02 if heads == 1 else 0.0))
                for seed in range(seeds):
                    rows.append({"key": f"layers={layers},heads={heads},width={width}", "layers": layers, "heads": heads,
                                 "width": width, "mlp": 2 * width, "params": params, "seed": seed,
                                 "metric": float(np.clip(acc + 0.004 * rng.standard_normal(), 0, 1))})
    return pd.DataFrame(rows)


def table(name: str) -> pd.DataFrame:
    if name == "nonmono":
        return nonmono_table()
    if name == "digits-vit-60":
        frame = pd.read_csv(DATA / "digits-vit-fidelity.csv.gz")
        return frame[frame["epochs"] == 60]
    return pd.read_csv(DATA / f"{name}.csv.gz")


def depth_only(best: pd.Series, configs: pd.DataFrame, budget: int) -> str:
    """The best measured shape with the most layers that fit `budget` (itself when none deeper fits)."""
    same = configs[(configs["heads"] == best["heads"]) & (configs["width"] == best["width"])
                   & (configs["mlp"] == best["mlp"]) & (configs["params"] <= budget)]
    return str(same.sort_values("layers").index[-1])


def evaluate(name: str, k: float) -> pd.DataFrame:
    """One row per held-out budget: the posterior's pick and the baselines' with their regret, and coverage."""
    runs = table(name)
    configs = runs.groupby("key").agg(**{d: (d, "first") for d in DIMS + ["params"]}, true=("metric", "mean"))
    cut = configs["params"].quantile(k)
    seen = configs[configs["params"] <= cut]
    if seen["params"].nunique() < 2 or len(seen) < 6:
        return pd.DataFrame()
    frame = runs[runs["key"].isin(seen.index)].rename(columns={"key": "arch", "metric": "accuracy"}).assign(state="COMPLETE")
    candidates = [(key, {d: int(row[d]) for d in DIMS}, int(row["params"])) for key, row in configs.iterrows()]
    post = summarize(frame, "accuracy", OBJECTIVES, draws=0, candidates=candidates).attrs["posterior"]
    lo, hi = post.interval()
    top = int(seen["params"].max())
    unseen = set(configs.index) - set(seen.index)
    best = seen.loc[seen["true"].idxmax()]
    rows = []
    for factor in FACTORS:
        budget = int(factor * top)
        if budget > configs["params"].max() * 1.0001:
            break
        inside = configs[configs["params"] <= budget]
        if inside["params"].max() <= top:
            continue  # nothing larger than the measured configurations fits: not past the data
        pick = answer(post, budget, None, 0.01, advise=False, past=unseen).pick  # a split past the data only when shown better, as in recommend
        i = post.index[pick]
        ideal = inside["true"].max()
        regret = {"post": ideal - configs.at[pick, "true"], "keep": ideal - best["true"],
                  "depth": ideal - configs.at[depth_only(best, configs, budget), "true"], "random": ideal - inside["true"].mean()}
        rows.append({"table": name, "k": k, "factor": factor, "budget": budget, "pick": pick, "measured": bool(post.n[i] > 0),
                     "covered": bool(lo[i] <= configs.at[pick, "true"] <= hi[i]), "lo": lo[i], "hi": hi[i],
                     "predicted": post.mean[i], "true": configs.at[pick, "true"],
                     **{f"regret_{n}": 100 * v for n, v in regret.items()}, "seen": len(seen)})
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one table, one k (for tests/test_bench.py)")
    args = parser.parse_args()
    start = time.perf_counter()
    runs = [("nonmono", 0.4)] if args.quick else [(n, k) for n in TABLES for k in KS if not (n.startswith("digits-vit") and k < 0.5)]
    results = pd.concat([evaluate(name, k) for name, k in runs], ignore_index=True)
    pd.set_option("display.width", 220)
    print("regret in points (accuracy x 100) against each table's true means; the pick is the posterior's (measured or predicted)")
    print(results[["table", "k", "seen", "factor", "budget", "pick", "measured", "predicted", "lo", "hi", "true", "covered",
                   "regret_post", "regret_depth", "regret_keep", "regret_random"]].round(4).to_string(index=False))
    within = results[results["factor"] <= SIZE_REACH]
    print(f"within the reach ({SIZE_REACH:g}x the largest measured configuration), per table and k:")
    worst = 1.0
    for (name, k), at in within.groupby(["table", "k"], sort=False):
        better = min(at["regret_keep"].mean(), at["regret_depth"].mean())
        worst = min(worst, at["covered"].mean())
        print(f"  {name} k={k}: {len(at)} budgets, regret posterior {at['regret_post'].mean():.2f} depth "
              f"{at['regret_depth'].mean():.2f} keep {at['regret_keep'].mean():.2f} random {at['regret_random'].mean():.2f} "
              f"(posterior / better baseline {at['regret_post'].mean() / better if better > 0 else float('nan'):.2f}), "
              f"coverage {at['covered'].mean():.2f}, interval width {100 * (at['hi'] - at['lo']).mean():.1f} points")
    beyond = results[results["factor"] > SIZE_REACH]
    if len(beyond):
        print(f"beyond the reach ({len(beyond)} budgets): regret posterior {beyond['regret_post'].mean():.2f}, better baseline "
              f"{min(beyond['regret_depth'].mean(), beyond['regret_keep'].mean()):.2f}, coverage {beyond['covered'].mean():.2f}")
    base = min(within["regret_depth"].mean(), within["regret_keep"].mean())
    print(f"({time.perf_counter() - start:.0f} s)")
    print(f"extrapolate regret {within['regret_post'].mean():.2f} baseline {base:.2f} coverage {within['covered'].mean():.2f} "
          f"worst {worst:.2f}")


if __name__ == "__main__":
    main()
