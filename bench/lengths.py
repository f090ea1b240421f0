"""Is the promise kept at the length the user will train? Simulated studies with a known truth at every length.

    python bench/lengths.py [--reps 100] [--jobs 2] [--workers 4] [--tables lengths,fidelity,drift] [--quick]

Every answer explorer gives is a promise: "use X: within eps of the best configuration within the budget
(95%)". This bench measures it where the user will train: a study trains a ladder of lengths, answers at its
longest (the target), and each answer is judged against the truth at the target:

- cover: eps coverage, the share of answers whose true regret at the target is at most eps, over all answers
  and over the decided ones (a selection effect lives there), printed `cover ALL / DECIDED`;
- within: the share whose pick is within delta (1 point) of the target's true best within the budget;
- decided: the share with eps <= delta (and explorer's other conditions); false: decided answers whose claim
  is false (true regret > delta, or the verdict against the baseline);
- compute: seconds of training as a share of the brute force's (every configuration at 3 seeds of the target),
  a continued run paying only the epochs past its shorter run's cooldown start (explorer.budget.Budget.compute);
- regret: the pick's true regret at the target, points.

The tables (simulators). None is explorer's model: the noise is added on the metric's scale, not the logit's.
- `lengths`: the means of `digits-vit-lengths` (24 configurations x 4 seeds, one warmup-stable-decay run of 40
  epochs each, its 10- and 20-epoch results cooldown branches: bench/build_tables.py); a run is the truth, a
  seed effect shared by every configuration at that seed (its sd at each length the table's, the same draw at
  every rung), and the configuration's own Gaussian noise at each length (the table's sd), one correlation for
  every pair of its rungs (the table's).
- `fidelity`: the means of `digits-vit-fidelity` (24 x 3 at 20 and 60 epochs, separate cosine runs on a GPU):
  its rungs are separate runs (no continuation), their noise independent but for the seed effect; the ranking
  crosses with length (Kendall's tau 0.45 between the two lengths' means).
- `drift`, misspecified on purpose: the `lengths` means with the gains from 10 to 40 epochs scrambled per
  configuration (not smooth in layers and heads: Kendall's tau between the 10- and 40-epoch truths at most that
  of `fidelity`), noise t-distributed with 4 degrees of freedom, a run's noise and the seed effect each a walk
  over the rungs (correlation 0.5 between neighbouring rungs, 0.25 two apart: nearer lengths correlate more).

Each study goes through explorer's loop: every configuration once at the shortest length (seed 0), then rounds
of the `decide` policy (explorer.replicates.wanted_keys on explorer.stats.summarize's posterior over
(configuration, length)), each handing out up to `--workers` runs, a longer run of a seed continuing it
(explorer.budget.Budget.continues), up to 4 seeds per length; then the answer at the 10 default budgets.
Floors, each judged at the target in the same run:
- `short`: every configuration at 3 seeds of the shortest length, answered there (one length);
- `uniform`: the brute force, every configuration at 3 seeds of the target, answered by explorer's posterior;
- `asha`: successive halving over the ladder (eta = 2 within each budget's configurations, runs continued,
  brackets of fresh seeds) at the compute explorer spent on the same study, answering with the best mean at the
  target among its survivors within the budget;
- `random`: a random pick within the budget.
`reach` (the `lengths` table only: explorer.transfer.LENGTH_REACH) is explorer's loop trained at the lengths up to
half the target (10 and 20 epochs) and answered at the target (40), judged the same way.

The last line: `lengths within W asha A uniform U decided D false F cover E compute C` for the first table, E
the lower of its two coverages; each table's own line above it. Targets (issue 41): cover >= 0.95 on every
table; within >= 0.9 and at least asha's and uniform's; decided >= 0.6; false <= 0.05; compute <= 0.5. The
timing line `policy round: S24 s at 24 configurations, S500 s at 500` measures one round of the policy (the
posterior and the choice). `--quick` runs 2 studies of the first table (for tests/test_bench.py): its figures
mean nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy import special, stats  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.decide import budgets, questions, truth_of  # noqa: E402  (the same budgets and judging as bench/decide.py)
from explorer.budget import Budget  # noqa: E402

DATA = ROOT / "bench" / "data"
N_TEST = 360
DELTA = 0.01
CAP = 4
UNIFORM_SEEDS = 3
OBJECTIVES = [("accuracy", "maximize"), ("params", "minimize")]
DRIFT_SEEDS = {"drift": 20261207, "heldout": 7}  # the generators of the scrambled gains (heldout: kept out of every choice)


@dataclass(frozen=True)
class Truth:
    """A simulator: the true mean of every configuration at every length, and how its runs scatter."""

    name: str
    keys: list[str]
    lengths: list[int]
    params: dict[str, int]
    dims: dict[str, dict[str, int]]
    mean: np.ndarray  # (configurations, lengths), metric units
    sd: np.ndarray  # each configuration's own noise at each length
    seed_sd: np.ndarray  # the seed effect's sd at each length
    corr: np.ndarray  # (lengths, lengths): one run's noise across its rungs
    seed_corr: np.ndarray  # the seed effect's across lengths
    heavy: bool  # t(4) noise instead of Gaussian
    per_epoch: dict[str, float]  # seconds per epoch trained
    baseline: str
    wsd: bool  # one run per seed gives every rung (continued); else each length a separate run

    @property
    def budget(self) -> Budget:
        return Budget(epochs=self.lengths, schedule="wsd" if self.wsd else "cosine", cooldown=0.2)

    @property
    def target(self) -> int:
        return self.lengths[-1]

    def at(self, length: int) -> dict[str, float]:
        return dict(zip(self.keys, self.mean[:, self.lengths.index(length)]))


def _frame(table: str) -> pd.DataFrame:
    return pd.read_csv(DATA / f"{table}.csv.gz")


def _table(name: str, table: str, baseline: str, wsd: bool) -> Truth:
    """A table's means, each configuration's sd per length, the seed effect's sd, and one pooled rung correlation."""
    frame = _frame(table)
    keys, lengths = sorted(frame["key"].unique()), sorted(int(e) for e in frame["epochs"].unique())
    first = frame.groupby("key").first()
    mean = frame.pivot_table(index="key", columns="epochs", values="metric").loc[keys, lengths].to_numpy()
    resid = frame.assign(r=frame["metric"] - frame.groupby(["key", "epochs"])["metric"].transform("mean"))
    seed_sd = np.array([np.sqrt(max(0.0, g.groupby("seed")["r"].mean().var(ddof=1) - g["r"].var(ddof=1) / len(keys)))
                        for _, g in resid.groupby("epochs")])  # 2.6 points at 10 epochs, 0.1 at 40: it fades
    own = resid.groupby(["key", "epochs"])["r"].std(ddof=1).unstack().loc[keys, lengths].to_numpy()
    k = len(lengths)
    if wsd:
        wide = resid.pivot_table(index=["key", "seed"], columns="epochs", values="r")
        rho = float(np.clip(np.nanmean([wide[a].corr(wide[b]) for i, a in enumerate(lengths) for b in lengths[i + 1:]]), 0, 0.95))
        corr = rho * np.ones((k, k)) + (1 - rho) * np.eye(k)
    else:
        corr = np.eye(k)
    budget = Budget(epochs=lengths, schedule="wsd" if wsd else "cosine", cooldown=0.2)
    trained = frame["epochs"].map(lambda e: budget.compute(int(e)) if not wsd else budget.compute(lengths[-1]))
    per_epoch = (frame["train_time_s"] / trained).groupby(frame["key"]).median().to_dict()
    dims = {k_: {d: int(first.loc[k_, d]) for d in ("layers", "heads", "width", "mlp")} for k_ in keys}
    return Truth(name, keys, lengths, {k_: int(first.loc[k_, "params"]) for k_ in keys}, dims, mean, np.maximum(own, 1e-3),
                 seed_sd, corr, np.ones((k, k)), False, per_epoch, baseline, wsd)


def _walk(k: int, rho: float) -> np.ndarray:
    """Correlation rho^|i - j| between rungs i and j: a walk over the ladder, nearer lengths correlating more."""
    i = np.arange(k)
    return rho ** np.abs(i[:, None] - i[None, :])


def _drift(name: str) -> Truth:
    """`lengths` misspecified: scrambled gains with length, t(4) noise, walks over the rungs. `heldout` is drawn
    like `drift` from another generator, its gains linear in log epochs, and was run only to confirm settings
    chosen on the other tables."""
    base = _table("lengths", "digits-vit-lengths", "layers=6,heads=2", True)
    logit = special.logit(np.clip(base.mean, 1e-3, 1 - 1e-3))
    z = np.random.default_rng(DRIFT_SEEDS[name]).standard_normal(len(base.keys))
    reach = np.log(np.array(base.lengths) / base.lengths[0]) / np.log(base.lengths[-1] / base.lengths[0])
    shift = np.sqrt(reach) * 0.9 if name == "drift" else reach  # drift: most of the crossing early
    for scale in np.linspace(0.2, 3.0, 57):  # the least scramble whose 10- and 40-epoch truths cross as fidelity's do
        mean = special.expit(logit + scale * np.outer(z, shift))
        if stats.kendalltau(mean[:, 0], mean[:, -1])[0] <= 0.40:
            break
    k = len(base.lengths)
    return replace(base, name=name, mean=mean, corr=_walk(k, 0.5), seed_corr=_walk(k, 0.5), heavy=True)


def load(name: str) -> Truth:
    if name == "lengths":
        return _table(name, "digits-vit-lengths", "layers=6,heads=2", True)
    if name == "fidelity":
        return _table(name, "digits-vit-fidelity", "layers=6,heads=2", False)
    return _drift(name)


TABLES = ("lengths", "fidelity", "drift", "heldout")


def simulate(truth: Truth, seeds: int, rep: int) -> np.ndarray:
    """(configurations, seeds, lengths) fresh runs: every rung of every run, inside [0, 1] in steps of 1/360."""
    rng = np.random.default_rng([TABLES.index(truth.name), rep])
    n, k = len(truth.keys), len(truth.lengths)

    def noise(shape: tuple[int, ...], corr: np.ndarray) -> np.ndarray:
        root = np.linalg.cholesky(corr + 1e-12 * np.eye(k))
        z = rng.standard_t(4, size=(*shape, k)) / np.sqrt(2.0) if truth.heavy else rng.standard_normal((*shape, k))
        return z @ root.T

    b = truth.seed_sd * noise((seeds,), truth.seed_corr)  # (seeds, lengths)
    x = truth.mean[:, None, :] + b[None] + truth.sd[:, None, :] * noise((n, seeds), truth.corr)
    return np.clip(np.round(x * N_TEST) / N_TEST, 0, 1)


class Ladder:
    """The runs of one simulated study: each (configuration, seed)'s lengths, their values and what they cost."""

    def __init__(self, truth: Truth, values: np.ndarray):
        self.truth, self.values = truth, values
        self.runs: dict[tuple[str, int], list[int]] = {}
        self.seconds = 0.0

    def measured(self, key: str) -> dict[int, list[int]]:
        return {s: e for (k, s), e in self.runs.items() if k == key}

    def train(self, key: str, length: int) -> bool:
        """One more run of `key` at `length`, on the seed explorer's queue would take; False at the cap."""
        budget = self.truth.budget
        got = budget.continues(length, self.measured(key), list(range(CAP)))
        if got is None:
            return False
        seed, after = got
        self.seconds += self.truth.per_epoch[key] * budget.compute(length, after)
        done = self.runs.setdefault((key, seed), [])
        done.append(length)
        return True

    def frame(self) -> pd.DataFrame:
        """The study's trials as explorer stores them: under wsd one per (configuration, seed, run), its rungs."""
        truth, rows = self.truth, []
        for (key, seed), lengths in self.runs.items():
            i = truth.keys.index(key)
            start = None
            for length in sorted(lengths):
                reached = [e for e in truth.lengths if (start or 0) < e <= length] if truth.wsd else [length]
                rungs = {e: float(self.values[i, seed, truth.lengths.index(e)]) for e in reached}
                rows.append({"state": "COMPLETE", "arch": key, "seed": seed, "epochs": length, "rungs": rungs,
                             "accuracy": rungs[length], "params": truth.params[key], **truth.dims[key],
                             "resumed_from": start, "train_time_s": truth.per_epoch[key] * truth.budget.compute(length, start)})
                start = length if truth.wsd else None
        return pd.DataFrame(rows)

    def mean_at(self, key: str, length: int) -> float | None:
        i, j = self.truth.keys.index(key), self.truth.lengths.index(length)
        got = [self.values[i, s, j] for (k, s), e in self.runs.items() if k == key and
               (max(e) >= length if self.truth.wsd else length in e)]
        return float(np.mean(got)) if got else None


def judge(truth: Truth, budget: int, pick: str, eps: float = float("nan"), decided: bool = False,
          claims: tuple[tuple[str, str, str], ...] = ()) -> dict:
    regret, false = truth_of(truth.at(truth.target), truth.params, budget, pick, list(claims), DELTA)
    return {"within": float(regret <= DELTA + 1e-12), "decided": float(decided), "false": float(decided and false),
            "regret": 100 * regret, "covered": float(regret <= eps + 1e-12) if np.isfinite(eps) else np.nan}


def posterior(ladder: Ladder, target: int, lengths: list[int]):  # noqa: ANN201 - (posterior at target, full)
    from explorer.stats import summarize

    table = summarize(ladder.frame(), "accuracy", OBJECTIVES, draws=0, epochs=target, lengths=lengths,
                      budget=ladder.truth.budget, seeds=list(range(CAP)))
    return table.attrs["posterior"], table.attrs["full"]


def answers(truth: Truth, ladder: Ladder, lengths: list[int]) -> list[dict]:
    """explorer's answer at every question, judged at the target."""
    from explorer.decisions import answer

    post, full = posterior(ladder, truth.target, lengths)
    out = []
    for b in questions(truth):
        a = answer(post, b, truth.baseline, DELTA, advise=False, full=full, epochs=truth.target)
        claims = ((a.verdict.kind, a.pick, truth.baseline),) if a.verdict is not None else ()
        out.append(judge(truth, b, a.pick, a.eps, a.decided, claims))
    return out


def explorer_study(truth: Truth, values: np.ndarray, workers: int, lengths: list[int] | None = None) -> tuple[list[dict], float]:
    """One study through explorer's loop, trained at `lengths` (the table's by default), answered at the target."""
    from explorer import replicates
    from explorer.decisions import DecisionSpec
    from explorer.rows import split_row

    lengths = lengths or truth.lengths
    part = replace(truth, lengths=lengths, mean=truth.mean[:, :len(lengths)]) if lengths != truth.lengths else truth
    ladder = Ladder(part, values)
    for key in truth.keys:
        ladder.train(key, lengths[0])
    decision = DecisionSpec(delta=DELTA, max_seeds=CAP, epochs=part.target)  # reach: the policy buys for its longest
    at = budgets(truth)
    while True:
        post, full = posterior(ladder, part.target, lengths)
        more = replicates.wanted_keys(post, CAP, at, decision, truth.baseline, full, part.target, batch=workers)
        bought = [ladder.train(key, length or lengths[0]) for key, length in map(split_row, more)]
        if not any(bought):
            break
    said = answers(truth, ladder, lengths)
    return said, ladder.seconds / brute_seconds(truth)


def brute_seconds(truth: Truth) -> float:
    return sum(UNIFORM_SEEDS * truth.per_epoch[k] * truth.budget.compute(truth.target) for k in truth.keys)


def uniform(truth: Truth, values: np.ndarray) -> list[dict]:
    """The brute force: every configuration at 3 seeds of the target, answered by explorer's posterior."""
    ladder = Ladder(truth, values)
    for key in truth.keys:
        for _ in range(UNIFORM_SEEDS):
            ladder.train(key, truth.target)
    return answers(truth, ladder, truth.lengths)


def short(truth: Truth, values: np.ndarray) -> list[dict]:
    """Every configuration at 3 seeds of the shortest length, answered there (one length), judged at the target."""
    from explorer.decisions import answer

    one = replace(truth, lengths=truth.lengths[:1], mean=truth.mean[:, :1])
    ladder = Ladder(one, values)
    for key in truth.keys:
        for _ in range(UNIFORM_SEEDS):
            ladder.train(key, one.target)
    frame = ladder.frame().drop(columns=["rungs", "resumed_from"])
    from explorer.stats import summarize

    post = summarize(frame, "accuracy", OBJECTIVES, draws=0).attrs["posterior"]
    return [judge(truth, b, answer(post, b, truth.baseline, DELTA, advise=False).pick) for b in questions(truth)]


def asha(truth: Truth, values: np.ndarray, seconds: float) -> list[dict]:
    """Successive halving over the ladder at `seconds` of training: brackets of fresh seeds, each promoting the
    better half (by mean at the rung below, over every run there) of each budget's configurations, runs continued;
    the answer is the best mean at the target among the survivors within the budget (else at the longest rung)."""
    ladder = Ladder(truth, values)
    sets = [[k for k in truth.keys if truth.params[k] <= b] for b in questions(truth)]
    spent = lambda: ladder.seconds / brute_seconds(truth) >= seconds  # noqa: E731
    for _bracket in range(CAP):
        alive = list(truth.keys)
        for i, length in enumerate(truth.lengths):
            if i:
                below = truth.lengths[i - 1]
                score = {k: ladder.mean_at(k, below) for k in alive}
                alive = list(dict.fromkeys(k for s in sets for k in sorted((k for k in s if k in alive and score[k] is not None),
                                                                          key=lambda k: -score[k])[:max(1, -(-len([k for k in s if k in alive]) // 2))]))
            for key in alive:
                if spent():
                    break
                ladder.train(key, length)
        if spent():
            break
    out = []
    for b, inside in zip(questions(truth), sets):
        for length in reversed(truth.lengths):
            scored = {k: m for k in inside if (m := ladder.mean_at(k, length)) is not None}
            if scored:
                out.append(judge(truth, b, max(scored, key=scored.get)))
                break
    return out


def random_pick(truth: Truth, rep: int) -> list[dict]:
    rng = np.random.default_rng([99, TABLES.index(truth.name), rep])
    return [judge(truth, b, str(rng.choice([k for k in truth.keys if truth.params[k] <= b]))) for b in questions(truth)]


def job(args: tuple[str, int, int, int]) -> tuple[str, dict[str, list], dict[str, list[float]]]:
    name, start, stop, workers = args
    truth = load(name)
    rows: dict[str, list] = {}
    costs: dict[str, list[float]] = {}
    for rep in range(start, stop):
        values = simulate(truth, CAP, rep)
        said, cost = explorer_study(truth, values, workers)
        rows.setdefault("explorer", []).extend(said)
        costs.setdefault("explorer", []).append(cost)
        rows.setdefault("asha", []).extend(asha(truth, values, cost))
        rows.setdefault("uniform", []).extend(uniform(truth, values))
        rows.setdefault("short", []).extend(short(truth, values))
        rows.setdefault("random", []).extend(random_pick(truth, rep))
        if name == "lengths":  # the reach (explorer.transfer.LENGTH_REACH): trained to 20 epochs, answered at 40
            said, cost = explorer_study(truth, values, workers, [e for e in truth.lengths if e <= truth.target // 2])
            rows.setdefault("reach", []).extend(said)
            costs.setdefault("reach", []).append(cost)
    return name, rows, costs


def round_seconds(configs: int, repeat: int = 3) -> float:
    """The median seconds of one policy round (the posterior and the choice) on a study of `configs` configurations
    (the `lengths` table's widened by tiling, every configuration at seed 0 of the shortest length and a quarter at
    a second seed and at the target)."""
    from explorer import replicates
    from explorer.decisions import DecisionSpec

    base = load("lengths")
    tiles = -(-configs // len(base.keys))
    keys = [f"layers={d['layers'] + 6 * t},heads={d['heads']}" for t in range(tiles) for d in base.dims.values()][:configs]
    dims = {k: {"layers": int(k.split(",")[0].split("=")[1]), "heads": int(k.split("=")[-1]), "width": 64, "mlp": 128} for k in keys}
    params = {k: 3328 + 33472 * d["layers"] for k, d in dims.items()}
    mean = np.tile(base.mean, (tiles, 1))[:configs]
    truth = replace(base, keys=keys, dims=dims, params=params, mean=mean, sd=np.tile(base.sd, (tiles, 1))[:configs],
                    per_epoch={k: base.per_epoch[base.keys[i % len(base.keys)]] for i, k in enumerate(keys)})
    ladder = Ladder(truth, simulate(replace(truth, name="lengths"), CAP, 0))
    for i, key in enumerate(keys):
        ladder.train(key, truth.lengths[0])
        if i % 4 == 0:
            ladder.train(key, truth.lengths[0])
            ladder.train(key, truth.target)
    decision = DecisionSpec(delta=DELTA, max_seeds=CAP, epochs=truth.target)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        post, full = posterior(ladder, truth.target, truth.lengths)
        replicates.wanted_keys(post, CAP, budgets(truth), decision, truth.baseline, full, truth.target, batch=4)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def report(name: str, rows: dict[str, list], costs: dict[str, list[float]]) -> dict[str, float]:
    """Print one table's lines; its figures."""
    truth = load(name)
    tau = stats.kendalltau(truth.mean[:, 0], truth.mean[:, -1])[0]
    print(f"{name}: lengths {truth.lengths} ({'continued' if truth.wsd else 'separate runs'}), {len(truth.keys)} "
          f"configurations, Kendall's tau of the shortest and target truths {tau:.2f}, "
          f"{'t(4)' if truth.heavy else 'Gaussian'} noise")
    out: dict[str, float] = {}
    for policy in ("explorer", "reach", "uniform", "asha", "short", "random"):
        f = pd.DataFrame(rows.get(policy, []))
        if not len(f):
            continue
        within = f["within"].mean()
        half = 1.96 * f["regret"].std(ddof=1) / np.sqrt(len(f))
        extra = ""
        if policy in ("explorer", "reach", "uniform"):
            decided = f["decided"].mean()
            false = f["false"].sum() / max(f["decided"].sum(), 1)
            cover_all = f["covered"].mean()
            cover_dec = f.loc[f["decided"] > 0, "covered"].mean() if f["decided"].sum() else float("nan")
            extra = f" decided {decided:.2f} false {false:.3f} cover {cover_all:.2f} / {cover_dec:.2f}"
            if policy in costs:
                extra += f" compute {float(np.mean(costs[policy])):.2f}"
            if policy == "explorer":
                out.update(decided=decided, false=false, cover=float(np.nanmin([cover_all, cover_dec])),
                           compute=float(np.mean(costs["explorer"])))
        print(f"  {policy:>8}: within 1 point {within:.2f} regret {f['regret'].mean():.2f} ± {half:.2f}{extra}")
        out[policy] = within
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=100, help="simulated studies per table")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=4, help="runs a policy round hands out (free workers)")
    parser.add_argument("--tables", default=",".join(TABLES))
    parser.add_argument("--quick", action="store_true", help="2 studies of the first table, no timing (a smoke test)")
    args = parser.parse_args()
    names = args.tables.split(",")[:1] if args.quick else args.tables.split(",")
    reps = 2 if args.quick else args.reps
    chunk = max(1, min(10, reps // max(1, args.jobs)))
    work = [(n, a, min(a + chunk, reps), args.workers) for n in names for a in range(0, reps, chunk)]
    start = time.perf_counter()
    results: dict[str, tuple[dict[str, list], dict[str, list[float]]]] = {}
    with ProcessPoolExecutor(args.jobs) as pool:
        for name, rows, costs in pool.map(job, work):
            got = results.setdefault(name, ({}, {}))
            for policy, said in rows.items():
                got[0].setdefault(policy, []).extend(said)
            for policy, c in costs.items():
                got[1].setdefault(policy, []).extend(c)
    print(f"{reps} simulated studies per table, each answered at its target length; delta {100 * DELTA:g} point; cap "
          f"{CAP} seeds per length; {args.workers} runs a round ({time.perf_counter() - start:.0f} s)")
    figures = {name: report(name, *results[name]) for name in names}
    if not args.quick:
        print(f"policy round: {round_seconds(24):.2f} s at 24 configurations, {round_seconds(500, 1):.2f} s at 500")
    for name in [*names[1:], names[0]]:  # the first table's line last
        f = figures[name]
        print(f"{name} within {f['explorer']:.2f} asha {f['asha']:.2f} uniform {f['uniform']:.2f} decided "
              f"{f['decided']:.2f} false {f['false']:.3f} cover {f['cover']:.2f} compute {f['compute']:.2f}")


if __name__ == "__main__":
    main()
