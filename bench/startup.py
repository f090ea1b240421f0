"""Start-up time of `explorer` commands against the floor they cannot beat: importing torch.

    python bench/startup.py [--repeats 7]

Each repeat runs, back to back in a fresh interpreter each, `python -c "import torch"`,
`explorer params spaces/vit-digits.yaml` and `explorer status` on a small study this script trains
first (two configurations of vit-digits' space at one epoch, in a temp dir it removes). Rounds
alternate so a busy machine slows every command alike; the table shows each command's median
wall time and its ratio to the torch import (the issue's target: at most 1.5x), with an empty
interpreter (`python -c pass`) as the floor below that.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def make_study(folder: Path) -> Path:
    """vit-digits' space cut to two configurations, trained for one epoch: a real study to read."""
    space = yaml.safe_load((ROOT / "spaces" / "vit-digits.yaml").read_text())
    space["free"] = {"layers": [1, 2], "heads": [1]}
    space.pop("baseline", None)
    (folder / "space.yaml").write_text(yaml.safe_dump(space))
    study = {"name": "startup", "space": "space.yaml", "task": {"name": "digits"},
             "budget": {"epochs": 1, "batch_size": 128, "lr": 0.002}, "n_trials": 2,
             "sampler": {"name": "grid", "seed": 0}}
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def wall(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    explorer = [sys.executable, "-m", "explorer"]
    with tempfile.TemporaryDirectory() as tmp:
        study = make_study(Path(tmp))
        wall([*explorer, "run", str(study), "--no-dashboard"], env)
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            'python -c "import torch"': [sys.executable, "-c", "import torch"],
            "explorer params spaces/vit-digits.yaml": [*explorer, "params", "spaces/vit-digits.yaml"],
            "explorer status <2-trial study>": [*explorer, "status", str(study)],
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        for name, cmd in commands.items():  # one untimed run each: the file cache is warm for all alike
            wall(cmd, env)
        for _ in range(args.repeats):
            for name, cmd in commands.items():
                times[name].append(wall(cmd, env))
    floor = statistics.median(times['python -c "import torch"'])
    print(f"{'command':<42} {'median s':>9} {'min s':>7} {'max s':>7} {'x torch':>8}   ({args.repeats} repeats)")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<42} {med:9.2f} {min(ts):7.2f} {max(ts):7.2f} {med / floor:8.2f}")


if __name__ == "__main__":
    main()
