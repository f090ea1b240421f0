"""The layout's promises, checked from the code (issues 21 and 28): one job a module, small classes,
Optuna's private names in one module on the bottom floor, modules that import only downward, and a
command line that goes through the Python API."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "explorer"
PRIVATE = re.compile(r"optuna\._|\._storage\b|\._trial_id\b|\._study_id\b|\._backend\b|RDBStorage\._(?!_)|_pop_waiting_trial_id|"
                     r"storages\._rdb|storages\._heartbeat")


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
    assert users == {"explorer/optuna_compat.py", "explorer/optuna_cache.py"}  # the Ray driver's cache is built on them


def test_the_command_line_goes_through_the_python_api() -> None:
    source = "\n".join(p.read_text() for p in sorted(PACKAGE.glob("cli*.py")))  # cli.py and the commands' modules
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


def imports_of(path: Path, modules: set[str], typing: bool = False) -> set[str]:
    """The explorer modules `path` imports at run time (at the top or inside functions), with the packages
    that importing them runs first; imports that serve type checking alone (`if TYPE_CHECKING:`) count only
    with `typing`, and the top package `explorer` never does (its `__init__` imports nothing eagerly)."""
    tree = ast.parse(path.read_text())
    typing_only = set() if typing else {
        id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for child in node.body for n in ast.walk(child)}
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    out = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for n in names:  # importing a.b.c runs the package a.b first, unless it is one of this module's own
            out |= {n} | {p for p in parents(n) if p not in parents(package + ".x") and p != "explorer"}
    return out & modules


def parents(module: str) -> set[str]:
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def module_graph(typing: bool = False) -> dict[str, set[str]]:
    def name(p: Path) -> str:
        parts = p.relative_to(ROOT).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    files = {name(p): p for p in python_files(PACKAGE)}
    return {m: imports_of(p, set(files), typing) - {m} for m, p in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_package_imports_form_no_cycle() -> None:
    """Every module imports only downward (DESIGN.md): no circle of modules importing each other,
    counting imports inside functions too."""
    assert cycles(module_graph()) == []


def test_no_circle_even_through_imports_for_type_checking() -> None:
    """Issue 34: a module that names another's class for its types depends on it too. `study/spec.py` built
    the jobs that took its `Study` back as a type, and `families/_transformer.py` took its dims from the
    families that build it; now the spec is data below its jobs (a composition root, `study/root.py`,
    above them) and the dims live in `families/_dims.py` below both."""
    assert cycles(module_graph(typing=True)) == []


def test_the_cycle_finder_finds_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
