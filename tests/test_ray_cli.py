"""A Ray cluster started the way docs/how-to/ray.md says (`ray start --head`, then `ray start --address` for a
second node), a study run on it with `explorer run --address`, and the worker node stopped mid-study.

Each `ray start` runs with `--block` in its own process group, so the test stops exactly the nodes it
started (its raylet and Ray's own daemons are in that group), never a blanket `ray stop`, which would
stop every Ray on the machine. The cluster uses token authentication as the docs advise: the test
writes a throwaway token in its temp dir and gives every Ray process RAY_AUTH_MODE=token and
RAY_AUTH_TOKEN_PATH, so it runs the same whether or not the user has a ~/.ray/auth_token (never read).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from conftest import TINY_SPACE, write_study

pytest.importorskip("ray")

EXECUTOR = {"name": "ray", "cpu": 1, "max_concurrent": 2, "max_failures": 3, "storage_path": "ray-results"}
# a grid of 4: one trial starts on each node, and the other two (and the moved one) run on the head once the worker
# node is gone (each of its 20 epochs is a trial of seconds: a grid of 6 cost two more of them, and tests no more)
FOUR = {**TINY_SPACE, "free": {"layers": [1, 2], "heads": [1, 2]}}


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The environment of every Ray process here: token mode with this test's own token."""
    token = tmp_path / "auth_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    base = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_TOKEN"}  # it would win over the file
    return {**base, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token), "OMP_NUM_THREADS": "1",
            # SIGTERM stops a node at once: Ray drains it first for up to 30 s (RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S),
            # which outlasted `stop`'s 15 s wait at every teardown
            "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
            # the head's health checks every 1 s, not 3 s: a stopped node is declared dead after 5 failed checks,
            # about 5 s rather than 15 (a live node still has each check's 10 s timeout to answer, as by default)
            "RAY_health_check_period_ms": "1000",
            # its workers at the tests' priority, not Ray's niceness 15 (tests/test_ray.py's cluster says why)
            "RAY_worker_niceness": "0"}


def ray_node(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    """`ray start ... --block` in a process group of its own; returns once the node is up."""
    ray = shutil.which("ray", path=str(Path(sys.executable).parent)) or "ray"
    out = log.open("w")
    proc = subprocess.Popen([ray, "start", *args, "--num-cpus", "1", "--disable-usage-stats", "--block"],
                            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    while "Ray runtime started" not in log.read_text():
        assert proc.poll() is None, log.read_text()[-2000:]
        time.sleep(0.2)
    return proc


def stop(proc: subprocess.Popen) -> None:
    """Stop one node: its `ray start`, raylet and workers, all in its process group."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # what SIGTERM left (gcs_server, raylet)
    except ProcessLookupError:
        pass
    proc.wait()


@pytest.fixture
def head(tmp_path: Path, env: dict[str, str]) -> Iterator[tuple[str, Path]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    temp = Path(tempfile.gettempdir()) / f"ray-{port}"  # Ray's socket paths must stay short: not under tmp_path
    proc = ray_node(["--head", "--node-ip-address", "127.0.0.1", "--port", str(port), "--temp-dir", str(temp),
                     "--include-dashboard", "false"], tmp_path / "head.log", env)
    try:
        yield f"127.0.0.1:{port}", temp
    finally:
        stop(proc)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.slow
def test_a_study_on_a_cli_cluster_survives_its_worker_node_stopping(head: tuple[str, Path], env: dict[str, str], tmp_path: Path) -> None:
    address, _ = head
    worker = ray_node(["--address", address], tmp_path / "worker.log", env)
    try:
        budget = {"epochs": 20, "batch_size": 16, "lr": 0.003, "seed": 0}  # epochs to spare after the 2nd: the node stops mid-trial
        path = write_study(tmp_path, FOUR, budget=budget, executor=EXECUTOR)
        driver = subprocess.Popen([sys.executable, "-m", "explorer.cli", "run", str(path), "--address", address, "--no-dashboard"],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        while True:  # until a trial on the worker node has reported an epoch and trains still
            assert driver.poll() is None, driver.stdout.read()
            # the rows are written by the driver, which can lag by seconds under load: whether the trial still
            # trains (not the next one on the same reused worker) is read from its process
            there = [pid for trial, pid in _reported(tmp_path / "ray-results") if _descends_from(pid, worker.pid)
                     and _training(pid) == trial]
            if there:
                break
            time.sleep(0.2)
        # the node goes away mid-trial, at once: SIGKILL, as a machine that fails (under SIGTERM a trial of a
        # few seconds could finish while the node shut down, and then none moved)
        for kill in (lambda: os.killpg(worker.pid, signal.SIGKILL), lambda: os.kill(there[0], signal.SIGKILL)):
            with contextlib.suppress(ProcessLookupError):
                kill()
        stop(worker)
        output, _ = driver.communicate(timeout=600)
    finally:
        stop(worker)
    assert driver.returncode == 0, output[-3000:]
    trials = optuna.load_study(study_name="tiny", storage=f"sqlite:///{tmp_path / 'tiny.db'}").trials
    done = Counter(t.params["arch"] for t in trials if t.state == optuna.trial.TrialState.COMPLETE)
    assert len(done) == 4 and set(done.values()) == {1}, [(t.number, t.state.name, t.user_attrs.get("fail_reason")) for t in trials]
    rows = _results(tmp_path / "ray-results")
    assert len({r["node"] for r in rows}) == 2  # both nodes ran trials ...
    assert any(len({r["node"] for r in rows if r["trial_id"] == t}) == 2 for t in {r["trial_id"] for r in rows})  # ... and one moved
    for noise in ("Number of trials", "Tuner.restore", "train_trial pid=", "Token authentication", "INFO"):
        assert noise not in output, output  # Ray's box, advice and logs went to tiny.ray.log instead
    assert "Started a local Ray instance" not in output and (tmp_path / "tiny.ray.log").stat().st_size > 0


def test_ray_client_is_refused_in_one_line_before_anything_is_written(env: dict[str, str], tmp_path: Path) -> None:
    """Under Ray Client Tune runs its driver on the head node (ray/tune/tuner.py: `TunerInternal` as an actor
    forced onto the client server's node), where this study's SQLite path would be opened (another file, or
    none) and this run's progress and Ctrl-C handling would be lost: before, `--address ray://` was advertised
    and did that. Refused from the address alone, from --address or RAY_ADDRESS, before connecting (no Ray
    Client server can run here anyway: it needs `ray[client]`, which explorer does not install)."""
    path = write_study(tmp_path, executor=EXECUTOR)
    url = "ray://127.0.0.1:10001"
    command = [sys.executable, "-m", "explorer.cli", "run", str(path), "--no-dashboard"]
    for args, extra in (([ "--address", url], {}), ([], {"RAY_ADDRESS": url})):
        out = subprocess.run(command + args, env={**env, **extra}, capture_output=True, text=True, timeout=300)
        assert out.returncode == 1, out.stderr
        assert out.stderr.strip().splitlines()[-1] == (
            f"error: {path}: executor.address: {url} is Ray Client, under which Ray Tune's driver (and this study's storage and "
            "searcher) would run on the head node, not here: run `explorer run` on the head node with --address auto (or from any "
            "node with the head's host:port, e.g. 10.0.0.1:6379)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["auth_token", "space.yaml", "study.yaml"]  # nothing written


def _results(root: Path) -> list[dict]:
    """The driver's result rows of every trial, each with its trial's folder name (`folder`)."""
    rows = []
    for f in root.glob("*/*/result.json"):
        rows += [{**json.loads(line), "folder": f.parent.name} for line in f.read_text().splitlines() if line.strip()]
    return rows


def _reported(root: Path) -> list[tuple[str, int]]:
    """(trial folder name, worker pid) for each trial that reported an epoch, by the driver's result rows."""
    return sorted({(r["folder"], r["pid"]) for r in _results(root) if r.get("epoch", 0) >= 1})


def _training(pid: int) -> str | None:
    """The trial Ray worker `pid` trains now, by its working folder (named as the trial's folder of results);
    None between trials (Ray titles it `ray::IDLE`, not `ray::ImplicitFunc.train`)."""
    try:
        if not Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::ImplicitFunc.train"):
            return None
        return Path(os.readlink(f"/proc/{pid}/cwd")).name
    except OSError:
        return None


def _descends_from(pid: int, ancestor: int) -> bool:
    """Whether `ancestor` (a node's `ray start`) started `pid` (a trial's worker, via that node's raylet)."""
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return False
    return False
