"""Plugins: the docs' example package (docs/how-to/plugins.md) installed into the test's environment and run as a study;
`module:Class` references; one-line errors for unknown and broken plugins and a missing extra."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

import explorer
import explorer.families
import explorer.tasks
from explorer.cli import app
from explorer.errors import ExplorerError
from explorer.families import family_names, get_family
from explorer.space import load_space
from explorer.tasks import get_task, task_names

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "how-to" / "plugins.md"


def example_files() -> dict[str, str]:
    """The docs' plugin example: each fenced block of its page whose first line is `# <file name>`."""
    blocks = re.findall(r"```\w+\n# (\S+)\n(.*?)```", PAGE.read_text(), re.S)
    return {name: body for name, body in blocks}


def install(site: Path) -> Path:
    """What `pip install` leaves for the example's package: the module and a dist-info with its entry points."""
    files = example_files()
    site.mkdir(parents=True, exist_ok=True)
    (site / "my_models.py").write_text(files["my_models.py"])
    project = tomllib.loads(files["pyproject.toml"])["project"]
    info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {ref}\n" for name, ref in refs.items()) + "\n"
        for group, refs in project["entry-points"].items()))
    return site


@pytest.fixture
def registries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plugins loaded by a test stay out of the registries other tests see."""
    for module in set(explorer.families.MODULES.values()):  # explorer's own register first, into the registries kept
        importlib.import_module(f"explorer.families.{module}")
    task_names()
    monkeypatch.setattr(explorer.families, "_REGISTRY", dict(explorer.families._REGISTRY))
    monkeypatch.setattr(explorer.tasks, "_REGISTRY", dict(explorer.tasks._REGISTRY))
    monkeypatch.delitem(sys.modules, "my_models", raising=False)


def build_and_install(project: Path, site: Path) -> Path:
    """The example's package built into a wheel by setuptools (the PEP 517 backend pip calls) and
    unpacked into `site`: what `pip install` leaves, without pip's network session."""
    built = subprocess.run([sys.executable, "-c", "import setuptools.build_meta as b; print(b.build_wheel('dist'))"],
                           cwd=project, check=True, capture_output=True, text=True).stdout.split()[-1]
    with zipfile.ZipFile(project / "dist" / built) as wheel:
        wheel.extractall(site)
    return site


@pytest.mark.slow  # a wheel build and a fresh interpreter (torch, optuna and explorer imported again)
def test_docs_plugin_package_runs_a_study_from_its_entry_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  registries: None) -> None:
    files = example_files()
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    (tmp_path / "dashboards").mkdir()  # what an earlier run leaves beside the module: setuptools must not package it
    (tmp_path / "dashboards" / "parity.html").write_text("<html></html>")
    site = build_and_install(tmp_path, tmp_path / "site")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "explorer", "run", str(tmp_path / "parity-study.yaml"), "--no-dashboard"],
                            capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "4/4 configurations measured" in result.stdout and "complete 4" in result.stdout
    monkeypatch.syspath_prepend(str(site))
    trials = explorer.load(tmp_path / "parity-study.yaml").trials()  # the same study, read from here
    assert sorted(trials["arch"]) == ["layers=1,heads=1", "layers=1,heads=2", "layers=2,heads=1", "layers=2,heads=2"]
    assert trials["accuracy"].between(0, 1).all()


def test_entry_points_are_listed_and_loaded_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, registries: None) -> None:
    monkeypatch.syspath_prepend(str(install(tmp_path / "site")))
    assert "torch-encoder" in family_names() and "parity" in task_names()
    family = get_family("torch-encoder")
    assert family.params({}) == sum(p.numel() for p in family.build({}).parameters()) > 0
    assert get_task("parity", {"n": 64}).dims() == {"vocab": 3, "seq_len": 8, "num_classes": 2}


def test_module_class_references_in_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, registries: None) -> None:
    (tmp_path / "my_models.py").write_text(example_files()["my_models.py"])  # importable, not installed
    monkeypatch.syspath_prepend(str(tmp_path))
    space = example_files()["parity-space.yaml"].replace("family: torch-encoder", "family: my_models:TorchEncoder")
    exp = explorer.create(tmp_path / "study", "parity", space=str(_write(tmp_path / "space.yaml", space)),
                          task={"name": "my_models:Parity", "n": 128}, budget={"epochs": 1, "batch_size": 32},
                          sampler={"name": "grid"}, n_trials=1)
    exp.run()
    (trial,) = exp.trials().query("state == 'COMPLETE'").itertuples()
    assert trial.state == "COMPLETE" and trial.params == exp.study.configs[trial.arch].params
    assert not any(":" in n for n in [*task_names(), *family_names()])  # a reference a study named is no registered name


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_unknown_names_list_the_known_ones() -> None:
    with pytest.raises(ExplorerError, match=r"unknown family 'gpt5'; known: .*causal-lm.*hf-gpt2.*module:Class"):
        get_family("gpt5")
    with pytest.raises(ExplorerError, match=r"^s\.yaml: task\.name: unknown task 'imagenet'; known: digits, "):
        get_task("imagenet", {}, source="s.yaml")


@pytest.mark.parametrize(
    ("module_text", "reference", "words"),
    [
        ("raise RuntimeError('no GPU here')\n", "broken:Family", "family plugin 'broken:Family' cannot be loaded: RuntimeError: no GPU here"),
        ("", "broken:Missing", "cannot be loaded: AttributeError: module 'broken' has no attribute 'Missing'"),
        ("class NotAFamily:\n    pass\n", "broken:NotAFamily", "is <class 'broken.NotAFamily'>, not a subclass of explorer's Family"),
        (None, "no_such_module:Family", "cannot be loaded: ModuleNotFoundError: No module named 'no_such_module'"),
    ],
    ids=["raises-on-import", "missing-class", "not-a-family", "missing-module"],
)
def test_broken_family_plugins_are_one_line_naming_the_space(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, registries: None,
                                                             module_text: str | None, reference: str, words: str) -> None:
    monkeypatch.delitem(sys.modules, "broken", raising=False)
    if module_text is not None:
        (tmp_path / "broken.py").write_text(module_text)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = _write(tmp_path / "space.yaml", f"name: s\nfamily: {reference}\nfree: {{layers: [1]}}\n")
    with pytest.raises(ExplorerError) as info:
        load_space(path)
    assert str(info.value).startswith(f"{path}: family: ") and words in str(info.value) and "\n" not in str(info.value)


def test_broken_entry_point_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, registries: None) -> None:
    info = tmp_path / "bad-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: bad\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[explorer.tasks]\nbad-task = gone_module:Task\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ExplorerError, match=r"^s\.yaml: task\.name: task plugin 'bad-task' \(entry point gone_module:Task in "
                                            r"explorer\.tasks\) cannot be loaded: ModuleNotFoundError"):
        get_task("bad-task", {}, source="s.yaml")


def test_a_study_naming_a_transformers_family_without_the_extra_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if it were not installed
    hint = "family 'hf-gpt2' needs transformers, which is not installed: pip install 'explorer[hf]'"
    with pytest.raises(ExplorerError, match=re.escape(f"tinystories-gpt2.yaml: family: {hint}")):
        explorer.load(ROOT / "studies/hf/tinystories-gpt2.yaml")
    result = CliRunner().invoke(app, ["params", str(ROOT / "spaces/hf/gpt2-small.yaml")])
    assert result.exit_code == 1 and isinstance(result.exception, ExplorerError) and hint in str(result.exception)
