"""Commands that need no heavy engine do not import one: `import explorer.cli`, `explorer params` of an
own family and `explorer status` stay near the cost of importing torch (bench/startup.py times them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import write_study

ROOT = Path(__file__).resolve().parents[1]
HEAVY = {"timm", "torchvision", "transformers", "ray", "plotly", "sklearn", "scipy.stats"}
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def imported(args: list[str], cwd: Path) -> set[str]:
    """The modules a fresh interpreter imports to run `args`, from `-X importtime`'s report."""
    proc = subprocess.run([sys.executable, "-X", "importtime", *args], cwd=cwd, env=ENV, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}


def test_import_cli_loads_no_heavy_engine(tmp_path: Path) -> None:
    assert HEAVY.isdisjoint(imported(["-c", "import explorer.cli"], tmp_path))


def test_params_and_status_of_an_own_family_load_no_heavy_engine(tmp_path: Path) -> None:
    path = write_study(tmp_path, budget={"epochs": 1, "batch_size": 128, "lr": 0.003, "seed": 0}, n_trials=1)
    subprocess.run([sys.executable, "-m", "explorer.cli", "run", str(path), "--no-dashboard"], cwd=tmp_path, env=ENV,
                   check=True, capture_output=True)
    for command in (["params", str(tmp_path / "space.yaml")], ["status", str(path)]):
        modules = imported(["-m", "explorer.cli", *command], tmp_path)
        assert "explorer.families" in modules and HEAVY.isdisjoint(modules), (command, sorted(HEAVY & modules))
