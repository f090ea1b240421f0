"""Commands that need no heavy engine do not import one: `import explorer.cli`, `explorer params` of an
own family and `explorer status` stay near the cost of importing torch (bench/startup.py times them).

`params` of an own family counts in closed form and imports no torch, no Optuna storage and none of
the study's machinery; the family registry imports a family's module only when its name is used.
`status` reads a study without torch: a task's data side and the trial evaluator load on first use."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import write_study

ROOT = Path(__file__).resolve().parents[1]
HEAVY = {"timm", "torchvision", "transformers", "ray", "plotly", "sklearn", "scipy.stats"}
# what counting an own family's space needs none of: the training engine and the study's storage and statistics
NOT_FOR_COUNTING = {"torch", "sqlalchemy", "scipy", "explorer.study", "explorer.tasks", "explorer.train"}
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def imported(args: list[str], cwd: Path) -> set[str]:
    """The modules a fresh interpreter imports to run `args`, from `-X importtime`'s report."""
    proc = subprocess.run([sys.executable, "-X", "importtime", *args], cwd=cwd, env=ENV, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}


def test_import_cli_loads_no_heavy_engine(tmp_path: Path) -> None:
    modules = imported(["-c", "import explorer.cli"], tmp_path)
    assert (HEAVY | NOT_FOR_COUNTING).isdisjoint(modules), sorted((HEAVY | NOT_FOR_COUNTING) & modules)


def test_a_ray_workers_trainable_imports_no_torch_until_a_trial_trains(tmp_path: Path) -> None:
    """A Ray worker imports the trainable's module before its first trial: without torch (a task that trains
    itself never loads it; bench/cluster.py's workers cost 438 MiB each with it, 162 without)."""
    assert "torch" not in imported(["-c", "import explorer.executors.ray_tune"], tmp_path)


def test_params_and_status_of_an_own_family_load_no_heavy_engine(tmp_path: Path) -> None:
    path = write_study(tmp_path, budget={"epochs": 1, "batch_size": 128, "lr": 0.003, "seed": 0}, n_trials=1)
    subprocess.run([sys.executable, "-m", "explorer.cli", "run", str(path), "--no-dashboard"], cwd=tmp_path, env=ENV,
                   check=True, capture_output=True)
    for command in (["params", str(tmp_path / "space.yaml")], ["status", str(path)]):
        modules = imported(["-m", "explorer.cli", *command], tmp_path)
        assert "explorer.families" in modules and (HEAVY | {"torch"}).isdisjoint(modules), (command, sorted((HEAVY | {"torch"}) & modules))
    counting = (["params", str(ROOT / "spaces" / "vit-digits.yaml")],
                ["params", "--family", "causal-lm", "--layers", "2", "--heads", "2", "--width", "64", "--mlp", "128"])
    for command in counting:
        modules = imported(["-m", "explorer.cli", *command], tmp_path)
        assert NOT_FOR_COUNTING.isdisjoint(modules), (command, sorted(NOT_FOR_COUNTING & modules))


def test_the_family_registry_imports_a_family_on_first_use(tmp_path: Path) -> None:
    """Listing the families imports none; counting one imports its own module and the shared dims dataclasses, and neither torch nor another family's."""
    code = ("import sys; from explorer.families import family_names, get_family; names = family_names(); "
            "print(sorted(m for m in sys.modules if m.startswith('explorer.families.'))); "
            "print(get_family('sequence-classifier').params({'layers': 2, 'heads': 2, 'width': 8, 'mlp': 16})); "
            "print(sorted(m for m in sys.modules if m.startswith('explorer.families.') or m == 'torch'))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=ENV, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    listed, count, counted = proc.stdout.splitlines()
    assert listed == "[]" and int(count) > 0
    assert counted == "['explorer.families._counts', 'explorer.families._dims', 'explorer.families.sequence']"
