"""Complete tables of real runs: every feasible configuration of a space x seeds, trained by explorer itself.

    python bench/build_tables.py studies/digits-vit-trade.yaml --seeds 0-5 --out bench/data/digits-vit.csv.gz
    python bench/build_tables.py studies/digits-wide.yaml --seeds 0-2 --out bench/data/digits-wide.csv.gz
    python bench/build_tables.py studies/digits-vit-trade.yaml --seeds 0-3 --epochs 10,20,40 --out bench/data/digits-vit-lengths.csv.gz

Each (configuration, seed) is one `explorer.train.run_trial` with the study's task and budget,
`budget.seed` set to the seed (it sets initialisation and data order); `--jobs` processes train in
parallel, each torch on one thread (spawned: a forked worker inherits the parent's torch state and
did not finish a 2-second run in 11 minutes here). A row is appended to `OUT` without its `.gz` (a
plain CSV, flushed per row) as soon as its run ends, so an interrupted build loses at most the runs
in flight and a rerun skips every row already there; when the table is complete it is written
compressed to `OUT` and the plain file removed. `bench/search.py` and `bench/stability.py` read
these tables: one row per (key, seed) with layers, heads, width, mlp, params, seed, metric (the final
metric), curve (the metric after each epoch, JSON), eval_loss, train_time_s, kappa_init, kappa_final, epochs.

`--epochs 10,20,40` trains a ladder: one warmup-stable-decay run of 40 epochs per (configuration, seed)
whose 10- and 20-epoch results are cooldown branches (explorer.schedule), one row per rung; a rung's
curve is the run's trajectory up to its cooldown, then the branch's result; `train_time_s` is the
whole run's (46 epochs of compute for the three rungs).
"""

from __future__ import annotations

import argparse
import csv
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

COLUMNS = ["key", "layers", "heads", "width", "mlp", "params", "seed", "metric", "curve", "eval_loss",
           "train_time_s", "kappa_init", "kappa_final", "epochs"]


def read_table(path: str | Path) -> pd.DataFrame:
    """A table as built here, finished (`.csv.gz`) and in progress (the plain `.csv` beside it) together."""
    path = Path(path)
    parts = [pd.read_csv(p) for p in (path, _partial(path)) if p.exists() and p.stat().st_size]
    if not parts:
        return pd.DataFrame(columns=COLUMNS)
    frame = pd.concat(parts, ignore_index=True)
    frame = frame.drop_duplicates([c for c in ("key", "seed", "epochs") if c in frame], keep="first")
    frame["curve"] = frame["curve"].map(json.loads)
    return frame.reset_index(drop=True)


def _partial(path: Path) -> Path:
    return path.with_name(path.name.removesuffix(".gz"))


def _seeds(text: str) -> list[int]:
    """`0-5` or `0,2,4`."""
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)


def _run(study_path: str, key: str, seed: int, epochs: list[int] | None) -> list[dict]:
    """Train one configuration at one seed; the rows of the table (one per rung of a ladder)."""
    from explorer.conditioning import summary
    from explorer.study import load_study_spec
    from explorer.train import run_trial

    study = load_study_spec(study_path)
    cfg = study.configs[key]
    update = {"seed": seed, **({"epochs": epochs if len(epochs) > 1 else epochs[0]} if epochs else {})}
    budget = study.spec.budget.model_copy(update=update)
    result = run_trial(cfg.family, cfg.dims, study.task, budget.at(budget.longest), device="cpu")
    dims = cfg.dims
    rungs = result.rungs or {budget.longest: result.metrics}
    return [{"key": key, **{d: dims.get(d) for d in ("layers", "heads", "width", "mlp")}, "params": cfg.params,
             "seed": seed, "metric": metrics[study.task.metric],
             "curve": json.dumps([round(v, 6) for v in [*result.curve[:length - 1], metrics[study.task.metric]]]),
             "eval_loss": metrics["eval_loss"], "train_time_s": round(result.train_time_s, 3),
             "kappa_init": summary(result.kappa_init), "kappa_final": summary(result.kappa_final), "epochs": length}
            for length, metrics in sorted(rungs.items())]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", help="a study YAML: its space, task and budget")
    parser.add_argument("--seeds", default="0-2", help="e.g. 0-5 or 0,1,2")
    parser.add_argument("--epochs", default=None, help="override the study's budget.epochs: 20, or a ladder 10,20,40")
    parser.add_argument("--out", required=True, help="the table, .csv.gz")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--limit", type=int, default=None, help="build only the first N configurations (a slice)")
    args = parser.parse_args()

    from explorer.study import load_study_spec

    study = load_study_spec(args.study)
    epochs = [int(e) for e in args.epochs.split(",")] if args.epochs else None
    rungs = len(epochs) if epochs else len(study.spec.budget.ladder)
    keys = list(study.configs)[: args.limit]
    out = Path(args.out)
    done = set(map(tuple, read_table(out)[["key", "seed"]].astype({"seed": int}).to_numpy().tolist()))
    todo = [(k, s) for s in _seeds(args.seeds) for k in keys if (k, s) not in done]  # seed by seed: partial tables are usable
    print(f"{study.space.name}: {len(keys)} configurations, {len(done)} runs stored, {len(todo)} to run on {args.jobs} processes", flush=True)
    partial = _partial(out)
    partial.parent.mkdir(parents=True, exist_ok=True)
    new_file = not partial.exists() or partial.stat().st_size == 0
    start = time.perf_counter()
    with open(partial, "a", newline="") as fh, ProcessPoolExecutor(args.jobs, multiprocessing.get_context("spawn"), _init_worker) as pool:
        writer = csv.DictWriter(fh, COLUMNS)
        if new_file:
            writer.writeheader()
        futures = {pool.submit(_run, args.study, k, s, epochs): (k, s) for k, s in todo}
        for i, future in enumerate(as_completed(futures), 1):
            rows = future.result()
            writer.writerows(rows)
            row = rows[-1]
            fh.flush()
            os.fsync(fh.fileno())
            elapsed = time.perf_counter() - start
            print(f"[{i}/{len(todo)}] {row['key']} seed {row['seed']}: {row['metric']:.4f} in {row['train_time_s']:.1f}s "
                  f"(elapsed {elapsed / 60:.1f} min, about {elapsed / i * (len(todo) - i) / 60:.1f} min left)", flush=True)
    table = read_table(out)
    if len(table) == len(keys) * len(_seeds(args.seeds)) * rungs:
        table.assign(curve=table["curve"].map(json.dumps)).sort_values(["params", "key", "epochs", "seed"]).to_csv(out, index=False)
        partial.unlink()
        print(f"complete: {len(table)} rows in {out}", flush=True)


if __name__ == "__main__":
    main()
