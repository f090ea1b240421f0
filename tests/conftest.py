"""Tiny spaces and studies on temp files: real code paths, seconds each on a CPU.

The suite runs as on a fresh machine and must leave nothing behind: for the session, $HOME and the
system temp dir ($TMPDIR, `tempfile`, Ray's session files) are empty folders of its own, the timm
count cache lives under pytest's temp dir, and a run that left anything in either folder fails.
Comparing the real /tmp and home before and after would flake: other programs write there meanwhile.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
import yaml

torch.set_num_threads(1)  # tiny models: one thread is fastest and immune to a busy neighbour core

# What engines leave in a temp dir by design: Ray its session folders (`ray/`) and Tune's lock files,
# torch the inductor cache that importing timm creates (`torchinductor_<user>`); multiprocessing
# removes its `pymp-*` folders only when the interpreter exits.
ENGINE_NAMES, ENGINE_PREFIXES = {"ray", "_ray_lockfiles"}, ("torchinductor_", "pymp-")
_OWN: dict[str, Path] = {}


def pytest_sessionstart(session: pytest.Session) -> None:
    """Point $HOME and the temp dir at empty folders (the real temp dir keeps pytest's own base temp)."""
    factory = session.config._tmp_path_factory  # pytest's tmp_path_factory; no public handle before the first test
    base = factory.getbasetemp()  # fixed now, in the real temp dir, so pytest keeps its last runs there
    real = Path(tempfile.gettempdir())
    _OWN["TMPDIR"] = Path(tempfile.mkdtemp(prefix="xt-", dir=real))  # short: Ray puts sockets in it
    _OWN["TMPDIR"].chmod(0o1777)  # like /tmp: a PostgreSQL server the tests start as `postgres` works in it
    _OWN["HOME"] = Path(tempfile.mkdtemp(prefix="xh-", dir=real))
    os.environ.update({name: str(path) for name, path in _OWN.items()})
    for name in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        os.environ.pop(name, None)  # the user's cluster and token are not the tests' (each Ray test sets its own)
    os.environ["EXPLORER_CACHE_DIR"] = str(base / "explorer-cache")
    tempfile.tempdir = None  # read $TMPDIR again


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Fail the run if a test left anything in the session's home or temp dir; remove both either way."""
    left = []
    for name, path in _OWN.items():
        entries = sorted(os.listdir(path))
        left += [f"${name}/{e}" for e in entries
                 if name == "HOME" or not (e in ENGINE_NAMES or e.startswith(ENGINE_PREFIXES))]
        shutil.rmtree(path, ignore_errors=True)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        reporter.write("\n")  # after the progress line
        reporter.write_sep("!", f"tests left files behind: {', '.join(left)}", red=True)
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


TINY_SPACE = {
    "name": "tiny",
    "family": "image-encoder",
    "fixed": {"width": 16, "mlp": 32, "img_size": 8, "patch": 4, "in_chans": 1, "num_classes": 10},
    "free": {"layers": [1, 2], "heads": "divisors"},
    "constraints": {"fixed_mlp": True, "min_head_dim": 4},
    "baseline": {"layers": 2, "heads": 1},
}


def tiny_study_doc(**overrides) -> dict:
    doc = {
        "name": "tiny",
        "space": "space.yaml",
        "task": {"name": "digits"},
        "budget": {"epochs": 2, "batch_size": 128, "lr": 0.003, "seed": 0},
        "sampler": {"name": "grid", "seed": 0},
        "n_trials": 6,
        "heartbeat_s": 1,
        # a checkpoint after every epoch: tests kill and resume trials mid-way (the default, one at most
        # every 30 s, writes none in trials this short)
        "executor": {"checkpoint_every_s": 0},
    }
    doc.update(overrides)
    return doc


def write_study(folder: Path, space_doc: dict | None = None, **overrides) -> Path:
    """A space and a study YAML in `folder`; the study's SQLite file lands beside them."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "space.yaml").write_text(yaml.safe_dump(space_doc or TINY_SPACE, sort_keys=False))
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(tiny_study_doc(**overrides), sort_keys=False))
    return path


@pytest.fixture
def tiny_study(tmp_path: Path) -> Path:
    return write_study(tmp_path)
