"""The layout's promises, checked from the code (issue 21): one job a module, small classes, Optuna's
private names in one module, and a command line that goes through the Python API."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "explorer"
PRIVATE = re.compile(r"optuna\._|\._storage\b|\._trial_id\b|\._backend\b|RDBStorage\._|_pop_waiting_trial_id|storages\._rdb")


def python_files(*folders: Path) -> list[Path]:
    return sorted(p for folder in folders for p in folder.rglob("*.py"))


def test_no_module_above_450_lines_and_no_class_above_200() -> None:
    for path in python_files(PACKAGE):
        lines = path.read_text().splitlines()
        assert len(lines) <= 450, f"{path.relative_to(ROOT)}: {len(lines)} lines"
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, ast.ClassDef):
                size = node.end_lineno - node.lineno + 1
                assert size <= 200, f"{path.relative_to(ROOT)}: class {node.name} has {size} lines"


def test_optuna_private_names_appear_in_one_module_only() -> None:
    users = {str(p.relative_to(ROOT)) for p in python_files(PACKAGE, ROOT / "bench", ROOT / "tests")
             if p.name != "test_layout.py" and PRIVATE.search(p.read_text())}
    assert users == {"explorer/study/storage.py"}


def test_the_command_line_goes_through_the_python_api() -> None:
    source = (PACKAGE / "cli.py").read_text()
    imported = {node.module for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom)}
    imported |= {f"{node.module}.{a.name}" for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom)
                 for a in node.names}
    assert "explorer.api" in imported
    assert not [m for m in imported if m.startswith(("explorer.study", "explorer.executors", "explorer.frame", "explorer.recommend"))]
    assert not re.search(r"\.(store|queue|reads|evaluator)\.|\bstudy\.(open|read)\(", source)


def test_the_package_map_names_every_module_of_the_study() -> None:
    doc = (PACKAGE / "study" / "__init__.py").read_text()
    for module in (PACKAGE / "study").glob("*.py"):
        if module.name != "__init__.py":
            assert f"`{module.name}`" in doc, module.name
