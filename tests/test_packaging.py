"""pyproject's bounds admit what the suite runs on, so a passing suite is evidence for the declared range."""

from __future__ import annotations

import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

PROJECT = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]


def test_requires_python_admits_this_interpreter():
    running = ".".join(map(str, sys.version_info[:3]))
    assert SpecifierSet(PROJECT["requires-python"]).contains(running)


@pytest.mark.parametrize("line", PROJECT["dependencies"])
def test_installed_engine_is_inside_its_pin(line: str):
    req = Requirement(line)
    try:
        installed = version(req.name)
    except PackageNotFoundError:
        pytest.skip(f"{req.name} is not installed")
    assert req.specifier.contains(installed, prereleases=True), f"{req.name} {installed} outside {req.specifier}"
