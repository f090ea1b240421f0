"""The Ray driver's cost per trial as the study grows: `OptunaBridge.suggest` and `on_trial_complete`
latency at 100 and at 2,000 stored trials, with 64 trials running and the decide policy, side by side
(issue 27: target ratio <= 2; issue 34: at most 20 ms a trial, suggest and complete, at 2,000 stored).

The searcher is driven as Tune drives it (a `_Link` on the study's real SQLite storage, `suggest` for a
new Ray trial id, `on_trial_complete` with a finished trial's result), without a Ray cluster: what is
measured is the driver's own work per trial, which Tune does on one thread between all trials' events.
The stored trials are written directly (their configurations, seeds, curves and attributes as a real
run stores them), over a space of 2,100 configurations; the sampler is `random`, so the figures are the
bookkeeping's, not a model's fit. Prints the median of `--calls` calls at each size and their ratio, in
wall time and in this process's CPU time (the part a busy machine does not inflate).

    python bench/ray_suggest.py [--calls 20] [--running 64] [--sizes 100 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import optuna
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from explorer.executors.ray_bridge import OptunaBridge, _Link  # noqa: E402
from explorer.study import load_study_spec  # noqa: E402

SPACE = {
    "name": "bench-suggest",
    "family": "image-encoder",
    "fixed": {"width": 16, "mlp": 32, "img_size": 8, "patch": 4, "in_chans": 1, "num_classes": 10},
    "free": {"layers": {"min": 1, "max": 700}, "heads": "divisors"},
    "constraints": {"fixed_mlp": True, "min_head_dim": 4},
}


def make_study(folder: Path, stored: int) -> tuple:
    """A study with `stored` COMPLETE trials in its SQLite storage, opened as the driver opens it."""
    (folder / "space.yaml").write_text(yaml.safe_dump(SPACE))
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump({"name": "bench-suggest", "space": "space.yaml", "task": {"name": "digits"},
                                    "budget": {"epochs": 20, "seed": 0, "seeds": 3}, "replicates": {"policy": "decide"},
                                    "sampler": {"name": "random", "seed": 0},
                                    "n_trials": 100_000, "heartbeat_s": 60}))
    study = load_study_spec(path)
    ostudy = study.open()
    enc, rng = study.encoding(ostudy), random.Random(0)
    trials = []
    for cfg in rng.sample(list(study.configs.values()), stored):
        curve = [rng.random() for _ in range(20)]
        attrs = {"identity": study.identity_key, "config": cfg.dims, "params": cfg.params, "seed": 0, "accuracy": curve[-1],
                 "curve": curve, "device": "cpu", "train_time_s": 1.0, "steps": 540}
        trials.append(optuna.trial.create_trial(params=enc.params(cfg), distributions=enc.distributions,
                                                values=[curve[-1], cfg.params], user_attrs=attrs))
    ostudy.add_trials(trials)
    return study, ostudy


def latencies(stored: int, running: int, calls: int) -> tuple[float, float, float]:
    """Median seconds of `suggest`, of `on_trial_complete` and of CPU for both, with `running` trials open and
    `stored` finished."""
    with tempfile.TemporaryDirectory() as tmp:
        study, ostudy = make_study(Path(tmp), stored)
        link = _Link(study, ostudy)
        bridge = OptunaBridge(link)
        try:
            for i in range(running):
                bridge.suggest(f"warm-{i}")
            suggest, complete, cpu = [], [], []
            for i in range(calls):
                start, used = time.perf_counter(), time.process_time()
                config = bridge.suggest(f"timed-{i}")
                suggest.append(time.perf_counter() - start)
                assert isinstance(config, dict), config
                done = next(iter(bridge.ray_ids))  # the oldest running trial finishes: `running` stay open
                attrs = {"accuracy": 0.5, "params": study.configs[next(iter(study.configs))].params, "curve": [0.5]}
                start = time.perf_counter()
                bridge.on_trial_complete(done, {"attrs": json.dumps(attrs)})
                complete.append(time.perf_counter() - start)
                cpu.append(time.process_time() - used)
        finally:
            link.release()
    return statistics.median(suggest), statistics.median(complete), statistics.median(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--running", type=int, default=64)
    parser.add_argument("--sizes", type=int, nargs=2, default=[100, 2000])
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    load = os.getloadavg()[0]
    small, large = (latencies(n, args.running, args.calls) for n in args.sizes)
    print(f"Ray driver per trial, {args.running} running, median of {args.calls} calls; {os.cpu_count()} CPUs, "
          f"load average {load:.1f} before, {os.getloadavg()[0]:.1f} after")
    print(f"{'':<20}{f'{args.sizes[0]} stored (ms)':>18}{f'{args.sizes[1]} stored (ms)':>19}{'ratio':>8}")
    for name, a, b in (("suggest", small[0], large[0]), ("on_trial_complete", small[1], large[1]),
                       ("a trial, wall", small[0] + small[1], large[0] + large[1]), ("a trial, CPU", small[2], large[2])):
        print(f"{name:<20}{a * 1e3:>18.1f}{b * 1e3:>19.1f}{b / a:>7.2f}x")


if __name__ == "__main__":
    main()
