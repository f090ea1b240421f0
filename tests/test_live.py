"""`explorer dashboard --serve`: the report served live. Its protocol on a real SQLite study (what changed
since a version, read only, bound to 127.0.0.1), and in headless Chromium driven over the DevTools
protocol: a running trial's new epoch appears in the open page without a reload, and its end moves it
into the report."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest
from conftest import write_study
from test_pareto import fill_study

from explorer.dashboard import FIGURES
from explorer.dashboard.live import RUNNING, make_server
from explorer.errors import ExplorerError
from explorer.executors.local import LocalExecutor
from explorer.study import load_study_spec

ROOT = Path(__file__).resolve().parents[1]


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def until(check: Callable[[], Any], what: str, timeout: float = 180.0) -> Any:
    """`check()` once it is truthy; fails saying `what` it waited for."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return value


def test_the_server_reads_only_binds_to_this_machine_and_sends_what_changed(tmp_path: Path) -> None:
    space = ROOT / "spaces" / "vit-digits.yaml"
    spec = tmp_path / "tiny.yaml"
    spec.write_text(f"name: tiny\nspace: {space}\ntask: {{name: digits}}\nn_trials: 2\n")
    ostudy = fill_study(load_study_spec(spec).open(create=True))
    db = tmp_path / "tiny.db"
    stored = hashlib.sha256(db.read_bytes()).hexdigest()
    files = sorted(p.name for p in tmp_path.iterdir())
    server = make_server([spec], port=0, every=0.5)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    host, port = server.server_address[:2]
    base = f"http://127.0.0.1:{port}"
    try:
        assert host == "127.0.0.1"  # this machine only, unless told otherwise
        code, page = get(f"{base}/")
        assert code == 200 and page.count(b"Plotly.newPlot(") == len(FIGURES) + 1 and f'id="{RUNNING}"'.encode() in page
        assert b'<script>\n(function () {\n  var have = ' in page and b'<ul id="summary">' in page
        code, body = get(f"{base}/state")
        state = json.loads(body)
        assert code == 200 and set(state["figures"]) == {*FIGURES, RUNNING} and set(state["html"]) == {"summary", "answers", "configs", "trials"}
        assert state["figures"]["fig-front"]["layout"]["uirevision"] == "fig-front"  # a reader's zoom survives updates
        assert json.loads(get(f"{base}/state?have={state['version']}")[1]) == {"version": state["version"]}  # nothing changed
        assert get(f"{base}/nothing")[0] == 404
        with pytest.raises(ExplorerError, match=rf"--port: cannot listen on 127\.0\.0\.1:{port}: Address already in use"):
            make_server([spec], port=port)  # one line, not a traceback
        assert hashlib.sha256(db.read_bytes()).hexdigest() == stored and sorted(p.name for p in tmp_path.iterdir()) == files

        trial = ostudy.ask()  # a trial starts
        trial.set_user_attr("arch", "layers=2,heads=4")
        trial.set_user_attr("curve", [0.5])
        new = json.loads(get(f"{base}/state?have={state['version']}")[1])
        assert new["version"] != state["version"] and "html" in new and "1 running" in new["html"]["summary"]
        (running,) = new["figures"][RUNNING]["data"]
        assert running["y"] == [0.5] and f"trial {trial.number} layers=2,heads=4" in running["name"]
        trial.set_user_attr("curve", [0.5, 0.75])  # its next epoch: the running figure alone is sent
        epoch = json.loads(get(f"{base}/state?have={new['version']}")[1])
        assert set(epoch) == {"version", "figures"} and set(epoch["figures"]) == {RUNNING}
        assert epoch["figures"][RUNNING]["data"][0]["y"] == [0.5, 0.75]
    finally:
        server.shutdown()
        server.server_close()


class Browser:
    """Headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`: it reads
    commands on fd 3 and writes answers on fd 4, each a JSON text ended by a NUL byte)."""

    def __init__(self, chromium: str, home: Path):
        commands, self._to = os.pipe()
        self._from, answers = os.pipe()
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (commands, answers)]  # clear of 3 and 4 themselves

        def pipes() -> None:  # in the child, before exec: its fds 3 and 4 (dup2 leaves them open across exec)
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
                 "--disable-background-networking", "--disable-component-update", f"--user-data-dir={home / 'profile'}",
                 "--remote-debugging-pipe", "about:blank"]
        # fontconfig and Chromium write caches and settings under $HOME whatever --user-data-dir says, and its
        # singleton socket in a temp dir of its own (a short path: a socket's is limited), removed on close
        self.tmp = tempfile.mkdtemp(prefix="xc-")
        env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / "config"), "XDG_CACHE_HOME": str(home / "cache"),
               "TMPDIR": self.tmp}
        self.log = home / "chromium.log"
        with self.log.open("w") as log:
            self.proc = subprocess.Popen([chromium, *flags], preexec_fn=pipes, close_fds=False, env=env,
                                         stdout=subprocess.DEVNULL, stderr=log)
        for fd in (commands, answers, *high):
            os.close(fd)
        self._id, self._buffer, self.session = 0, b"", None

    def call(self, method: str, params: dict | None = None, timeout: float = 60.0) -> dict:
        self._id += 1
        message = {"id": self._id, "method": method, "params": params or {}}
        if self.session and not method.startswith("Target."):
            message["sessionId"] = self.session
        os.write(self._to, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:  # events and other answers come in between: skip to ours
            while b"\0" not in self._buffer:
                assert select.select([self._from], [], [], max(0.0, deadline - time.monotonic()))[0], f"no answer to {method}"
                chunk = os.read(self._from, 1 << 20)
                assert chunk, f"Chromium closed its pipe: {self.log.read_text()[-2000:]}"
                self._buffer += chunk
            text, self._buffer = self._buffer.split(b"\0", 1)
            answer = json.loads(text)
            if answer.get("id") == self._id:
                assert "error" not in answer, answer["error"]
                return answer["result"]

    def open(self, url: str) -> None:
        target = self.call("Target.createTarget", {"url": url})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]

    def js(self, expression: str) -> Any:
        """The value of `expression` in the page; None if it throws (the page may still be loading)."""
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        return None if "exceptionDetails" in result else result["result"].get("value")

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=10)
            self.proc.wait(30)
        except (AssertionError, OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(30)
        shutil.rmtree(self.tmp, ignore_errors=True)
        os.close(self._to)
        os.close(self._from)


CURVES = f"JSON.stringify(Array.from(document.getElementById('{RUNNING}').data || []).map(t => Array.from(t.y)))"


@pytest.mark.browser
@pytest.mark.slow
def test_a_running_trials_new_epoch_appears_in_the_open_page_without_a_reload(tmp_path: Path) -> None:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    path = write_study(tmp_path, n_trials=1, budget={"epochs": 3, "batch_size": 128, "lr": 0.003, "seed": 0})
    study = load_study_spec(path)
    ostudy = study.open()
    reached, go = [threading.Event() for _ in range(3)], [threading.Event() for _ in range(3)]
    go[2].set()
    errors: list[BaseException] = []

    def on_epoch(s: optuna.Study, trial_id: int, epoch: int, metrics: dict[str, float]) -> None:
        reached[epoch - 1].set()  # the epoch is stored: the trial waits here until the test lets it go on
        assert go[epoch - 1].wait(600)

    def train() -> None:
        try:
            LocalExecutor().run(study, ostudy, on_epoch=on_epoch)
        except BaseException as err:  # noqa: BLE001  said by the test
            errors.append(err)

    trainer = threading.Thread(target=train)
    trainer.start()
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "explorer.cli", "dashboard", str(path), "--serve", "--port", str(port),
                               "--every", "0.5"], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    browser = None
    try:
        assert reached[0].wait(300), errors
        url = f"http://127.0.0.1:{port}/"
        until(lambda: server.poll() is not None or _answers(url), "the server")
        assert server.poll() is None, server.stderr.read()
        browser = Browser(chromium, tmp_path)
        browser.open(url)
        until(lambda: browser.js("document.documentElement.dataset.rendered") == str(len(FIGURES)), "the page's figures")
        first = until(lambda: json.loads(browser.js(CURVES) or "[]"), "the running trial's first epoch")
        assert len(first) == 1 and len(first[0]) == 1
        browser.js("window.explorerMark = 'the same page'")  # a reload would lose it

        go[0].set()
        assert reached[1].wait(300), errors
        (curve,) = until(lambda: [c for c in json.loads(browser.js(CURVES) or "[]") if len(c) == 2], "the second epoch in the page")
        assert curve[0] == first[0][0]
        assert browser.js("window.explorerMark") == "the same page" and int(browser.js("document.documentElement.dataset.updates")) >= 1

        go[1].set()
        trainer.join(600)
        assert not trainer.is_alive() and not errors, errors
        until(lambda: browser.js(CURVES) == "[]" and "COMPLETE" in (browser.js("document.getElementById('trials').textContent") or ""),
              "the finished trial in the report's tables")
        assert browser.js("window.explorerMark") == "the same page" and browser.js("document.documentElement.dataset.errors") is None
        assert browser.js("document.getElementById('fig-front').data.length") > 0  # the front redrawn in place, with it
        browser.js("document.querySelectorAll('#trials th')[1].click()")  # the replaced table sorts by its own column
        assert browser.js("document.querySelector('#trials th[data-dir]').textContent") == "number"
        assert browser.js("document.documentElement.dataset.errors") is None
    finally:
        for gate in go:
            gate.set()
        trainer.join(600)
        if browser is not None:
            browser.close()
        server.send_signal(signal.SIGINT)  # Ctrl-C stops the server, exit 0
        out, err = server.communicate(timeout=60)
    assert server.returncode == 0 and f"dashboard: http://127.0.0.1:{port}/ (live" in out and "Traceback" not in err, (out, err)


def _answers(url: str) -> bool:
    try:
        return get(url)[0] == 200
    except OSError:
        return False
