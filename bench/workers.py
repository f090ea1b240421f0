"""Many workers, kill -9, nothing lost: N `explorer run` processes of T threads on one study, on SQLite, a
journal file and PostgreSQL, with a worker killed by SIGKILL at random moments while it trains a trial and started again, while
another process loads the CPU. Prints, per storage, what was trained against what the study asked for:

    trained     (configuration, seed) pairs completed, against the pairs the study holds
    duplicated  pairs completed more than once (0 is the only right answer)
    lost        pairs never completed (0)
    running     trials left RUNNING (0), waiting: trials left queued (0)
    reclaimed   trials failed because their worker died (each retried by the others)
    status      `explorer status` agrees with the storage (runs counted, nothing running)

and, as a side-by-side ratio, the wall time of the N workers against 1 worker without kills on the
same study. The floor, what an unguarded run can do, is a worker per pair of (configuration, seed)
trained twice: `duplicated` and `lost` say whether that happened.

    python bench/workers.py [--processes 8] [--threads 1] [--kills 4] [--postgres URL]

`stress` is also the body of tests/test_stress.py (4 processes x 2 threads, 3 kills).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import yaml

# the default study's size: 24 (layers, heads) splits x 3 seeds, on models that train in a fraction of a second
SPACE = {
    "name": "stress",
    "family": "image-encoder",
    "fixed": {"width": 32, "mlp": 32, "img_size": 8, "patch": 4, "in_chans": 1, "num_classes": 10},
    "free": {"layers": {"min": 1, "max": 6}, "heads": "divisors"},
    "constraints": {"fixed_mlp": True, "heads_divide_width": True, "min_head_dim": 4},
}
STUDY = {
    "name": "stress",
    "space": "space.yaml",
    "task": {"name": "digits"},
    "budget": {"epochs": 2, "max_steps": 6, "batch_size": 64, "lr": 0.003, "seed": 0, "seeds": 3},
    "replicates": {"policy": "fixed"},
    "sampler": {"name": "grid"},
    "n_trials": 24,
    "heartbeat_s": 2,
}
_COMPLETE, _RUNNING, _WAITING, _FAIL = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING,
                                        optuna.trial.TrialState.WAITING, optuna.trial.TrialState.FAIL)


@dataclass
class Outcome:
    pairs: int  # (configuration, seed) pairs the study holds
    trained: int
    duplicated: int
    lost: list[tuple[str, int]]
    running: int
    waiting: int
    reclaimed: int
    status_runs: int
    status_running: int
    kills: int
    wall_s: float
    exits: list[int] = field(default_factory=list)  # exit codes of the workers not killed
    hung: int = 0  # workers still running at the deadline (their stacks are in the log)
    left: list[str] = field(default_factory=list)  # the trials left queued or running: number, attrs (who queued them, why)

    @property
    def right(self) -> bool:
        return (self.trained == self.pairs and not self.duplicated and not self.lost and not self.running and not self.waiting
                and self.status_runs == self.trained and not self.status_running and set(self.exits) <= {0} and not self.hung)


def write(folder: Path, storage: str, threads: int) -> Path:
    (folder / "space.yaml").write_text(yaml.safe_dump(SPACE))
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump({**STUDY, "storage": storage, "executor": {"name": "local", "cpu": 1, "n_jobs": threads}}))
    return path


def worker(path: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    with log.open("a") as out:
        return subprocess.Popen([sys.executable, "-m", "explorer.cli", "run", str(path), "--no-dashboard"], env=env,
                                stdout=out, stderr=subprocess.STDOUT)


def cpu_load(seconds: float) -> subprocess.Popen:
    """Another process that keeps a core busy, for at most `seconds` (it ends by itself)."""
    code = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"
    return subprocess.Popen([sys.executable, "-c", code])


def stress(storage: str, folder: Path, processes: int = 4, threads: int = 2, kills: int = 3, seed: int = 0,
           load: bool = True, timeout: float = 600) -> Outcome:
    """Run the study with `processes` workers, SIGKILL one at random `kills` times (each started again at
    once), and count what the storage holds afterwards."""
    from explorer import api
    from explorer.study import load_study_spec

    path = write(folder, storage, threads)
    log = folder / "workers.log"
    rng = random.Random(seed)
    loader = cpu_load(timeout) if load else None
    start = time.perf_counter()
    procs = [worker(path, log) for _ in range(processes)]
    done_kills, survivors, hung = 0, [], []
    try:
        while done_kills < kills and time.perf_counter() - start < timeout:
            time.sleep(rng.uniform(0.5, 3.0))
            alive = {p.pid: p for p in procs if p.poll() is None}
            if not alive:
                break
            training = [alive[pid] for pid in _training_pids(path) if pid in alive]
            if not training:  # starting up, or between trials: a kill now would test nothing
                continue
            victim = rng.choice(training)
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            done_kills += 1
            procs[procs.index(victim)] = worker(path, log)
        deadline = start + timeout
        for p in procs:
            try:
                survivors.append(p.wait(timeout=max(1.0, deadline - time.perf_counter())))
            except subprocess.TimeoutExpired:
                break
        hung = [p for p in procs if p.poll() is None]
        for p in hung:  # past the deadline: each thread's stack goes to the log (explorer.cli registers SIGUSR1)
            p.send_signal(signal.SIGUSR1)
        time.sleep(2 if hung else 0)
    finally:
        for p in [*procs, *([loader] if loader else [])]:
            if p.poll() is None:
                p.kill()
                p.wait()
    wall = time.perf_counter() - start
    study = load_study_spec(path)
    ostudy = study.read()
    trials = ostudy.get_trials(deepcopy=False)
    done = Counter((t.params["arch"], study.seed_of(t)) for t in trials if t.state == _COMPLETE and "duplicate_of" not in t.user_attrs)
    pairs = [(k, s) for k in study.keys for s in study.seeds]
    status = api.load(path).status()
    return Outcome(pairs=len(pairs), trained=len(done), duplicated=sum(n - 1 for n in done.values()),
                   lost=[p for p in pairs if p not in done], running=sum(t.state == _RUNNING for t in trials),
                   waiting=sum(t.state == _WAITING for t in trials),
                   reclaimed=sum(t.state == _FAIL and "fail_reason" not in t.user_attrs for t in trials),
                   status_runs=status.runs, status_running=status.states.get("RUNNING", 0), kills=done_kills,
                   wall_s=wall, exits=survivors, hung=len(hung),
                   left=[f"#{t.number} {t.state.name} {t.user_attrs}" for t in trials if t.state in (_WAITING, _RUNNING)])


def _training_pids(path: Path) -> list[int]:
    """The process ids of the workers training a trial now (each trial records its worker)."""
    from explorer.errors import ExplorerError
    from explorer.study import load_study_spec

    try:
        trials = load_study_spec(path).read().get_trials(deepcopy=False, states=(_RUNNING,))
    except ExplorerError:  # not created yet
        return []
    return sorted({int(t.user_attrs["worker"].rsplit(":", 1)[1]) for t in trials if "worker" in t.user_attrs})


def new_database(server: str) -> str:
    import psycopg
    import sqlalchemy

    name = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return sqlalchemy.engine.make_url(server).set(database=name).render_as_string(hide_password=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--kills", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--postgres", default=os.environ.get("EXPLORER_BENCH_POSTGRES"), help="URL of a server's maintenance database")
    args = parser.parse_args()
    storages = {"sqlite": lambda d: f"sqlite:///{d / 'stress.db'}", "journal": lambda d: "journal:stress.log"}
    if args.postgres:
        storages["postgresql"] = lambda d: new_database(args.postgres)
    else:
        print("postgresql: skipped (no --postgres URL)")
    print(f"a grid of 24 configurations x 3 seeds; {args.processes} processes x {args.threads} "
          f"threads, {args.kills} SIGKILLs, a CPU-loading process beside them; {os.cpu_count()} CPUs")
    print(f"{'storage':<12}{'trained':>10}{'duplicated':>12}{'lost':>6}{'running':>9}{'waiting':>9}{'reclaimed':>11}"
          f"{'status':>8}{'wall vs 1 worker':>18}")
    for name, make in storages.items():
        with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as base:
            many = stress(make(Path(tmp)), Path(tmp), args.processes, args.threads, args.kills, args.seed)
            one = stress(make(Path(base)), Path(base), 1, 1, 0, args.seed)  # the same study, one worker, no kills, same load
        agrees = "agrees" if many.status_runs == many.trained and not many.status_running else "DIFFERS"
        print(f"{name:<12}{f'{many.trained}/{many.pairs}':>10}{many.duplicated:>12}{len(many.lost):>6}{many.running:>9}"
              f"{many.waiting:>9}{many.reclaimed:>11}{agrees:>8}{one.wall_s / many.wall_s:>17.2f}x")
        if not many.right:
            print(f"  {name}: NOT every (configuration, seed) once: lost {many.lost}, exit codes {many.exits}")


if __name__ == "__main__":
    main()
