"""Many `explorer run` workers on one PostgreSQL study: a real server (conftest's `server`), real worker
processes. Each test gets its own database.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from conftest import Server, write_study

pytest.importorskip("psycopg", reason="the postgres extra (psycopg 3) is not installed")


COMPLETE, FAIL, RUNNING = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL, optuna.trial.TrialState.RUNNING
SLOW_BUDGET = {"epochs": 6, "batch_size": 32, "lr": 0.003, "seed": 0}  # a few seconds a trial: time to kill one mid-way


def worker(path: Path, *args: str) -> subprocess.Popen:
    """One `explorer run` worker process (as a user would start it on another host); its output goes to
    a file beside the study (a pipe nobody reads while it runs would fill and block it)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    log = tempfile.NamedTemporaryFile("w+", dir=path.parent, prefix="worker-", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "-m", "explorer.cli", *(args or ("run",)), str(path), "--no-dashboard"],
                            env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    proc.log = Path(log.name)  # type: ignore[attr-defined]
    return proc


def await_trials(url: str, ready: Callable[[list[optuna.trial.FrozenTrial]], bool], procs: list[subprocess.Popen]) -> None:
    """Poll the storage until `ready(trials)`; fail if every worker exited first."""
    while True:
        try:
            trials = optuna.load_study(study_name="tiny", storage=url).get_trials(deepcopy=False)
        except (KeyError, sqlalchemy.exc.SQLAlchemyError):  # not created yet
            trials = []
        if ready(trials):
            return
        if all(p.poll() is not None for p in procs):
            pytest.fail("the workers exited before the awaited state: " + " | ".join(p.log.read_text()[-500:] for p in procs))
        time.sleep(0.2)


def finish(procs: list[subprocess.Popen], timeout: float = 300) -> list[tuple[int, str]]:
    """Each worker's exit status and output."""
    return [(p.wait(timeout), p.log.read_text()) for p in procs]


def completed_once(url: str, configs: int) -> list[optuna.trial.FrozenTrial]:
    """Every configuration trained to completion exactly once (a trial answered from storage, marked
    `duplicate_of`, is not trained: a worker that asks as the queue empties gets such a copy)."""
    trials = optuna.load_study(study_name="tiny", storage=url).trials
    done = Counter(t.params["arch"] for t in trials if t.state == COMPLETE and "duplicate_of" not in t.user_attrs)
    assert len(done) == configs and set(done.values()) == {1}, [(t.number, t.state.name, t.params) for t in trials]
    return trials


@pytest.mark.slow
def test_four_workers_finish_every_configuration_of_a_grid_once(server: Server, tmp_path: Path) -> None:
    url = server.database()
    path = write_study(tmp_path, storage=url)  # a grid of 6 configurations
    results = finish([worker(path) for _ in range(4)])
    failed = "\n\n".join(f"worker exited {rc}; its output:\n{out}" for rc, out in results if rc != 0)
    assert not failed, failed  # a string, printed whole (pytest shortens a list)
    trials = completed_once(url, 6)
    assert not [t for t in trials if t.state == FAIL]


@pytest.mark.slow
def test_a_worker_killed_mid_trial_has_its_configuration_rerun_by_the_others(server: Server, tmp_path: Path) -> None:
    url = server.database()
    path = write_study(tmp_path, storage=url, budget=SLOW_BUDGET)
    first = worker(path)
    await_trials(url, lambda ts: any(t.state == RUNNING and 1 <= len(t.user_attrs.get("curve", [])) <= 3 for t in ts),
                 [first])  # 3 of its 6 epochs still to go: it cannot end before the kill
    first.send_signal(signal.SIGKILL)  # mid-trial: its heartbeat stops, its trial stays RUNNING
    first.wait()
    stored = optuna.load_study(study_name="tiny", storage=url).trials  # read after the kill: no trial can end in between
    before = {t.number: t.values for t in stored if t.state == COMPLETE}
    killed = next(t for t in stored if t.state == RUNNING)
    results = finish([worker(path), worker(path)])
    assert all(rc == 0 for rc, _ in results), [e[-800:] for _, e in results]
    trials = completed_once(url, 6)
    assert {n: trials[n].values for n in before} == before  # nothing finished was lost
    assert trials[killed.number].state == FAIL
    assert any(t.state == COMPLETE and t.params["arch"] == killed.params["arch"] for t in trials[killed.number + 1:])


@pytest.mark.slow
def test_a_server_restart_mid_study_loses_and_repeats_nothing(server: Server, tmp_path: Path) -> None:
    if server.pgdata is None:
        pytest.skip("the server given in EXPLORER_TEST_POSTGRES cannot be restarted here (no EXPLORER_TEST_PGDATA)")
    url = server.database()
    path = write_study(tmp_path, storage=url, budget=SLOW_BUDGET)
    procs = [worker(path), worker(path)]
    await_trials(url, lambda ts: any(t.state == COMPLETE for t in ts) and any(t.state == RUNNING for t in ts), procs)
    before = {t.number: t.values for t in optuna.load_study(study_name="tiny", storage=url).trials if t.state == COMPLETE}
    server.restart()  # every open connection is dropped
    for rc, stderr in finish(procs):
        if rc != 0:  # a clear error is allowed: one line naming the storage, password masked
            lines = [line for line in stderr.splitlines() if line.startswith("error:")]
            assert len(lines) == 1 and "storage 'postgresql://explorer:***@" in lines[0] and "Traceback" not in stderr, stderr[-1500:]
    rc, stderr = finish([worker(path, "resume")])[0]  # continues once the dead workers' trials go stale
    assert rc == 0, stderr[-1500:]
    trials = completed_once(url, 6)
    assert {n: trials[n].values for n in before} == before


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["password", "database"])
def test_a_wrong_password_or_missing_database_is_one_line_with_the_password_masked(server: Server, tmp_path: Path, fault: str) -> None:
    good = sqlalchemy.engine.make_url(server.database())
    bad = good.set(password="not-the-password") if fault == "password" else good.set(database="no_such_database")
    path = write_study(tmp_path, storage=bad.render_as_string(hide_password=False))
    rc, out = finish([worker(path)])[0]
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert rc == 1 and len(errors) == 1, out
    expected = 'password authentication failed for user "explorer"' if fault == "password" else 'database "no_such_database" does not exist'
    assert f"cannot open storage 'postgresql://explorer:***@127.0.0.1:{good.port}/" in errors[0] and expected in errors[0]
    assert bad.password not in out and "Traceback" not in out


def test_a_url_whose_driver_is_missing_says_which_to_install(tmp_path: Path) -> None:
    if importlib.util.find_spec("psycopg2") is not None:
        pytest.skip("psycopg2 is installed here: no missing driver to report")
    from explorer.errors import ExplorerError
    from explorer.study import load_study_spec

    study = load_study_spec(write_study(tmp_path, storage="postgresql+psycopg2://explorer:hunter2@127.0.0.1:1/db"))
    with pytest.raises(ExplorerError) as err:
        study.open()
    assert str(err.value) == (f"{tmp_path / 'study.yaml'}: storage: cannot open storage 'postgresql+psycopg2://explorer:***@127.0.0.1:1/db': "
                              "No module named 'psycopg2'; install the driver (postgresql:// uses psycopg 3: pip install 'explorer[postgres]')")


def test_workers_opening_a_new_database_at_once_create_its_tables_one_at_a_time(server: Server, tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 28, item 2: Optuna creates its schema by check-then-create, and two workers that check
    before either commits both create (`type "studydirection" already exists`). Under the study's
    advisory lock one creates at a time: a rendezvous inside the creation never meets."""
    from test_workers import creating_at_once

    from explorer.study import load_study_spec

    path = write_study(tmp_path, storage=server.database())
    studies = [load_study_spec(path) for _ in range(4)]
    assert creating_at_once(monkeypatch, *(lambda s=s: s.open() for s in studies)) == (1, False)
