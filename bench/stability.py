"""Do two runs of the default study, on disjoint seeds, give the same answer? One seed vs replicates.

    python bench/stability.py [--confidence 0.8] [--max-seeds 3] [--jobs 2]

Replays the default study's space from `bench/data/digits-vit.csv.gz` (its 24 configurations at the
study's budget, seeds 0-5, real runs) instead of training. The six seeds are split into two disjoint
sets of three in every one of the 10 ways; each set is one "run" of the study. At 10 budgets spread
log-uniformly over the space's parameter range, `explorer.recommend` answers each run, and the two
runs agree when their recommendations are statistically tied: the same configuration, or one in the
other's tied set (configurations with no evidence either is better). Side by side:

- one seed per configuration (each set's first seed): no interval, so no tie can be shown and only
  the same configuration agrees;
- adaptive replicates (explorer.replicates at `--confidence`, up to `--max-seeds` of the set),
  replayed on the table as a study would spend them;
- decide: seeds where they most shrink an undecided budget's regret bound (explorer.replicates
  `decide`, the default delta and level, up to `--max-seeds`);
- fixed replicates: every configuration at every seed of the set (the compute reference);
- random pick: a configuration drawn at random within the budget in each run (the floor; "tied" read
  from the fixed runs' tied sets).

Printed per policy: agreement (tied or same), the share with the same configuration, the mean tied-set
size (agreement bought by huge tied sets would show here), and compute as a share of the fixed
maximum; then measures that can fail: the same configuration on budgets with more than 4 candidates,
the share of answers whose true mean (the 6-seed mean, which includes the run's own 3 seeds) is within
1 point of the best true mean within the budget, the mean regret against the 6-seed means (points), the
share of budgets decided (the pick's regret bound within delta: explorer.decisions), and the seeds
given to the three configurations with the best true means against the rest. Figures are means over
the 10 splits x 2 runs x 10 budgets.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from explorer.recommend import recommend  # noqa: E402
from explorer.replicates import ReplicateSpec, replay, seeds_by_rank  # noqa: E402

TABLE = ROOT / "bench" / "data" / "digits-vit.csv.gz"
BASELINE = "layers=6,heads=2"  # spaces/vit-digits.yaml's baseline
BUDGETS = 10
POLICIES = ("one seed", "adaptive", "decide", "fixed", "random pick")
DEFAULT = "decide"  # the policy the target is checked on
MEASURES = ("agree", "same", "tied-set size", "compute", "same (>4)", "within 1 pt", "regret", "decided", "seeds best", "seeds rest")


def load(path: Path = TABLE) -> tuple[pd.DataFrame, dict[str, dict[int, float]], dict[str, int]]:
    frame = pd.read_csv(path)
    tables = {key: dict(zip(g["seed"].astype(int), g["metric"].astype(float))) for key, g in frame.groupby("key")}
    params = frame.groupby("key")["params"].first().astype(int).to_dict()
    return frame, tables, params


def budgets(params: dict[str, int], n: int = BUDGETS) -> list[int]:
    """`n` budgets log-uniform from the smallest configuration to the largest, both included."""
    return [int(round(b)) for b in np.geomspace(min(params.values()), max(params.values()), n)]


def trials(frame: pd.DataFrame, used: dict[str, list[int]]) -> pd.DataFrame:
    """A study's trials frame holding exactly the (configuration, seed) runs `used`."""
    rows = frame[[seed in used[key] for key, seed in zip(frame["key"], frame["seed"])]]
    return pd.DataFrame({
        "number": range(len(rows)), "state": "COMPLETE", "arch": rows["key"].to_numpy(), "seed": rows["seed"].to_numpy(),
        "layers": rows["layers"].to_numpy(), "heads": rows["heads"].to_numpy(), "width": rows["width"].to_numpy(),
        "mlp": rows["mlp"].to_numpy(), "params": rows["params"].to_numpy(), "accuracy": rows["metric"].to_numpy(),
    })


def answers(frame: pd.DataFrame, used: dict[str, list[int]], at: list[int]) -> list[tuple[str, frozenset[str], bool]]:
    """Per budget: the recommended configuration, the set it is tied with, and whether the budget is decided."""
    df = trials(frame, used)
    recs = [recommend(df, b, BASELINE) for b in at]
    return [(r.key, frozenset(r.tied), r.decided) for r in recs]


def run_split(split: tuple[tuple[int, ...], tuple[int, ...]], confidence: float) -> dict[str, list[tuple[float, ...]]]:
    """For one split of the seeds: per policy, run and budget the MEASURES."""
    frame, tables, params = load()
    dims = {k: {d: int(g[d].iloc[0]) for d in ("layers", "heads", "width", "mlp")} for k, g in frame.groupby("key")}
    at = budgets(params)
    truth = frame.groupby("key")["metric"].mean().to_dict()
    inside = [[k for k in tables if params[k] <= b] for b in at]
    best = [max(truth[k] for k in keys) for keys in inside]
    rng = np.random.default_rng(sum(split[0]) * 100 + sum(split[1]))
    out: dict[str, list[tuple[float, ...]]] = {}
    fixed_ties = []
    for policy in POLICIES:
        runs, used_all = [], []
        for seeds in split:
            if policy == "one seed":
                used = {key: [seeds[0]] for key in tables}
            elif policy in ("fixed", "random pick"):
                used = {key: list(seeds) for key in tables}
            else:
                spec = ReplicateSpec(policy=policy, confidence=confidence)
                used = replay(tables, params, list(seeds), spec, budgets=at, draws=500, dims=dims)
            said = answers(frame, used, at)
            if policy == "fixed":
                fixed_ties.append([t for _, t, _ in said])
            if policy == "random pick":
                said = [(str(rng.choice(keys)), ties, False) for keys, ties in zip(inside, fixed_ties[len(runs)])]
            runs.append(said)
            used_all.append(used)
        cost = float(np.mean([sum(map(len, u.values())) / (len(tables) * len(split[0])) for u in used_all]))
        spend = np.mean([seeds_by_rank(u, truth) for u in used_all], axis=0)
        rows = []
        for i, ((a, ta, da), (b, tb, db)) in enumerate(zip(*runs)):
            for key, decided in ((a, da), (b, db)):
                rows.append((float((a == b) or (a in tb) or (b in ta)), float(a == b), (len(ta) + len(tb)) / 2, cost,
                             float(a == b) if len(inside[i]) > 4 else np.nan, float(best[i] - truth[key] <= 0.01),
                             100 * (best[i] - truth[key]), float(decided), *spend))
        out[policy] = rows
    return out


def splits(seeds: tuple[int, ...], size: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Every way to split `seeds` into two disjoint sets of `size` (unordered pairs)."""
    out = []
    for first in itertools.combinations(seeds, size):
        rest = tuple(s for s in seeds if s not in first)
        for second in itertools.combinations(rest, size):
            if (second, first) not in out:
                out.append((first, second))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--confidence", type=float, default=0.8, help="adaptive policy's confidence (the default study's)")
    parser.add_argument("--max-seeds", type=int, default=3, help="seeds per run (the default study's budget.seeds)")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    frame, tables, params = load()
    all_seeds = tuple(sorted(frame["seed"].unique().tolist()))
    pairs = splits(all_seeds, args.max_seeds)
    start = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(run_split, pairs, itertools.repeat(args.confidence)))
    print(f"{len(tables)} configurations x seeds {list(all_seeds)} ({TABLE.name}); {len(pairs)} splits into two runs of "
          f"{args.max_seeds} seeds; {BUDGETS} budgets {budgets(params)[0]:,} to {budgets(params)[-1]:,} params; "
          f"adaptive confidence {args.confidence:g}")
    labels = {"one seed": "one seed per configuration", "adaptive": "adaptive replicates", "decide": "decide (seeds where undecided)",
              "fixed": f"fixed, {args.max_seeds} seeds each", "random pick": "random pick within budget (floor)"}
    print(f"{'':34s} {'agree (tied/same)':>18s} {'range over splits':>18s} {'same config':>12s} {'tied-set size':>14s} {'compute':>8s}")
    summary = {}
    for policy in POLICIES:
        rows = np.array([r for split in results for r in split[policy]], float)
        per_split = [np.mean([r[0] for r in split[policy]]) for split in results]
        summary[policy] = np.nanmean(rows, axis=0)
        agree, same, size, cost = summary[policy][:4]
        print(f"{labels[policy]:34s} {agree:18.0%} {f'{min(per_split):.0%}-{max(per_split):.0%}':>18s} {same:12.0%} {size:14.1f} {cost:8.0%}")
    ratio = summary["adaptive"][0] / max(summary["one seed"][0], 1e-9)
    print(f"agreement, adaptive replicates vs one seed: {ratio:.2f}x, at {summary['adaptive'][3]:.0%} of the fixed-maximum compute")
    print("measures that can fail (true means: the 6-seed means; regret in points, with its 95% interval over the 10 splits):")
    print(f"{'':34s} {'same, >4 cand.':>15s} {'within 1 pt':>12s} {'regret':>16s} {'decided':>8s} {'seeds: best 3 / rest':>21s} {'compute':>8s}")
    for policy in POLICIES:
        per_split = [np.mean([r[6] for r in split[policy]]) for split in results]
        half = 1.96 * np.std(per_split, ddof=1) / np.sqrt(len(per_split))
        same4, within, regret, decided, sb, sr = summary[policy][4:10]
        shown_decided = "-" if policy == "random pick" else f"{decided:.0%}"
        print(f"{labels[policy]:34s} {same4:15.0%} {within:12.0%} {f'{regret:.2f} ± {half:.2f}':>16s} {shown_decided:>8s} "
              f"{f'{sb:.1f} / {sr:.1f}':>21s} {summary[policy][3]:8.0%}")
    d, f = summary[DEFAULT], summary["fixed"]
    met = d[3] <= 0.6 and d[6] <= f[6] + 0.05 and d[7] >= 0.7
    print(f"target ({DEFAULT}: <= 60% of fixed compute, regret within 0.05 points of fixed's, decided at >= 70% of budgets): "
          f"compute {d[3]:.0%}, regret {d[6]:.2f} vs {f[6]:.2f}, decided {d[7]:.0%}: {'met' if met else 'not met'}")
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
