"""A finished study's storage opened by optuna-dashboard's server, started as docs/how-to/dashboards.md says."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import optuna
import pytest
from conftest import write_study

from explorer.executors.local import LocalExecutor
from explorer.study import load_study_spec

pytest.importorskip("optuna_dashboard", reason="optuna-dashboard is not installed (pip install optuna-dashboard)")


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


@pytest.mark.slow
def test_optuna_dashboard_lists_the_study_with_its_trials_and_both_objectives(tmp_path: Path) -> None:
    path = write_study(tmp_path, n_trials=2)
    study = load_study_spec(path)
    ostudy = study.open()
    LocalExecutor().run(study, ostudy)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = shutil.which("optuna-dashboard", path=str(Path(sys.executable).parent)) or "optuna-dashboard"
    server = subprocess.Popen([command, study.store.url, "--host", "127.0.0.1", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        while True:  # until the server answers (or exits)
            try:
                _get(f"{base}/api/meta")
                break
            except (urllib.error.URLError, ConnectionError):
                assert server.poll() is None, server.stderr.read()
                time.sleep(0.2)
        (listed,) = _get(f"{base}/api/studies")["study_summaries"]
        assert listed["study_name"] == "tiny" and listed["directions"] == ["maximize", "minimize"]
        detail = _get(f"{base}/api/studies/{listed['study_id']}")
        complete = [t for t in detail["trials"] if t["state"] == "Complete"]
        stored = {t.number: t.values for t in ostudy.get_trials(states=(optuna.trial.TrialState.COMPLETE,))}
        assert len(complete) == len(stored) == 2
        for t in complete:  # both objectives: accuracy and parameters, as stored
            assert [float(v) for v in t["values"]] == stored[t["number"]]
        assert {"accuracy", "params"} <= {a["key"] for a in detail["union_user_attrs"]}
    finally:
        server.terminate()
        server.wait(10)
