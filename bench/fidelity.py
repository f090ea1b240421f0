"""Do short runs pick what long runs pick? The default space at its study's epochs and at 3x them.

    python bench/fidelity.py train studies/digits-vit-trade.yaml --epochs 20,60 --seeds 0-2 --out T.csv
    python bench/fidelity.py [--table bench/data/digits-vit-fidelity.csv.gz] [--margin 0.01]

`train` trains every configuration of the study's space at each of `--epochs` and each seed, one
`explorer.train.run_trial` per row with the study's task and budget (only `epochs` and `seed` set),
`--jobs` spawned processes each on one torch thread, appending a row (bench/build_tables.py's columns)
to `--out` as soon as its run ends, so a run stopped at its time limit keeps every finished row and a
rerun skips them. It imports explorer's space, task and training modules only (not the study module,
which needs Optuna), so it runs on a machine that has torch and pydantic and nothing else of ours.

The comparison reads such a table: per configuration, the mean over the seeds that both epoch counts
measured, then `explorer.transfer.order_held` at the 10 budgets bench/stability.py uses (log-uniform
from the smallest configuration to the largest): Kendall's tau between the short and the long means,
and per budget whether the short runs' pick holds at the long budget (the same configuration, or one
whose long mean is within `--margin` of the long runs' best). The floor beside it: the share a pick
drawn at random among the configurations within the budget would hold; the ceiling: the same comparison
between the table's short runs and `--reference`, the same epochs and seeds trained elsewhere (the
committed 20-epoch table, CPU float32; the fidelity table ran on a GPU under bf16 autocast).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import multiprocessing
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.build_tables import COLUMNS, _seeds  # noqa: E402

TABLE = ROOT / "bench" / "data" / "digits-vit-fidelity.csv.gz"
BUDGETS = 10


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)


def _study(path: str) -> tuple[object, object, dict]:
    """The study's space, task and budget mapping, read without explorer.study (no Optuna needed)."""
    from explorer.space import load_space
    from explorer.tasks import get_task

    spec = yaml.safe_load(Path(path).read_text())
    space = load_space(Path(path).parent / spec["space"])
    options = {k: v for k, v in spec["task"].items() if k != "name"}
    return space, get_task(spec["task"]["name"], options, source=path), dict(spec["budget"])


def _run(study_path: str, key: str, seed: int, epochs: int, device: str) -> dict:
    """Train one configuration at one seed for `epochs`; the row of the table."""
    from explorer.conditioning import summary
    from explorer.train import Budget, run_trial

    space, task, budget_spec = _study(study_path)
    cfg = {c.key: c for c in space.configs()}[key]
    budget = Budget(**{**budget_spec, "seed": seed, "epochs": epochs})
    result = run_trial(cfg.family, cfg.dims, task, budget, device=device)
    dims = cfg.dims
    return {"key": key, **{d: dims.get(d) for d in ("layers", "heads", "width", "mlp")}, "params": cfg.params,
            "seed": seed, "metric": result.metric, "curve": json.dumps([round(v, 6) for v in result.curve]),
            "eval_loss": result.metrics["eval_loss"], "train_time_s": round(result.train_time_s, 3),
            "kappa_init": summary(result.kappa_init), "kappa_final": summary(result.kappa_final), "epochs": epochs}


def train(args: argparse.Namespace) -> None:
    """Every (configuration, seed, epochs) not yet in `--out`, seed by seed, longest runs first."""
    space, _, _ = _study(args.study)
    keys = [c.key for c in space.configs()][: args.limit]
    epochs = sorted((int(e) for e in args.epochs.split(",")), reverse=True)
    out = Path(args.out)
    done: set[tuple[str, int, int]] = set()
    if out.exists() and out.stat().st_size:
        prior = pd.read_csv(out)
        done = set(zip(prior["key"], prior["seed"].astype(int), prior["epochs"].astype(int)))
    todo = [(k, s, e) for s in _seeds(args.seeds) for e in epochs for k in keys if (k, s, e) not in done]
    print(f"{space.name}: {len(keys)} configurations x epochs {epochs}, {len(done)} runs stored, {len(todo)} to run "
          f"on {args.jobs} processes ({args.device})", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    new_file = not out.exists() or out.stat().st_size == 0
    start = time.perf_counter()
    with open(out, "a", newline="") as fh, multiprocessing.get_context("spawn").Pool(args.jobs, _init_worker) as pool:
        writer = csv.DictWriter(fh, COLUMNS)
        if new_file:
            writer.writeheader()
        rows = pool.imap_unordered(_run_one, [(args.study, k, s, e, args.device) for k, s, e in todo])
        for finished in range(1, len(todo) + 1):
            try:
                left = args.deadline - (time.perf_counter() - start)
                row = rows.next(timeout=max(left, 0.0) if math.isfinite(left) else None)
            except multiprocessing.TimeoutError:
                print(f"deadline: {len(todo) - finished + 1} runs not finished", flush=True)
                break  # leaving the `with` terminates the runs in flight
            writer.writerow(row)
            fh.flush()
            os.fsync(fh.fileno())
            print(f"[{finished}/{len(todo)}] {row['key']} seed {row['seed']} {row['epochs']} epochs: {row['metric']:.4f} "
                  f"in {row['train_time_s']:.1f}s (elapsed {time.perf_counter() - start:.0f}s)", flush=True)


def _run_one(task: tuple[str, str, int, int, str]) -> dict:
    return _run(*task)


def budgets(params: dict[str, int], n: int = BUDGETS) -> list[int]:
    """`n` budgets log-uniform from the smallest configuration to the largest (bench/stability.py's)."""
    return [int(round(b)) for b in np.geomspace(min(params.values()), max(params.values()), n)]


def compare(args: argparse.Namespace) -> None:
    from explorer.transfer import order_held

    frame = pd.read_csv(args.table)
    short_e, long_e = sorted(frame["epochs"].unique())[:1][0], sorted(frame["epochs"].unique())[-1]
    seeds = sorted(set(frame.loc[frame["epochs"] == short_e, "seed"]) & set(frame.loc[frame["epochs"] == long_e, "seed"]))
    frame = frame[frame["seed"].isin(seeds)]
    means = frame.groupby(["epochs", "key"])["metric"].mean()
    short, long = means[short_e].to_dict(), means[long_e].to_dict()
    keys = sorted(set(short) & set(long))
    params = frame.groupby("key")["params"].first().astype(int).loc[keys].to_dict()
    at = budgets(params)
    print(f"{Path(args.table).name}: {len(keys)} configurations, seeds {seeds}, {short_e} vs {long_e} epochs; "
          f"{len(at)} budgets {at[0]:,} to {at[-1]:,} params")
    print(f"mean accuracy over configurations: {np.mean(list(short.values())):.4f} at {short_e} epochs, "
          f"{np.mean(list(long.values())):.4f} at {long_e}")
    for margin in sorted({0.0, args.margin}):
        held = order_held({k: short[k] for k in keys}, {k: long[k] for k in keys}, params, at, margin)
        print(f"margin {margin:.3f}: " + "; ".join(held.lines()))
    if args.reference:  # the same epochs, other runs: how far two measurements of one thing agree
        ref = pd.read_csv(args.reference)
        ref = ref[ref["seed"].isin(seeds)].groupby("key")["metric"].mean().to_dict()
        same = order_held({k: short[k] for k in keys}, {k: ref[k] for k in keys}, params, at, args.margin)
        print(f"reference: these {short_e}-epoch runs vs {Path(args.reference).name} (same seeds, CPU float32): "
              + "; ".join(same.lines()))
    held = order_held({k: short[k] for k in keys}, {k: long[k] for k in keys}, params, at, args.margin)
    print(f"fidelity tau {held.tau:.3f} held {held.share:.2f} floor {held.floor:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser("train", help="train the table")
    run.add_argument("study", help="a study YAML: its space, task and budget")
    run.add_argument("--epochs", default="20,60", help="comma-separated epoch counts")
    run.add_argument("--seeds", default="0-2", help="e.g. 0-2 or 0,1,2")
    run.add_argument("--out", required=True, help="the table, a plain .csv (appended to)")
    run.add_argument("--jobs", type=int, default=2)
    run.add_argument("--device", default="cpu")
    run.add_argument("--limit", type=int, default=None, help="only the first N configurations")
    run.add_argument("--deadline", type=float, default=float("inf"), help="stop waiting after this many seconds")
    parser.add_argument("--table", default=str(TABLE))
    parser.add_argument("--margin", type=float, default=0.01, help="long-run metric points within which a pick holds")
    parser.add_argument("--reference", default=str(ROOT / "bench" / "data" / "digits-vit.csv.gz"),
                        help="a table of the short runs measured elsewhere ('' for none)")
    args = parser.parse_args()
    train(args) if args.command == "train" else compare(args)


if __name__ == "__main__":
    main()
