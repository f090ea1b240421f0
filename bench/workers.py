"""Wall time of one grid study run by 1, 2 and 4 `explorer run` workers on each storage, as speedups.

The same 12-configuration grid study (tiny image encoders on digits, each trial on one thread) is run
to completion by N worker processes started at once, on a SQLite file, a journal file and PostgreSQL
(a server URL from --postgres or EXPLORER_BENCH_POSTGRES; a fresh database per run; skipped without
one). Process start-up (importing torch) is part of each worker's wall time, as for a user. Prints
the wall time of 1 worker and the speedup of 2 and 4 over it, side by side, and the load average.

    python bench/workers.py [--postgres postgresql://user:pw@127.0.0.1:5432/postgres]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import optuna
import sqlalchemy
import yaml

SPACE = {
    "name": "bench-workers",
    "family": "image-encoder",
    "fixed": {"width": 16, "mlp": 32, "img_size": 8, "patch": 4, "in_chans": 1, "num_classes": 10},
    "free": {"layers": [1, 2, 3, 4], "heads": "divisors"},
    "constraints": {"fixed_mlp": True, "min_head_dim": 4},
}
STUDY = {
    "name": "bench-workers",
    "space": "space.yaml",
    "task": {"name": "digits"},
    "budget": {"epochs": 3, "batch_size": 64, "lr": 0.003, "seed": 0},
    "sampler": {"name": "grid"},
    "n_trials": 12,
    "heartbeat_s": 2,
}
WORKERS = (1, 2, 4)


def new_database(server: str) -> str:
    import psycopg

    name = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return sqlalchemy.engine.make_url(server).set(database=name).render_as_string(hide_password=False)


def run_study(storage: str, workers: int, folder: Path) -> float:
    """Seconds from starting `workers` processes to the last one exiting; checks each config ran once."""
    (folder / "space.yaml").write_text(yaml.safe_dump(SPACE))
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump({**STUDY, "storage": storage}))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "explorer.cli", "run", str(path), "--no-dashboard"]
    start = time.perf_counter()
    procs = [subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(workers)]
    codes = [p.wait() for p in procs]
    wall = time.perf_counter() - start
    url = storage if not storage.startswith("journal:") else None
    ostudy = optuna.load_study(study_name=STUDY["name"], storage=url or optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(folder / storage.removeprefix("journal:")))))
    done = Counter(t.params["arch"] for t in ostudy.trials if t.state == optuna.trial.TrialState.COMPLETE)
    if codes != [0] * workers or len(done) != STUDY["n_trials"] or set(done.values()) != {1}:
        raise SystemExit(f"{storage} x{workers}: exit codes {codes}, completed {dict(done)}")
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", default=os.environ.get("EXPLORER_BENCH_POSTGRES"), help="URL of a server's maintenance database")
    args = parser.parse_args()
    storages = {"sqlite": lambda d: f"sqlite:///{d / 'bench.db'}", "journal": lambda d: "journal:bench.log"}
    if args.postgres:
        storages["postgresql"] = lambda d: new_database(args.postgres)
    else:
        print("postgresql: skipped (no --postgres URL)")
    load = os.getloadavg()[0]
    walls: dict[str, dict[int, float]] = {name: {} for name in storages}
    for n in WORKERS:  # interleaved, so a change in the machine's load touches every storage alike
        for name, make in storages.items():
            with tempfile.TemporaryDirectory() as tmp:
                walls[name][n] = run_study(make(Path(tmp)), n, Path(tmp))
    print(f"one grid study of {STUDY['n_trials']} trials, N `explorer run` workers, {os.cpu_count()} CPUs, "
          f"load average {load:.1f} before, {os.getloadavg()[0]:.1f} after")
    print(f"{'storage':<12}{'1 worker (s)':>14}" + "".join(f"{f'{n} workers':>12}" for n in WORKERS[1:]))
    for name, w in walls.items():
        print(f"{name:<12}{w[1]:>14.1f}" + "".join(f"{w[1] / w[n]:>11.2f}x" for n in WORKERS[1:]))


if __name__ == "__main__":
    main()
