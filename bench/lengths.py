"""Is the answer right at the length the user will train? Simulated studies with a known truth at every length.

    python bench/lengths.py [--reps 40] [--jobs 2] [--quick]

The truth is a table of real runs at several lengths: `digits-vit-lengths` (24 configurations x 4 seeds,
one warmup-stable-decay run of 40 epochs each, its 10- and 20-epoch results cooldown branches:
bench/build_tables.py) and `digits-vit-fidelity` (24 x 3 at 20 and 60 epochs, separate runs on a GPU).
Each configuration's mean at each length is the truth; a simulated study never sees the table's runs:
each of its runs is a fresh draw of every rung it reaches, the truth plus a shared seed effect plus the
configuration's own noise at that length, its rungs correlated as the table's runs are (the correlation
of one run's residuals across lengths, estimated from the table), in steps of 1/360, inside [0, 1].

Each study goes through explorer's loop at the table's longest length as target: every configuration
once at the shortest length, then the `decide` policy's rounds (explorer.replicates.wanted_keys on
explorer.stats.summarize's posterior over (configuration, length): a new seed at a short length or a
longer run of a contender, by the shrinkage of the bounds at the target per second of training) up to
4 seeds per configuration and length, then the answer at the 10 default budgets at the target length.
Per table, over distinct budgets (delta = 1 point):

- within: the share of questions whose pick is within 1 point of the target length's true best;
- decided: the share with eps <= delta; false: decided questions whose claim is false at the target
  length (the pick's true regret > delta, or its verdict against the baseline);
- compute: seconds of training as a share of every configuration at the target length with 3 seeds
  (seconds per epoch of each configuration from the table's own train times, a run of length L training
  L epochs plus its shorter rungs' cooldowns);
- regret: the pick's true regret at the target length, points.

Floors: `short`, the answer from the shortest length alone (every configuration at 3 seeds there, today's
single-length posterior), judged at the target length; and a random pick within the budget.

Reach (explorer.transfer.LENGTH_REACH): the same studies limited to the lengths up to half the target
(digits-vit-lengths: 10 and 20 epochs) answer at the target (40, twice the longest trained): coverage of
the pick's 95% interval and its regret, against the answer at the longest trained length.

The last line: `lengths within W short S decided D false F compute C` (digits-vit-lengths). Targets:
within >= 0.90, decided >= 0.6, false <= 0.05, compute <= 0.5. `--quick` runs 2 studies of the first
table (for tests/test_bench.py): its figures mean nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.decide import budgets, questions, truth_of  # noqa: E402  (the same budgets, questions and judging as bench/decide.py)

DATA = ROOT / "bench" / "data"
N_TEST = 360
DELTA = 0.01
CAP = 4
TABLES = {"lengths": ("digits-vit-lengths", "layers=6,heads=2", 0.2),
          "fidelity": ("digits-vit-fidelity", "layers=6,heads=2", None)}  # cooldown: None, separate cosine runs
OBJECTIVES = [("accuracy", "maximize"), ("params", "minimize")]


@dataclass(frozen=True)
class Truth:
    name: str
    keys: list[str]
    lengths: list[int]
    params: dict[str, int]
    dims: dict[str, dict[str, int]]
    mean: np.ndarray  # (configurations, lengths)
    sd: np.ndarray  # each configuration's own noise at each length
    seed_sd: float
    corr: float  # one run's noise across its lengths
    per_epoch: dict[str, float]  # seconds per epoch trained
    baseline: str
    cooldown: float | None

    def budget(self):  # noqa: ANN201 - explorer.budget.Budget, imported late
        from explorer.budget import Budget

        return Budget(epochs=self.lengths, schedule="wsd" if self.cooldown else "cosine", cooldown=self.cooldown or 0.2)


def load(name: str) -> Truth:
    table, baseline, cooldown = TABLES[name]
    frame = pd.read_csv(DATA / f"{table}.csv.gz")
    keys, lengths = sorted(frame["key"].unique()), sorted(int(e) for e in frame["epochs"].unique())
    first = frame.groupby("key").first()
    mean = np.array([[frame[(frame.key == k) & (frame.epochs == e)]["metric"].mean() for e in lengths] for k in keys])
    resid = frame.assign(r=frame["metric"] - frame.groupby(["key", "epochs"])["metric"].transform("mean"))
    seed_effect = resid.groupby(["epochs", "seed"])["r"].mean()
    seed_sd = float(np.sqrt(max(0.0, seed_effect.var(ddof=1) - resid["r"].var(ddof=1) / len(keys))))
    own = resid.groupby(["key", "epochs"])["r"].std(ddof=1).unstack().loc[keys, lengths].to_numpy()
    wide = resid.pivot_table(index=["key", "seed"], columns="epochs", values="r")
    corr = float(np.clip(np.nanmean([wide[a].corr(wide[b]) for i, a in enumerate(lengths) for b in lengths[i + 1:]]), 0, 0.95))
    budget = _budget(lengths, cooldown)
    per_epoch = (frame.groupby("key")["train_time_s"].median() / budget.compute(lengths[-1])).to_dict() if cooldown else \
        (frame.groupby("key").apply(lambda g: (g["train_time_s"] / g["epochs"]).median(), include_groups=False)).to_dict()
    dims = {k: {d: int(first.loc[k, d]) for d in ("layers", "heads", "width", "mlp")} for k in keys}
    return Truth(name, keys, lengths, {k: int(first.loc[k, "params"]) for k in keys}, dims, mean, np.maximum(own, 1e-3),
                 seed_sd, corr, per_epoch, baseline, cooldown)


def _budget(lengths: list[int], cooldown: float | None):  # noqa: ANN202
    from explorer.budget import Budget

    return Budget(epochs=lengths, schedule="wsd" if cooldown else "cosine", cooldown=cooldown or 0.2)


def simulate(truth: Truth, seeds: int, rep: int) -> np.ndarray:
    """(configurations, seeds, lengths) fresh runs: every rung of every run, correlated across its lengths."""
    rng = np.random.default_rng([list(TABLES).index(truth.name), rep])
    n, k = len(truth.keys), len(truth.lengths)
    cov = truth.corr * np.ones((k, k)) + (1 - truth.corr) * np.eye(k)
    z = rng.multivariate_normal(np.zeros(k), cov, size=(n, seeds))
    b = truth.seed_sd * rng.standard_normal((seeds, 1))
    x = truth.mean[:, None, :] + b[None] + truth.sd[:, None, :] * z
    return np.clip(np.round(x * N_TEST) / N_TEST, 0, 1)


def judge(truth: Truth, budget: int, pick: str, decided: bool, claims: list[tuple[str, str, str]], at: int) -> dict:
    regret, false = truth_of(dict(zip(truth.keys, truth.mean[:, truth.lengths.index(at)])), truth.params, budget, pick, claims, DELTA)
    return {"within": float(regret <= DELTA + 1e-12), "decided": float(decided), "false": float(decided and false),
            "regret": 100 * regret}


def frame_of(truth: Truth, values: np.ndarray, runs: dict[tuple[str, int], int]) -> pd.DataFrame:
    """The trials of a study: one per (configuration, seed), at the longest length run, with its rungs."""
    rows = []
    budget = _budget(truth.lengths, truth.cooldown)
    for (key, seed), length in runs.items():
        i = truth.keys.index(key)
        reached = [e for e in truth.lengths if e <= length] if truth.cooldown else [length]
        rungs = {e: float(values[i, seed, truth.lengths.index(e)]) for e in reached}
        rows.append({"state": "COMPLETE", "arch": key, "seed": seed, "epochs": length, "rungs": rungs,
                     "accuracy": rungs[length], "params": truth.params[key], **truth.dims[key],
                     "train_time_s": truth.per_epoch[key] * budget.compute(length)})
    return pd.DataFrame(rows)


def study(truth: Truth, values: np.ndarray, lengths: list[int], target: int) -> tuple[list[dict], float]:
    """One simulated study trained at `lengths`, answered at `target`: per question its judgement, and its compute."""
    from explorer.decisions import DecisionSpec, answer
    from explorer.rows import split_row
    from explorer import replicates
    from explorer.stats import summarize

    budget = _budget(lengths, truth.cooldown)
    compute = {e: budget.compute(e) for e in lengths}
    runs: dict[tuple[str, int], int] = {(k, 0): lengths[0] for k in truth.keys}  # (configuration, seed): the length it ran
    extra: list[tuple[str, int, int]] = []  # runs of a seed at a length it already ran shorter: a run of their own
    decision = DecisionSpec(delta=DELTA, max_seeds=CAP, epochs=target)
    at = budgets(truth)
    while True:
        frame = pd.concat([frame_of(truth, values, runs), frame_of(truth, values, {(k, s): e for k, s, e in extra})])
        table = summarize(frame, "accuracy", OBJECTIVES, draws=0, epochs=target, lengths=lengths, compute=compute)
        post, full = table.attrs["posterior"], table.attrs["full"]
        more = replicates.wanted_keys(post, CAP, at, decision, truth.baseline, full, target)
        if not more:
            break
        for row in more:
            key, length = split_row(row)
            length = length or lengths[0]
            seeds = {s: e for (k, s), e in runs.items() if k == key}
            seed = next((s for s in range(CAP) if seeds.get(s, 0) < length), None)
            if seed is None:
                continue
            if seed in seeds:
                extra.append((key, seed, seeds[seed]))  # the shorter run stays a run of its own (its cost was spent)
            runs[(key, seed)] = length
    cost = sum(truth.per_epoch[k] * compute[e] for (k, _), e in runs.items()) + \
        sum(truth.per_epoch[k] * compute[e] for k, _, e in extra)
    reference = sum(3 * truth.per_epoch[k] * _budget(truth.lengths, truth.cooldown).compute(truth.lengths[-1]) for k in truth.keys)
    said = []
    for b in questions(truth):
        a = answer(post, b, truth.baseline, DELTA, advise=False)
        claims = [(a.verdict.kind, a.pick, truth.baseline)] if a.verdict is not None else []
        judged = judge(truth, b, a.pick, a.decided, claims, truth.lengths[-1])
        i = post.index[a.pick]
        lo, hi = post.interval()
        true = truth.mean[truth.keys.index(a.pick), truth.lengths.index(truth.lengths[-1])]
        said.append({**judged, "covered": float(lo[i] <= true <= hi[i])})
    return said, cost / reference


def short_only(truth: Truth, values: np.ndarray) -> list[dict]:
    """Today's answer: every configuration at 3 seeds of the shortest length, one length, judged at the longest."""
    from explorer.decisions import answer
    from explorer.stats import summarize

    runs = {(k, s): truth.lengths[0] for k in truth.keys for s in range(3)}
    frame = frame_of(truth, values, runs).drop(columns=["rungs"]).assign(epochs=truth.lengths[0])
    post = summarize(frame, "accuracy", OBJECTIVES, draws=0).attrs["posterior"]
    return [judge(truth, b, answer(post, b, truth.baseline, DELTA, advise=False).pick, False, [], truth.lengths[-1])
            for b in questions(truth)]


def random_pick(truth: Truth, rep: int) -> list[dict]:
    rng = np.random.default_rng([99, list(TABLES).index(truth.name), rep])
    return [judge(truth, b, str(rng.choice([k for k in truth.keys if truth.params[k] <= b])), False, [], truth.lengths[-1])
            for b in questions(truth)]


def job(args: tuple[str, str, int, int]) -> tuple[str, str, list[dict], list[float]]:
    policy, name, start, stop = args
    truth = load(name)
    rows, costs = [], []
    for rep in range(start, stop):
        values = simulate(truth, CAP, rep)
        if policy == "decide":
            said, cost = study(truth, values, truth.lengths, truth.lengths[-1])
            costs.append(cost)
        elif policy == "reach":
            trained = [e for e in truth.lengths if e <= truth.lengths[-1] / 2]
            said, cost = study(truth, values, trained, truth.lengths[-1]) if len(trained) > 1 else ([], 0.0)
            costs.append(cost)
        elif policy == "short":
            said = short_only(truth, values)
        else:
            said = random_pick(truth, rep)
        rows += said
    return policy, name, rows, costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    names = ["lengths"] if args.quick else list(TABLES)
    reps = 2 if args.quick else args.reps
    policies = ("decide", "short", "random") if args.quick else ("decide", "reach", "short", "random")
    chunk = max(1, reps // 4)
    work = [(p, n, a, min(a + chunk, reps)) for p in policies for n in names for a in range(0, reps, chunk)]
    start = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        done = list(pool.map(job, work))
    results: dict[tuple[str, str], tuple[list[dict], list[float]]] = {}
    for policy, name, rows, costs in done:
        got = results.setdefault((policy, name), ([], []))
        got[0].extend(rows)
        got[1].extend(costs)
    print(f"{reps} simulated studies per table; target: each table's longest length; delta {100 * DELTA:g} point; "
          f"cap {CAP} seeds per length ({time.perf_counter() - start:.0f} s)")
    line = {}
    for name in names:
        truth = load(name)
        print(f"{TABLES[name][0]}: lengths {truth.lengths}, {len(truth.keys)} configurations, run noise correlation across "
              f"lengths {truth.corr:.2f}")
        for policy in policies:
            rows, costs = results.get((policy, name), ([], []))
            if not rows:
                print(f"  {policy:>7}: (nothing to train below half the target)")
                continue
            f = pd.DataFrame(rows)
            decided = f["decided"].mean()
            false = f["false"].sum() / max(f["decided"].sum(), 1)
            extra = (f"decided {decided:.2f} false {false:.3f} compute {np.mean(costs):.2f} " if policy in ("decide", "reach")
                     else "")
            cover = f" coverage {f['covered'].mean():.2f}" if "covered" in f else ""
            print(f"  {policy:>7}: within 1 point {f['within'].mean():.2f} {extra}regret {f['regret'].mean():.2f} "
                  f"± {1.96 * f['regret'].std(ddof=1) / np.sqrt(len(f)):.2f}{cover}")
            line[(policy, name)] = (f["within"].mean(), decided, false, np.mean(costs) if costs else np.nan)
    w, d, fa, c = line[("decide", names[0])]
    print(f"lengths within {w:.2f} short {line[('short', names[0])][0]:.2f} decided {d:.2f} false {fa:.3f} compute {c:.2f}")


if __name__ == "__main__":
    main()
