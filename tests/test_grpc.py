"""A study whose storage is Optuna's gRPC storage proxy (`storage: grpc://host:port`, issue 34): a real proxy
server in a subprocess (over explorer's SQLite storage), real `explorer run` worker processes, `status` and
`dashboard` through the proxy, and workers killed with SIGKILL: their trials and the study's lock (a token
in the storage, explorer.study.lock._TokenLock) are taken back after three heartbeats.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from conftest import write_study
from test_postgres import SLOW_BUDGET, await_trials, completed_once, finish, worker

pytest.importorskip("grpc", reason="the grpc extra (grpcio) is not installed")

COMPLETE, FAIL, RUNNING = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL, optuna.trial.TrialState.RUNNING
SERVER = """
import sys
import optuna
from explorer.study.sqlite import SQLiteStorage
storage = SQLiteStorage(sys.argv[1], engine_kwargs={"connect_args": {"timeout": 60}})
optuna.storages.run_grpc_proxy_server(storage, host="127.0.0.1", port=int(sys.argv[2]))
"""


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[str]:
    """A gRPC storage proxy on a free port, its storage a SQLite file; its URL for a study YAML."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp_path / "proxy.log").open("w")
    server = subprocess.Popen([sys.executable, "-c", SERVER, f"sqlite:///{tmp_path / 'behind-proxy.db'}", str(port)],
                              stdout=log, stderr=subprocess.STDOUT)
    optuna.storages.GrpcStorageProxy(host="127.0.0.1", port=port).wait_server_ready(timeout=60)
    try:
        yield f"grpc://127.0.0.1:{port}"
    finally:
        server.kill()
        server.wait()
        log.close()


def reader(url: str) -> optuna.storages.BaseStorage:
    host, port = url.removeprefix("grpc://").split(":")
    return optuna.storages.GrpcStorageProxy(host=host, port=int(port))


@pytest.mark.slow
def test_workers_status_and_dashboard_through_the_proxy(proxy: str, tmp_path: Path) -> None:
    path = write_study(tmp_path, storage=proxy)  # a grid of 6 configurations
    results = finish([worker(path) for _ in range(3)])
    failed = "\n\n".join(f"worker exited {rc}; its output:\n{out}" for rc, out in results if rc != 0)
    assert not failed, failed
    completed_once(reader(proxy), 6)
    studies = {s.study_name for s in reader(proxy).get_all_studies()}
    assert studies == {"tiny", "tiny.explorer-lock"}  # the study, and its lock's token (explorer.study.lock._TokenLock)
    status = subprocess.run([sys.executable, "-m", "explorer.cli", "status", str(path)], capture_output=True, text=True)
    assert status.returncode == 0 and "6/6 configurations measured" in status.stdout, status.stdout + status.stderr
    out = tmp_path / "tiny.html"
    dashboard = subprocess.run([sys.executable, "-m", "explorer.cli", "dashboard", str(path), "--out", str(out)],
                               capture_output=True, text=True)
    assert dashboard.returncode == 0 and "plotly" in out.read_text(), dashboard.stderr


@pytest.mark.slow
def test_a_worker_killed_mid_trial_has_its_configuration_rerun_by_the_others(proxy: str, tmp_path: Path) -> None:
    path = write_study(tmp_path, storage=proxy, budget=SLOW_BUDGET)
    first = worker(path)
    storage = reader(proxy)
    await_trials(storage, lambda ts: any(t.state == RUNNING and 1 <= len(t.user_attrs.get("curve", [])) <= 3 for t in ts), [first])
    first.send_signal(signal.SIGKILL)  # mid-trial: its heartbeat stops, its trial stays RUNNING
    first.wait()
    stored = optuna.load_study(study_name="tiny", storage=reader(proxy)).trials
    before = {t.number: t.values for t in stored if t.state == COMPLETE}
    killed = next(t for t in stored if t.state == RUNNING)
    results = finish([worker(path), worker(path)])
    assert all(rc == 0 for rc, _ in results), [out[-800:] for _, out in results]
    trials = completed_once(reader(proxy), 6)
    assert {n: trials[n].values for n in before} == before
    assert trials[killed.number].state == FAIL
    assert any(t.state == COMPLETE and t.params["arch"] == killed.params["arch"] for t in trials[killed.number + 1:])


HOLDER = """
import sys, time
from explorer.study.lock import StudyLock
lock = StudyLock(None, sys.argv[1], "tiny", 60, heartbeat_s=1)
with lock():
    print("held", flush=True)
    time.sleep(600)
"""


def test_the_lock_of_a_worker_killed_while_holding_it_is_taken_back(proxy: str) -> None:
    from explorer.study.lock import StudyLock

    holder = subprocess.Popen([sys.executable, "-c", HOLDER, proxy], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    lock = StudyLock(None, proxy, "tiny", timeout_s=1, heartbeat_s=1)
    with pytest.raises(Exception, match="held by another worker past 1 s"):  # its holder beats: not taken from it
        with lock():
            pass
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    start = time.monotonic()
    with StudyLock(None, proxy, "tiny", timeout_s=60, heartbeat_s=1)():
        waited = time.monotonic() - start
    assert waited >= 2  # three heartbeats without a beat, on this process's clock
    with lock():  # given back: taken at once
        pass


def test_a_proxy_that_does_not_answer_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once the socket is closed
    path = write_study(tmp_path, storage=f"grpc://127.0.0.1:{port}", storage_timeout_s=1)
    out = subprocess.run([sys.executable, "-m", "explorer.cli", "status", str(path)], capture_output=True, text=True)
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert out.returncode == 1 and len(errors) == 1 and "Traceback" not in out.stderr, out.stderr
    assert f"cannot open storage 'grpc://127.0.0.1:{port}': no gRPC storage proxy answered at 127.0.0.1:{port} within 1 s" in errors[0]
