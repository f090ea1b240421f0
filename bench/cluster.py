"""A simulated GPU cluster kept busy: the share of GPU time that explorer's Ray executor keeps trials
running, against plain Ray Tune with Optuna's OptunaSearch on the same cluster and workload.

A real local Ray cluster (`ray.cluster_utils.Cluster`: a head and `--nodes` raylets, each declaring
`--gpus / --nodes` GPUs and as many CPUs, no CUDA) runs a study through explorer's real executor path:
the searcher (`OptunaBridge`), the queue and its claims under the study's lock, the `decide` replicate
policy, storage writes and heartbeats, Ray checkpoints every `executor.checkpoint_every_s`. Only the
training is replaced: each trial is bench/standin.py's stand-in, which sleeps T seconds over its epochs
and reports a plausible curve (no torch). The floor is plain Ray Tune: a function trainable that sleeps
the same T over the same epochs, OptunaSearch with Optuna's RandomSampler (in memory), as many trials as
explorer trained, one GPU each, `reuse_actors` as explorer sets it. Each run gets a fresh cluster (its
workers start cold, as the other's did).

Per T and storage it prints the GPUs' busy share (trial seconds / (GPUs x wall), wall from the run's start
to its end, Ray's worker start-up included for both), the driver's cost per trial (time Tune's thread
spent in explorer's searcher per trial, all calls; `suggest`: the median of those that started a trial), the storage's transactions per
second, and checks the storage afterwards: every (configuration, seed) trained once, nothing left RUNNING.
Each row also splits a GPU's seconds per trial (GPUs x wall / trials) into the median time inside a trial's
function (Ray's `time_total_s`, for both) and the rest, between trials.
Each row also says when every budget the study answers was decided (its answers read from the trials
stored by then), or how many were at the end.
The last line:  cluster busy@2s B busy@10s B10 suggest_ms S tune_busy@2s T [busy@60s B60 tune_busy@60s T60]
(SQLite's figures, by trial length, nan for a length not run; the 60-second pair whenever 60-second trials
ran; `--storages` picks others, PostgreSQL on a throwaway server as .ci/run starts one).

    python bench/cluster.py [--gpus 32] [--nodes 4] [--seconds 2 10 60] [--storages sqlite postgresql journal]
    python bench/cluster.py --quick     # 4 GPUs on 2 nodes, 2-second trials, 2 waves, SQLite: what tests/test_bench.py runs
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime
import json
import math
import os
import pstats
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import optuna
import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.pgserver import NoServer, Server, throwaway_postgres  # noqa: E402
from explorer.executors import ray_bridge  # noqa: E402
from explorer.study import load_study_spec  # noqa: E402

EPOCHS = 5  # reports per trial


def space(configs: int) -> dict[str, Any]:
    """An image-encoder space of `configs` or more configurations (layers x 4 head counts)."""
    return {"name": "cluster", "family": "image-encoder",
            "fixed": {"width": 32, "mlp": 64, "img_size": 8, "patch": 4, "in_chans": 1, "num_classes": 10},
            "free": {"layers": {"min": 1, "max": -(-configs // 4)}, "heads": [1, 2, 4, 8]}}


def write_study(folder: Path, seconds: float, trials: int, storage: str, address: str, policy: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "space.yaml").write_text(yaml.safe_dump(space(2 * trials)))
    study = {"name": "cluster", "space": "space.yaml", "task": {"name": "bench.standin:StandIn", "seconds": seconds},
             "budget": {"epochs": EPOCHS, "seeds": 2 if policy != "none" else 1}, "replicates": {"policy": policy if policy != "none" else "fixed"},
             "sampler": {"name": "random", "seed": 0}, "n_trials": trials, "storage": storage, "heartbeat_s": 5,
             "executor": {"name": "ray", "address": address, "storage_path": str(folder / "ray-results")}}
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


class Driver:
    """Time Tune's thread spends in explorer's searcher, per call (wrapping OptunaBridge's methods)."""

    def __init__(self, profile: Any = None) -> None:
        self.calls: dict[str, list[float]] = {"suggest": [], "on_trial_result": [], "on_trial_complete": []}
        self.launches: list[float] = []  # the suggests that started a trial (the others found none to start)
        self.profile = profile  # a cProfile.Profile of these calls alone (BENCH_PROFILE=1 in the environment)

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        cls, saved = ray_bridge.OptunaBridge, {}
        for name in self.calls:
            saved[name] = original = getattr(cls, name)

            def timed(*args: Any, _f: Any = original, _n: str = name, **kwargs: Any) -> Any:
                start = time.perf_counter()
                if self.profile is not None:
                    self.profile.enable()
                out = None
                try:
                    out = _f(*args, **kwargs)
                    return out
                finally:
                    if self.profile is not None:
                        self.profile.disable()
                    self.calls[_n].append(time.perf_counter() - start)
                    if _n == "suggest" and isinstance(out, dict):
                        self.launches.append(self.calls[_n][-1])
            setattr(cls, name, timed)
        try:
            yield
        finally:
            for name, original in saved.items():
                setattr(cls, name, original)


def transactions() -> Counter:
    """Commits of every SQLAlchemy connection in this process (the RDB storages' transactions)."""
    import sqlalchemy

    counts: Counter = Counter()
    sqlalchemy.event.listen(sqlalchemy.engine.Engine, "commit", lambda conn: counts.update(["commit"]))
    return counts


def explorer_run(folder: Path, seconds: float, trials: int, gpus: int, storage: str, address: str, commits: Counter,
                 policy: str) -> dict[str, Any]:
    from explorer.executors.ray_tune import RayExecutor

    path = write_study(folder, seconds, trials, storage, address, policy)
    driver, before = Driver(cProfile.Profile() if os.environ.get("BENCH_PROFILE") else None), commits["commit"]
    journal = folder / "cluster.log" if storage.startswith("journal:") else None
    start, began = time.perf_counter(), datetime.datetime.now()
    with driver.watching():
        study = load_study_spec(path)
        ostudy = study.open()
        RayExecutor().run(study, ostudy)
    wall = time.perf_counter() - start
    if driver.profile is not None:
        print({name: f"{sum(calls):.1f} s in {len(calls)}, max {max(calls, default=0):.2f} s" for name, calls in driver.calls.items()})
        pstats.Stats(driver.profile).sort_stats("cumulative").print_stats(40)
    decided, budgets, until_decided = decided_at(study, ostudy, began)
    trained = [t for t in ostudy.get_trials() if t.state == optuna.trial.TrialState.COMPLETE and "duplicate_of" not in t.user_attrs]
    pairs = Counter((t.params["arch"], int(t.user_attrs.get("seed", 0))) for t in trained)
    writes = sum(1 for _ in journal.open()) if journal else commits["commit"] - before
    first = [t for t in trained if not t.user_attrs.get("replicate")]  # before the replicate policy's first round
    until = (max(t.datetime_complete for t in first) - began).total_seconds()
    return {"wall": wall, "trials": len(trained), "gpus": gpus, "busy": len(trained) * seconds / (gpus * wall),
            "busy_first": len(first) * seconds / (gpus * until),
            "twice": sum(n > 1 for n in pairs.values()), "running": len(ostudy.get_trials(states=(optuna.trial.TrialState.RUNNING,))),
            "replicates": sum(bool(t.user_attrs.get("replicate")) for t in trained),
            "inside": statistics.median(ray_seconds(folder / "ray-results")),
            "suggest_ms": 1e3 * statistics.median(driver.launches or [0]),
            "driver_ms": 1e3 * sum(map(sum, driver.calls.values())) / max(1, len(trained)), "writes": writes / wall,
            "writes_name": "log records/s" if journal else "transactions/s",
            "decided": decided, "budgets": budgets, "until_decided": until_decided,
            "tenths": tenths(folder / "ray-results", began.timestamp(), wall, gpus)}


def decided_at(study: Any, ostudy: optuna.Study, began: datetime.datetime) -> tuple[int, int, float | None]:
    """(budgets decided at the end, distinct budgets, seconds from the run's start until every one was decided:
    the answers read from the trials stored by then, the earliest such time found by bisection over the
    stored results; None when some budget is still undecided at the end)."""
    from explorer.frame import trials_frame
    from explorer.identity import current_rows

    frame = current_rows(trials_frame(ostudy), ostudy)
    times = sorted(frame["datetime_complete"].dropna().unique())

    def answers(upto: Any) -> list[bool]:
        summary = study.reads.summary(ostudy, draws=0, frame=frame[frame["datetime_complete"] <= upto])
        return [a.decided for _, a in study.reads.answers(summary)]

    end = answers(times[-1])
    if not all(end):
        return sum(end), len(end), None
    lo, hi = 0, len(times) - 1  # the earliest prefix with every budget decided (decisions seldom flip back)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if all(answers(times[mid])) else (mid + 1, hi)
    return sum(end), len(end), (pd.Timestamp(times[lo]).to_pydatetime() - began).total_seconds()


def tune_run(folder: Path, seconds: float, trials: int, gpus: int) -> dict[str, Any]:
    """The floor: plain Ray Tune + OptunaSearch (RandomSampler, in memory), the same trials on the same GPUs."""
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    def trainable(config: dict[str, Any]) -> None:
        for epoch in range(EPOCHS):
            time.sleep(seconds / EPOCHS)
            tune.report({"accuracy": 0.5 + 0.01 * config["layers"] * (epoch + 1) / EPOCHS, "epoch": epoch + 1})

    search = OptunaSearch({"layers": tune.randint(1, 2 * trials), "heads": tune.choice([1, 2, 4, 8])}, metric="accuracy", mode="max",
                          sampler=optuna.samplers.RandomSampler(seed=0))
    tuner = tune.Tuner(tune.with_resources(trainable, {"cpu": 1, "gpu": 1}),
                       tune_config=tune.TuneConfig(search_alg=search, num_samples=trials, max_concurrent_trials=gpus, reuse_actors=True),
                       run_config=tune.RunConfig(name="tune", storage_path=str(folder / "tune-results"), verbose=0))
    start, began = time.perf_counter(), time.time()
    results = tuner.fit()
    wall = time.perf_counter() - start
    done = sum(1 for r in results if r.metrics and r.metrics.get("epoch") == EPOCHS)
    return {"wall": wall, "trials": done, "gpus": gpus, "busy": done * seconds / (gpus * wall),
            "inside": statistics.median(ray_seconds(folder / "tune-results")), "tenths": tenths(folder / "tune-results", began, wall, gpus)}


def ray_seconds(root: Path) -> list[float]:
    """Each Ray trial's time in its function (`time_total_s` of its last result), from the result files Tune
    writes under `root`: measured the same way for explorer's trials and plain Tune's."""
    out = []
    for path in root.rglob("result.json"):
        lines = path.read_text().splitlines()
        if lines:
            out.append(float(json.loads(lines[-1])["time_total_s"]))
    return out or [math.nan]


def tenths(root: Path, began: float, wall: float, gpus: int) -> list[float]:
    """The GPUs' busy share in each tenth of the run, from each Ray trial's span in its result files (its last
    report's `timestamp` less its `time_total_s`): where in the run the GPUs idle."""
    spans = []
    for path in root.rglob("result.json"):
        lines = path.read_text().splitlines()
        if lines:
            last = json.loads(lines[-1])
            spans.append((last["timestamp"] - last["time_total_s"], last["timestamp"]))
    edges = [began + wall * i / 10 for i in range(11)]
    return [sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in spans) / (gpus * (hi - lo)) for lo, hi in zip(edges, edges[1:])]


MARK = f"EXPLORER_BENCH_CLUSTER={os.getpid()}"  # in this cluster's workers' environment: other Rays on the host are not sampled


def worker_memory(stop: threading.Event, out: list[tuple[float, float]]) -> None:
    """Sample this cluster's Ray workers running trials: (PSS, private) MiB each, from /proc/PID/smaps_rollup."""
    while not stop.wait(3):
        for pid in os.listdir("/proc"):
            try:
                if "ImplicitFunc" not in Path(f"/proc/{pid}/cmdline").read_text() or MARK.encode() not in Path(f"/proc/{pid}/environ").read_bytes():
                    continue
                fields = dict(line.split(":")[0:2] for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:])
            except (OSError, ValueError):
                continue
            kib = {k: int(v.split()[0]) for k, v in fields.items()}
            out.append((kib["Pss"] / 1024, (kib["Private_Clean"] + kib["Private_Dirty"]) / 1024))


@contextlib.contextmanager
def fresh_cluster(gpus: int, nodes: int) -> Iterator[str]:
    """A local Ray cluster of its own for one measured run, its address: every run starts its workers cold
    (a second run on the same cluster would find the first one's worker processes started and imported)."""
    import ray
    from ray.cluster_utils import Cluster

    per_node = gpus // nodes
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False, "object_store_memory": 80 << 20})
    try:
        for _ in range(nodes):
            cluster.add_node(num_cpus=per_node, num_gpus=per_node, object_store_memory=80 << 20)
        ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), MARK.split("=")[0]: MARK.split("=")[1]}})
        yield cluster.address
    finally:
        ray.shutdown()
        cluster.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=32)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--seconds", type=float, nargs="+", default=[2, 10, 60])
    parser.add_argument("--waves", type=float, nargs="+", default=[16, 5, 2], help="trials per GPU at each T (n_trials = waves x GPUs)")
    parser.add_argument("--storages", nargs="+", default=["sqlite", "postgresql", "journal"])
    parser.add_argument("--postgres", help="a server's URL (a database is created in it); default: a throwaway server")
    parser.add_argument("--no-tune", action="store_true", help="skip plain Ray Tune's floor")
    parser.add_argument("--policy", default="decide", choices=["decide", "adaptive", "fixed", "none"],
                        help="the replicate policy, over 2 seeds (none: one seed, no replicates)")
    parser.add_argument("--quick", action="store_true", help="4 GPUs on 2 nodes, 2-second trials, 2 waves, SQLite")
    args = parser.parse_args()
    if args.quick:
        args.gpus, args.nodes, args.seconds, args.waves, args.storages = 4, 2, [2.0], [2], ["sqlite"]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped bench still stops its cluster and server
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    commits, rows, memory = transactions(), [], []
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="explorer-cluster-") as tmp, contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(throwaway_postgres()) if "postgresql" in args.storages and not args.postgres else None
        except NoServer as err:
            raise SystemExit(f"no PostgreSQL server started here ({err}); pass --postgres URL") from None
        for seconds, waves in zip(args.seconds, args.waves * len(args.seconds)):
            trials = int(waves * args.gpus)
            done = {}
            for name in args.storages:
                folder = Path(tmp) / f"{name}-{seconds:g}"
                storage = {"sqlite": f"sqlite:///{folder / 'cluster.db'}", "journal": f"journal:{folder / 'cluster.log'}",
                           "postgresql": None}.get(name) or (server or Server(args.postgres)).database()
                stop = threading.Event()
                sampler = threading.Thread(target=worker_memory, args=(stop, memory), daemon=True)
                sampler.start()
                with fresh_cluster(args.gpus, args.nodes) as address:
                    done[name] = explorer_run(folder, seconds, trials, args.gpus, storage, address, commits, args.policy)
                stop.set()
                rows.append((seconds, name, done[name]))
                print_row(seconds, name, done[name])
            if not args.no_tune:
                with fresh_cluster(args.gpus, args.nodes):
                    floor = tune_run(Path(tmp) / f"tune-{seconds:g}", seconds, done[args.storages[0]]["trials"], args.gpus)
                rows.append((seconds, "tune", floor))
                print_row(seconds, "tune", floor)
    summarize(rows, memory, args, load)


def print_row(seconds: float, name: str, r: dict[str, Any]) -> None:
    # the rest of a GPU's seconds per trial is between trials: the driver, Tune's scheduling, a worker's start
    slot = (f"a GPU's {r['wall'] * r['gpus'] / max(1, r['trials']):.1f} s a trial, {r['inside']:.1f} s inside it; busy by tenth "
            f"of the run {' '.join(f'{b:.2f}' for b in r['tenths'])}")
    if name == "tune":
        print(f"T={seconds:g}s  {'ray tune + OptunaSearch':<24} busy {r['busy']:.3f}  wall {r['wall']:7.1f} s  trials {r['trials']}  {slot}",
              flush=True)
        return
    print(f"T={seconds:g}s  {'explorer, ' + name:<24} busy {r['busy']:.3f}  wall {r['wall']:7.1f} s  trials {r['trials']} "
          f"({r['replicates']} replicates; busy {r['busy_first']:.3f} until the first round)  suggest {r['suggest_ms']:.1f} ms  "
          f"driver {r['driver_ms']:.1f} ms/trial  "
          f"{r['writes']:.1f} {r['writes_name']}  trained twice {r['twice']}  left running {r['running']}  {slot}  "
          f"{decided_words(r)}", flush=True)


def decided_words(r: dict[str, Any]) -> str:
    if r["until_decided"] is None:
        return f"decided {r['decided']}/{r['budgets']} budgets at the end"
    return f"every budget ({r['budgets']}) decided at {r['until_decided']:.0f} s"


def summarize(rows: list[tuple[float, str, dict[str, Any]]], memory: list[tuple[float, float]], args: argparse.Namespace,
              load: float) -> None:
    if memory:
        print(f"a trial's Ray worker: PSS {statistics.median(m[0] for m in memory):.0f} MiB, private "
              f"{statistics.median(m[1] for m in memory):.0f} MiB (median of {len(memory)} samples; no torch imported)")
    print(f"{args.gpus} GPUs on {args.nodes} nodes, {os.cpu_count()} CPUs, load average {load:.1f} before, {os.getloadavg()[0]:.1f} after")
    pick = {(s, n): r for s, n, r in rows}
    first = args.storages[0]

    def get(seconds: float, name: str, key: str) -> str:
        r = pick.get((seconds, name))
        return f"{r[key]:.2f}" if r else "nan"

    two = 2 if (2, first) in pick else args.seconds[0]
    suggest = pick.get((two, first), {}).get("suggest_ms", float("nan"))
    line = (f"cluster busy@2s {get(2, first, 'busy')} busy@10s {get(10, first, 'busy')} suggest_ms {suggest:.1f} "
            f"tune_busy@2s {get(2, 'tune', 'busy')}")
    if (60, first) in pick:
        line += f" busy@60s {get(60, first, 'busy')} tune_busy@60s {get(60, 'tune', 'busy')}"
    print(line)

if __name__ == "__main__":
    main()
