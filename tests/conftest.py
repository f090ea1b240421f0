"""Tiny spaces and studies on temp files: real code paths, seconds each on a CPU.

The suite runs as on a fresh machine and must leave nothing behind: for the session, $HOME and the
system temp dir ($TMPDIR, `tempfile`, Ray's session files) are empty folders of its own, the timm
count cache lives under pytest's temp dir, and a run that left anything in either folder fails. Under
pytest-xdist (two workers, pyproject.toml) the controller makes both folders and checks them at the end.
Comparing the real /tmp and home before and after would flake: other programs write there meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml

from bench.pgserver import NoServer, Server, throwaway_postgres

# Tiny models: one thread is fastest and immune to a busy neighbour core. EXPLORER_TEST_TORCH_THREADS runs
# the suite at another count, which changes how kernels split their sums (issue 36: no test may depend on it).
TORCH_THREADS = int(os.environ.get("EXPLORER_TEST_TORCH_THREADS", "1"))
torch.set_num_threads(TORCH_THREADS)

# What engines leave in a temp dir by design: Ray its session folders (`ray/`) and Tune's lock files,
# torch the inductor cache that importing timm creates (`torchinductor_<user>`); multiprocessing
# removes its `pymp-*` folders only when the interpreter exits; MLflow a lock file per SQLite store it creates;
# gunicorn (under `mlflow server`) its control socket, in $XDG_RUNTIME_DIR (else it makes $HOME/.gunicorn),
# and headless Chromium its dconf cache there.
ENGINE_NAMES, ENGINE_PREFIXES = {"ray", "_ray_lockfiles", "gunicorn.ctl", "dconf"}, ("torchinductor_", "pymp-", "db_init_lock-")
_OWN: dict[str, Path] = {}


def pytest_sessionstart(session: pytest.Session) -> None:
    """Point $HOME and the temp dir at empty folders beside pytest's own base temp, all in memory (/dev/shm)
    where the machine has room: every study writes its storage (SQLite, journal, PostgreSQL's data) and its
    checkpoints there, and a commit's fsync on a busy disk took 10-20 ms (issue 34: a third of test_study.py)."""
    if hasattr(session.config, "workerinput"):
        return  # a pytest-xdist worker: its controller set all this up before starting it, and checks it at the end
    factory = session.config._tmp_path_factory  # pytest's tmp_path_factory; no public handle before the first test
    memory = Path("/dev/shm")
    if "PYTEST_DEBUG_TEMPROOT" not in os.environ and memory.is_dir() and os.access(memory, os.W_OK):
        free = os.statvfs(memory)
        if free.f_bavail * free.f_frsize >= 8 << 30:
            os.environ["PYTEST_DEBUG_TEMPROOT"] = str(memory)  # pytest's documented root for its temp dirs
    base = factory.getbasetemp()  # fixed now, so pytest keeps its last runs there
    real = Path(os.environ.get("PYTEST_DEBUG_TEMPROOT") or tempfile.gettempdir())
    _OWN["TMPDIR"] = Path(tempfile.mkdtemp(prefix="xt-", dir=real))  # short: Ray puts sockets in it
    _OWN["TMPDIR"].chmod(0o1777)  # like /tmp: a PostgreSQL server the tests start as `postgres` works in it
    _OWN["HOME"] = Path(tempfile.mkdtemp(prefix="xh-", dir=real))
    os.environ.update({name: str(path) for name, path in _OWN.items()})
    os.environ["XDG_RUNTIME_DIR"] = str(_OWN["TMPDIR"])  # gunicorn (mlflow server) puts its control socket there, else in $HOME/.gunicorn
    for name in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "MLFLOW_TRACKING_URI"):
        os.environ.pop(name, None)  # the user's cluster, token and tracking server are not the tests' (each test sets its own)
    os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"  # else importing mlflow writes an installation id under $HOME
    os.environ["EXPLORER_CACHE_DIR"] = str(base / "explorer-cache")
    tempfile.tempdir = None  # read $TMPDIR again


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files with the most slow tests first, each file's tests in their own order: pytest-xdist hands out files
    in this order, so the long files no longer run last on one worker while the other waits (alphabetically
    they were near the end: test_ray, test_reliability, test_stress, test_tracking)."""
    slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
    first_seen = {path: i for i, path in enumerate(dict.fromkeys(item.path for item in items))}
    items.sort(key=lambda item: (-slow[item.path], first_seen[item.path]))


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Fail the run if a test left anything in the session's home or temp dir; remove both either way."""
    if hasattr(session.config, "workerinput"):
        return  # the controller checks once every worker is done
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


def assert_within_rounding(a, b, rel: float, examples: int | None) -> None:
    """Two trials of one run by different code paths (float32 where the other has float64, vmapped where the
    other is not) agree within float rounding: losses within `rel`, accuracy within one of the `examples`
    eval examples (one whose two largest logits are that close may flip); which way the last bit falls
    depends on the processor's kernels, so `==` across code paths passes on one machine and fails on the next."""
    assert a.steps == b.steps and a.metrics.keys() == b.metrics.keys()
    for name, value in a.metrics.items():
        close = pytest.approx(value, abs=1 / examples + 1e-12) if name == "accuracy" else pytest.approx(value, rel=rel)
        assert b.metrics[name] == close, name
    if "accuracy" in a.metrics:
        assert b.curve == pytest.approx(a.curve, abs=1 / examples + 1e-12)
    else:
        assert b.curve == pytest.approx(a.curve, rel=rel)


# -- a PostgreSQL server (test_postgres.py, test_stress.py) -------------------------------------------
@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """A PostgreSQL server: the one `.ci/run` starts (EXPLORER_TEST_POSTGRES, EXPLORER_TEST_PGDATA), or else
    a throwaway one (bench/pgserver.py); without PostgreSQL installed the test skips, saying so."""
    pytest.importorskip("psycopg", reason="the postgres extra (psycopg 3) is not installed")
    url = os.environ.get("EXPLORER_TEST_POSTGRES")
    if url:
        owner = os.environ.get("EXPLORER_TEST_PGUSER")
        yield Server(url, os.environ.get("EXPLORER_TEST_PGDATA"), ["runuser", "-u", owner, "--"] if owner else [])
        return
    with contextlib.ExitStack() as stack:
        try:
            started = stack.enter_context(throwaway_postgres("explorer-test"))
        except NoServer as err:
            pytest.skip(f"no PostgreSQL server can be started here: {err}")
        yield started


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread, and two threads thrash when the 2 cores are shared."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(TORCH_THREADS)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default space's 24 configurations at 2 to 4 seeds each (budget.seeds 4: some below the cap), one
    failure, every budget decided: what test_cli_output and test_terminal read."""
    from test_dashboard import fill_replicates

    from explorer.study import load_study_spec

    spec = tmp_path_factory.mktemp("replicated") / "rep.yaml"
    space = Path(__file__).resolve().parents[1] / "spaces" / "vit-digits.yaml"
    spec.write_text(f"name: rep\nspace: {space}\ntask: {{name: digits}}\nn_trials: 24\nbudget: {{epochs: 1, seeds: 4}}\n")
    fill_replicates(load_study_spec(spec).open(create=True))
    return spec
