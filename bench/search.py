"""Samplers replayed against complete tables of real runs: which one finds the budget front fastest.

    python bench/search.py [--seeds 20] [--prune-seeds 60] [--jobs 2] [--samplers budget-ei,tpe] [--pruners dominated:0.5]

For each table under bench/data/ (every configuration of a space trained at several seeds by
bench/build_tables.py) each sampler runs an Optuna study (maximize the metric, minimize parameters)
whose trials are answered from the table: a query of a configuration returns one of its replicates
at random, so the noise is the real one. A configuration proposed again is answered with its first
result and does not count as an evaluation (as in a study); a sampler gets at most 4 asks per
evaluation. At 10%, 25% and 50% of the grid's evaluations it prints, as means over optimizer seeds:

- budget regret: at 10 budgets log-uniform over the parameter range, the true (replicate-mean) metric
  of the best configuration within the budget minus that of the configuration the study would
  recommend (its best measured one within the budget), averaged over budgets, in metric points;
- normalised hypervolume: of the measured configurations' true metrics against log-parameters,
  over that of the table's whole true front;

with ratios against Optuna's RandomSampler over `arch`, and a replay's CPU seconds. `tpe-constraints` is
TPE left to learn feasibility from Optuna's constraints (`propose_constrained`) instead of explorer's
repair step. Then the same default sampler with and
without each pruner of `--pruners` (explorer.pruning, replayed on the per-epoch curves; a pruned
trial stores its curve so far, as in a study): epochs spent to reach (within 10%) the regret the
unpruned run has after 10/25/50% of the grid, the regret of each at equal epochs, and the paired
difference at 0.7x the epochs. Last, from the tables alone: Kendall's tau between the ranking
after e epochs and after all epochs, within parameter bins, the evidence both short runs and
pruning rest on.

Workers run one BLAS and one torch thread each (`--jobs` processes are the parallelism); the last line
gives the run's wall time and, from the replays' CPU time, what it takes on idle cores (the default
run: 700 replays, 5 CPU-minutes, about 2.5 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import optuna
from scipy.stats import kendalltau
from scipy.stats import t as student_t

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.build_tables import read_table  # noqa: E402
from explorer.pareto import hypervolume, pareto_mask  # noqa: E402
from explorer.pruning import BinnedPruner, Peer, bin_edges  # noqa: E402
from explorer.sampling import ArchEncoding, BudgetSampler, Encoding, FeasibleSampler  # noqa: E402
from explorer.space import Config, load_space  # noqa: E402

TABLES = {"digits-vit": "spaces/vit-digits.yaml", "digits-wide": "spaces/digits-wide.yaml"}
FRACTIONS = (0.10, 0.25, 0.50)
BUDGETS = 10
ASKS_PER_EVAL = 4
DEFAULT = "budget-ei"  # explorer's default sampler (explorer.study.SamplerSpec)
# ablations that settle a design question at a glance but cost the most per replay (gp 20x budget-ei): fewer seeds
FEW_SEEDS = ("gp", "tpe-repeats")
# (rule, warmup as a fraction of the epochs[, margin[, startup[, noise]]]); the last is explorer's setting since issue 20,
# fixed before it was measured: noise 0.018 is the tables' median replicate sd (1.79 points on both), not tuned here
PRUNERS = (("median", 0.5), ("dominated", 0.5, 0.01), ("dominated", 0.5, 0.01, 3, 0.018))
SAVED = 0.7  # pruning's target: 30% fewer epochs for at most 10% more regret


@dataclass
class Table:
    """A table's truth: per configuration its replicates (final metric, curve) and their mean."""

    name: str
    encoding: Encoding
    arch: ArchEncoding
    replicates: dict[str, list[tuple[float, list[float]]]]
    mean: dict[str, float]
    params: dict[str, int]

    @classmethod
    @functools.lru_cache(maxsize=4)  # once per worker process
    def load(cls, name: str, data: Path = ROOT / "bench" / "data") -> "Table":
        space = load_space(ROOT / TABLES[name])
        frame = read_table(Path(data) / f"{name}.csv.gz")
        reps: dict[str, list] = {}
        for row in frame.itertuples():
            reps.setdefault(row.key, []).append((float(row.metric), list(row.curve)))
        enc = Encoding(space)
        missing = [c.key for c in enc.configs if c.key not in reps]
        if missing:
            raise SystemExit(f"{name}: {len(missing)} configurations missing from the table (rebuild it)")
        return cls(name, enc, ArchEncoding(space), reps, {k: float(np.mean([m for m, _ in v])) for k, v in reps.items()},
                   {c.key: c.params for c in enc.configs})

    def budgets(self) -> np.ndarray:
        p = np.array(list(self.params.values()), dtype=float)
        return np.exp(np.linspace(np.log(p.min()), np.log(p.max()), BUDGETS))

    def regret(self, measured: dict[str, float]) -> float:
        """Mean over budgets of (true best within budget) - (true metric of the measured best within budget)."""
        out = []
        for b in self.budgets():
            inside = [k for k, p in self.params.items() if p <= b * (1 + 1e-9)]
            truth = max(self.mean[k] for k in inside)
            mine = [k for k in measured if self.params[k] <= b * (1 + 1e-9)]
            pick = max(mine, key=lambda k: measured[k]) if mine else min(inside, key=self.mean.get)
            out.append(truth - self.mean[pick])
        return 100 * float(np.mean(out))

    def front(self) -> set[str]:
        """The configurations on the true front: no configuration with no more parameters has a higher true mean."""
        keys = list(self.params)
        mask = pareto_mask(np.array([[self.mean[k], self.params[k]] for k in keys]), ["maximize", "minimize"])
        return {k for k, on in zip(keys, mask) if on}

    def hypervolume(self, keys: list[str]) -> float:
        """Hypervolume of `keys` at their true metrics and log parameters, over the whole table's."""
        lp = {k: math.log(p) for k, p in self.params.items()}
        ref = [min(self.mean.values()), max(lp.values())]
        def hv(ks: list[str]) -> float:
            if not ks:
                return 0.0
            pts = np.array([[self.mean[k], lp[k]] for k in ks])
            return hypervolume(pts, ["maximize", "minimize"], ref)
        return hv(keys) / hv(list(self.params))


def samplers(table: Table, seed: int) -> dict[str, Callable[[], optuna.samplers.BaseSampler]]:
    enc = table.encoding
    tpe = lambda **kw: optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True, **kw)  # noqa: E731
    return {
        "random-arch": lambda: optuna.samplers.RandomSampler(seed=seed),
        "nsga2-arch": lambda: optuna.samplers.NSGAIISampler(population_size=8, seed=seed),
        "nsga2": lambda: FeasibleSampler(enc, optuna.samplers.NSGAIISampler(population_size=8, seed=seed), seed),
        "tpe": lambda: FeasibleSampler(enc, tpe(), seed),
        "tpe-repeats": lambda: FeasibleSampler(enc, tpe(), seed, avoid_taken=False),
        "tpe-constraints": lambda: tpe(),  # told infeasible combinations by `propose_constrained`
        "gp": lambda: FeasibleSampler(enc, optuna.samplers.GPSampler(seed=seed), seed),
        "budget-ei": lambda: BudgetSampler(enc, 0, True, seed=seed),
    }


def propose_constrained(trial: optuna.Trial, enc: Encoding) -> Config | None:
    """`tpe-constraints`' proposal: each free dimension by its index among the values the space's
    configurations take (so every value proposed exists), and the combination marked infeasible by
    Optuna's constraint (`Trial.set_constraint`, which TPE reads as `constraints_func` did before
    Optuna 5 deprecated it) when no configuration has it (heads that do not divide the width, say).
    None for an infeasible combination."""
    params = {}
    for d in enc.dims:
        values = sorted({c[d] for c in enc.configs})
        params[d] = values[trial.suggest_int(f"{d}_index", 0, len(values) - 1)]
    cfg = enc.config(params)
    trial.set_constraint("feasible", 0.0 if cfg is not None else 1.0)
    return cfg


def make_pruner(table: Table, rule: str, warmup: float, margin: float = 0.0, startup: float = 3, noise: float = 0.0) -> BinnedPruner:
    """A pruner as a study would build it; `warmup` is a fraction of the table's epochs."""
    full = len(next(iter(table.replicates.values()))[0][1])
    edges = bin_edges(list(table.params.values()), 3)
    return BinnedPruner(rule, True, edges, warmup=max(1, round(warmup * full)), startup=int(startup), margin=margin,
                        epochs=full, noise=noise)


def replay(table_name: str, sampler: str, seed: int, prune: tuple | None, data: str, last: float = FRACTIONS[-1]) -> dict:
    """One optimizer seed of one sampler on one table: regret, hypervolume, epochs at each fraction."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore")
    table = Table.load(table_name, Path(data))
    n = len(table.params)
    marks = sorted({max(1, math.ceil(f * n)) for f in FRACTIONS if f <= last})
    rng = np.random.default_rng(10_000 + seed)
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=samplers(table, seed)[sampler]())
    enc = table.arch if sampler.endswith("-arch") else table.encoding
    pruner = make_pruner(table, *prune) if prune else None
    first: dict[str, list[float]] = {}  # the first answer given for each configuration
    measured: dict[str, float] = {}  # complete (not pruned) configurations' measured metric
    peers: list[Peer] = []
    cut: list[str] = []  # configurations pruned
    epochs, asks, out, trace = 0, 0, {}, []
    full = len(next(iter(table.replicates.values()))[0][1])  # epochs of an unpruned run
    start = time.process_time()

    def more() -> bool:  # a pruned run goes on until it spent the epochs the unpruned one spends at the last mark
        enough = epochs >= full * marks[-1] if prune else len(first) >= marks[-1]
        return not enough and len(first) < n and asks < ASKS_PER_EVAL * marks[-1] * (full if prune else 1)

    while more():
        asks += 1
        trial = study.ask()
        if sampler == "tpe-constraints":
            cfg = propose_constrained(trial, enc)
            if cfg is None:  # told as infeasible; costs no training and no evaluation
                study.tell(trial, [min(table.mean.values()), max(table.params.values())])
                continue
        else:
            cfg = enc.suggest(trial)
        key = cfg.key
        if key in first:  # a repeat: answered with the stored result, no evaluation spent
            if key in measured:
                study.tell(trial, [measured[key], cfg.params])
            else:
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        metric, curve = table.replicates[key][int(rng.integers(len(table.replicates[key])))]
        first[key] = curve
        done = len(curve)
        if pruner:
            for e in range(1, len(curve)):
                if pruner.should_prune(e, curve[e - 1], cfg.params, peers, key):
                    done = e
                    break
        epochs += done
        peers.append(Peer(cfg.params, curve[:done], key))
        trial.set_user_attr("curve", curve[:done])  # as a study stores it: BudgetSampler learns from pruned trials
        if done < len(curve):
            cut.append(key)
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            measured[key] = metric
            study.tell(trial, [metric, cfg.params])
        if sampler == DEFAULT:
            trace.append((epochs, table.regret(measured)))
        if len(first) in marks and len(first) not in out:
            out[len(first)] = {"regret": table.regret(measured), "hv": table.hypervolume(list(measured)), "epochs": epochs,
                               "asks": asks}
    for m in marks:  # a sampler that ran out of asks keeps its last state
        out.setdefault(m, {"regret": table.regret(measured), "hv": table.hypervolume(list(measured)), "epochs": epochs, "asks": asks})
    return {"table": table_name, "sampler": sampler, "seed": seed, "prune": prune, "marks": out, "trace": trace,
            "cpu_s": time.process_time() - start, "full": full, "empty": table.regret({}), "cut": cut}


def _one_thread() -> None:
    """A pool worker's BLAS (numpy, scikit-learn's GP in budget-ei) and torch (Optuna's GPSampler) run one
    thread each: the workers are the parallelism. With their defaults, a thread per core in each worker,
    a replay cost 5-10x the CPU time (budget-ei) and 12x (gp) on a busy 2-core machine."""
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)
    threadpool_limits(1)


def _regret_at(results: list[dict], epochs: float) -> float:
    """Mean over seeds of the regret after the last evaluation finished within `epochs`."""
    out = []
    for r in results:
        within = [reg for e, reg in r["trace"] if e <= epochs]
        out.append(within[-1] if within else r["empty"])
    return float(np.mean(out))


def _paired(pruned: list[dict], unpruned: list[dict], epochs: float, spent: float) -> tuple[float, float]:
    """Mean and 95% t half-width over optimizer seeds of pruned regret at `epochs` minus unpruned at `spent`."""
    base = {r["seed"]: r for r in unpruned}
    d = np.array([_regret_at([r], epochs) - _regret_at([base[r["seed"]]], spent) for r in pruned if r["seed"] in base])
    return float(d.mean()), float(student_t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d)))


def kendall(table: Table, bins: int = 3) -> dict[int, float]:
    """Mean over parameter bins of Kendall's tau between the replicate-mean metric at epoch e and at the end."""
    keys = list(table.params)
    curves = {k: np.mean([c for _, c in table.replicates[k]], axis=0) for k in keys}
    epochs = len(next(iter(curves.values())))
    edges = bin_edges([table.params[k] for k in keys], bins)
    which = np.searchsorted(edges, [table.params[k] for k in keys], side="right")
    out = {}
    for e in sorted({1, 2, 3, max(1, epochs // 4), max(1, epochs // 2), epochs - 1} - {epochs}):
        taus = []
        for b in np.unique(which):
            ks = [k for k, w in zip(keys, which) if w == b]
            taus.append(kendalltau([curves[k][e - 1] for k in ks], [curves[k][-1] for k in ks]).statistic)
        out[e] = float(np.mean(taus))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--few-seeds", type=int, default=5, help=f"seeds of the slow ablations {', '.join(FEW_SEEDS)}")
    parser.add_argument("--gp-last", type=float, default=0.25, help="GPSampler stops at this fraction of the grid")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--tables", default=",".join(TABLES))
    parser.add_argument("--samplers", default=None, help="comma-separated subset")
    parser.add_argument("--prune-seeds", type=int, default=60, help="optimizer seeds of the pruning comparison (paired)")
    parser.add_argument("--pruners", default=",".join(":".join(map(str, p)) for p in PRUNERS),
                        help="rule:warmup[:margin[:startup]], comma-separated; warmup is a fraction of the epochs")
    parser.add_argument("--data", default=str(ROOT / "bench" / "data"), help="the folder of the tables")
    parser.add_argument("--seed-offset", type=int, default=0, help="first optimizer seed (fresh seeds: not those a setting was chosen on)")
    args = parser.parse_args()
    start = time.perf_counter()
    tables = {name: Table.load(name, Path(args.data)) for name in args.tables.split(",")}
    names = args.samplers.split(",") if args.samplers else list(samplers(next(iter(tables.values())), 0))
    def seeds(sampler: str) -> int:  # the default also pairs with each pruner's replays
        return args.few_seeds if sampler in FEW_SEEDS else max(args.seeds, args.prune_seeds) if sampler == DEFAULT else args.seeds

    jobs = [(t, s, seed, False, args.data, args.gp_last if s == "gp" else FRACTIONS[-1])
            for t in tables for s in names for seed in range(args.seed_offset, args.seed_offset + seeds(s))]
    jobs.sort(key=lambda job: job[1] not in FEW_SEEDS)  # the slow ones first, so the pool ends together
    pruners = [_pruner_arg(text) for text in args.pruners.split(",") if text]
    jobs += [(t, DEFAULT, seed, p, args.data, FRACTIONS[-1]) for t in tables for p in pruners
             for seed in range(args.seed_offset, args.seed_offset + args.prune_seeds)]
    with ProcessPoolExecutor(args.jobs, initializer=_one_thread) as pool:
        results = list(pool.map(replay, *zip(*jobs), chunksize=1))
    for name, table in tables.items():
        _print_table(table, [r for r in results if r["table"] == name], names)
    cpu = sum(r["cpu_s"] for r in results)  # a busy machine stretches the wall time, hardly the CPU time
    print(f"\n{len(jobs)} replays in {(time.perf_counter() - start) / 60:.1f} min on {args.jobs} processes; "
          f"{cpu / 60:.1f} CPU-min of replays (on {args.jobs} idle cores: about {cpu / 60 / args.jobs:.1f} min)")


def _pruner_arg(text: str) -> tuple:
    rule, *rest = text.split(":")
    return (rule, *map(float, rest))


def _print_table(table: Table, results: list[dict], names: list[str]) -> None:
    n = len(table.params)
    sd = np.median([np.std([m for m, _ in r], ddof=1) for r in table.replicates.values() if len(r) > 1])
    counts = sorted({len(r) for r in table.replicates.values()})
    seeds = f"{counts[0]}-{counts[-1]}" if len(counts) > 1 else str(counts[0])
    print(f"\n== {table.name}: {n} configurations x {seeds} seeds; median replicate sd {100 * sd:.2f} points ==")
    marks = sorted(next(iter(results))["marks"])
    head = "".join(f"  {'regret@' + str(m):>14} {'x rnd':>5} {'HV@' + str(m):>6}" for m in marks)
    print(f"{'sampler':<24}{'seeds':>5}{head}  {'cpu s':>6}")
    def stats(rs: list[dict], m: int, what: str) -> tuple[float, float]:
        v = [r["marks"][m][what] for r in rs]
        return float(np.mean(v)), float(np.std(v))
    plain = [r for r in results if not r["prune"]]
    random = [r for r in plain if r["sampler"] == "random-arch"]
    for s in names:
        rs = [r for r in plain if r["sampler"] == s]
        if not rs:
            continue
        cells = ""
        for m in marks:
            if m not in rs[0]["marks"]:
                cells += f"  {'-':>14} {'':5} {'':6}"
                continue
            mean, spread = stats(rs, m, "regret")
            ratio = mean / stats(random, m, "regret")[0] if random and stats(random, m, "regret")[0] else float("nan")
            cells += f"  {mean:6.2f} ± {spread:5.2f} {ratio:5.2f} {stats(rs, m, 'hv')[0]:6.3f}"
        label = s + (" (default)" if s == DEFAULT else "")
        print(f"{label:<24}{len(rs):>5}{cells}  {np.mean([r['cpu_s'] for r in rs]):6.1f}")
    unpruned = [r for r in plain if r["sampler"] == DEFAULT]
    for prune in dict.fromkeys(r["prune"] for r in results if r["prune"]):
        pruned = [r for r in results if r["prune"] == prune]
        full = unpruned[0]["full"]
        rule, warmup, margin, startup, noise = (*prune, *("", 0.0, 0.0, 3, 0.0)[len(prune):])
        cut = [k for r in pruned for k in r["cut"]]
        front = table.front()
        print(f"pruning: {rule}, warmup {max(1, round(warmup * full))} of {full} epochs, margin {100 * margin:.1f} points, "
              f"startup {int(startup)}, noise sd {100 * noise:.1f} points, {DEFAULT}, {len(pruned)} seeds "
              f"{min(r['seed'] for r in pruned)}-{max(r['seed'] for r in pruned)}: {len(cut)} prunes, "
              f"{sum(k in front for k in cut)} of them of true-front configurations ({len(front)} on the true front)")
        for m in marks:
            spent = full * m  # what the unpruned run spends on m evaluations
            r0, r1 = _regret_at(unpruned, spent), _regret_at(pruned, spent)
            reach = next((e for e in range(1, spent + 1) if _regret_at(pruned, e) <= 1.1 * r0), None)
            saved = f"{reach} epochs ({reach / spent:.2f}x)" if reach else "not within them"
            d, half = _paired(pruned, unpruned, SAVED * spent, spent)
            print(f"  {spent:5} epochs (@{m}): regret {r0:5.2f} unpruned, {r1:5.2f} pruned; pruned reaches 1.1x the unpruned regret in {saved}; "
                  f"pruned at {SAVED:.1f}x the epochs minus unpruned: {d:+.2f} ± {half:.2f} (paired, 95%)")
    taus = kendall(table)
    print("Kendall's tau, ranking after e epochs vs all epochs, mean over 3 parameter bins: "
          + ", ".join(f"e={e}: {t:.2f}" for e, t in taus.items()))


if __name__ == "__main__":
    main()
