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
- fixed replicates: every configuration at every seed of the set (the compute reference).

Printed per policy: agreement (tied or same), the share with the same configuration, the mean tied-set
size (agreement bought by huge tied sets would show here), and compute as a share of the fixed
maximum. Figures are means over the 10 splits x 2 runs x 10 budgets.
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
from explorer.replicates import ReplicateSpec, replay  # noqa: E402

TABLE = ROOT / "bench" / "data" / "digits-vit.csv.gz"
BASELINE = "layers=6,heads=2"  # spaces/vit-digits.yaml's baseline
BUDGETS = 10
POLICIES = ("one seed", "adaptive", "fixed")


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


def answers(frame: pd.DataFrame, used: dict[str, list[int]], at: list[int]) -> list[tuple[str, frozenset[str]]]:
    """Per budget: the recommended configuration and the set it is tied with."""
    df = trials(frame, used)
    return [(r.key, frozenset(r.tied)) for r in (recommend(df, b, BASELINE) for b in at)]


def run_split(split: tuple[tuple[int, ...], tuple[int, ...]], confidence: float) -> dict[str, list[tuple[bool, bool, float, float]]]:
    """For one split of the seeds: per policy and budget (agree, same, tied-set size, compute share)."""
    frame, tables, params = load()
    at = budgets(params)
    spec = ReplicateSpec(policy="adaptive", confidence=confidence)
    out: dict[str, list[tuple[bool, bool, float, float]]] = {}
    for policy in POLICIES:
        runs, cost = [], []
        for seeds in split:
            if policy == "one seed":
                used = {key: [seeds[0]] for key in tables}
            elif policy == "fixed":
                used = {key: list(seeds) for key in tables}
            else:
                used = replay(tables, params, list(seeds), spec)
            runs.append(answers(frame, used, at))
            cost.append(sum(map(len, used.values())) / (len(tables) * len(seeds)))
        out[policy] = [
            ((a == b) or (a in tb) or (b in ta), a == b, (len(ta) + len(tb)) / 2, float(np.mean(cost)))
            for (a, ta), (b, tb) in zip(*runs)
        ]
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
    print(f"{'':28s} {'agree (tied/same)':>18s} {'range over splits':>18s} {'same config':>12s} {'tied-set size':>14s} {'compute':>8s}")
    summary = {}
    for policy in POLICIES:
        rows = np.array([r for split in results for r in split[policy]], float)
        per_split = [np.mean([r[0] for r in split[policy]]) for split in results]
        summary[policy] = rows.mean(axis=0)
        agree, same, size, cost = summary[policy]
        label = {"one seed": "one seed per configuration", "adaptive": "adaptive replicates",
                 "fixed": f"fixed, {args.max_seeds} seeds each"}[policy]
        print(f"{label:28s} {agree:18.0%} {f'{min(per_split):.0%}-{max(per_split):.0%}':>18s} {same:12.0%} {size:14.1f} {cost:8.0%}")
    ratio = summary["adaptive"][0] / max(summary["one seed"][0], 1e-9)
    print(f"agreement, adaptive replicates vs one seed: {ratio:.2f}x, at {summary['adaptive'][3]:.0%} of the fixed-maximum compute")
    met = summary["adaptive"][0] >= 0.9 and summary["adaptive"][3] <= 0.6
    print(f"target (>= 90% agreement at <= 60% of the fixed-maximum compute): {'met' if met else 'not met'}")
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
