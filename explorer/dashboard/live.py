"""`explorer dashboard --serve`: the report served by a small local server, following its studies live.

The page is the static report (page.py) with two additions: the running trials' curves, read from the
`curve` each executor stores after every epoch, and a script that asks `state?have=VERSION` every few
seconds and updates the page in place: the figures with `Plotly.react` (a zoom or a hidden trace stays:
`uirevision`), the summary and tables by their ids. No reload, and nothing is sent when nothing changed.

The server is the standard library's threading HTTP server, bound to 127.0.0.1 unless told otherwise. It
reads each storage through `Store.read`, opened once, and writes nothing. The report (posterior and all)
is computed again only when a trial starts or ends; an epoch of a running trial redraws its figure alone.
"""

from __future__ import annotations

import errno
import hashlib
import json
import socket
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pandas as pd

from explorer.dashboard.page import PLOT_CONFIG, frame_of, meta_of, page, parts
from explorer.dashboard.plots import figures, running_figure
from explorer.dashboard.reading import summaries
from explorer.errors import ExplorerError
from explorer.study import load_study_spec

RUNNING = "fig-running"


class LiveReport:
    """The studies' report, read again on each request and rendered again when their trials change."""

    def __init__(self, paths: Sequence[str | Path], every: float = 5.0):
        studies = [load_study_spec(p) for p in paths]
        self.every = every
        self.meta = {s.spec.name: meta_of(s) for s in studies}
        self.ostudies = {s.spec.name: s.read() for s in studies}  # read only; opened once
        self._lock = threading.Lock()  # one reader of the storages at a time
        self._report: tuple[str, dict[str, Any]] = ("", {})  # (trials' version, the figures and parts it gave)

    def state(self, have: str = "") -> dict[str, Any]:
        """What changed since version `have`: everything when a trial started or ended, the running trials'
        figure alone when only their epochs moved, only the version when nothing did."""
        with self._lock:
            frames = {name: frame_of(ostudy) for name, ostudy in self.ostudies.items()}
            trials, epochs = _versions(frames)
            version = f"{trials}.{epochs}"
            if have == version:
                return {"version": version}
            if self._report[0] != trials:
                stats = summaries(frames, self.meta)
                shown = {div: _plotly(fig, div) for div, fig in figures(frames, self.meta, stats).items()}
                self._report = (trials, {"figures": shown, "html": parts(frames, self.meta, stats)})
            out: dict[str, Any] = {"version": version, "figures": {RUNNING: _plotly(running_figure(frames, self.meta), RUNNING)}}
            if have.split(".")[0] != trials:
                out["figures"].update(self._report[1]["figures"])
                out["html"] = self._report[1]["html"]
            return out

    def page(self) -> str:
        """The whole page, as the first request gets it; its script asks for what changed from its version on."""
        with self._lock:
            frames = {name: frame_of(ostudy) for name, ostudy in self.ostudies.items()}
            version = ".".join(_versions(frames))
            figure = running_figure(frames, self.meta).to_html(full_html=False, include_plotlyjs=False, div_id=RUNNING,
                                                               config=PLOT_CONFIG)
            live = {"status": '<p id="live">live: this page follows the studies as they run</p>',
                    "figure": f"<section>{figure}</section>",
                    "script": f"<script>{_LIVE_JS % (json.dumps(version), int(self.every * 1000), json.dumps(PLOT_CONFIG))}</script>"}
            return page(frames, self.meta, live)


def _versions(frames: dict[str, pd.DataFrame]) -> tuple[str, str]:
    """A short key of the trials' states (a trial started, ended, was queued) and of the running trials' curves."""
    trials, epochs = hashlib.sha1(), hashlib.sha1()
    for name, df in frames.items():
        trials.update(repr((name, list(zip(df["number"], df["state"])))).encode())
        running = df[df["state"] == "RUNNING"]
        epochs.update(repr((name, list(zip(running["number"], running["curve"].map(list))))).encode())
    return trials.hexdigest()[:12], epochs.hexdigest()[:12]


def _plotly(fig: Any, div: str) -> dict[str, Any]:
    """A figure as Plotly.react takes it; `uirevision` keeps the reader's zoom and hidden traces across updates."""
    fig.update_layout(uirevision=div)
    return json.loads(fig.to_json())


_LIVE_JS = """
(function () {
  var have = %s, every = %d, config = %s, busy = false, status = document.getElementById('live');
  document.documentElement.dataset.version = have;
  function apply(state) {
    Object.keys(state.figures || {}).forEach(function (id) {
      var el = document.getElementById(id), fig = state.figures[id];
      if (el) Plotly.react(el, fig.data, fig.layout, config);
    });
    Object.keys(state.html || {}).forEach(function (id) {
      var el = document.getElementById(id);
      if (el) el.innerHTML = state.html[id];
    });
    if (state.html) explorerSortable();
    if (state.version !== have) {
      var root = document.documentElement;
      root.dataset.updates = Number(root.dataset.updates || 0) + 1;
      root.dataset.version = have = state.version;
    }
    status.textContent = 'live: up to date at ' + new Date().toLocaleTimeString();
  }
  function poll() {
    if (busy) return;
    busy = true;
    fetch('state?have=' + encodeURIComponent(have), {cache: 'no-store'})
      .then(function (r) { if (!r.ok) throw new Error('HTTP ' + r.status); return r.json(); })
      .then(apply)
      .catch(function (e) { status.textContent = 'live: the server does not answer (' + e.message + '); trying again'; })
      .finally(function () { busy = false; });
  }
  setInterval(poll, every);
})();
"""


class _Handler(BaseHTTPRequestHandler):
    report: LiveReport  # set on the server's own subclass

    def do_GET(self) -> None:  # noqa: N802  (http.server's name)
        url = urlsplit(self.path)
        try:
            if url.path == "/":
                answer = (200, "text/html; charset=utf-8", self.report.page().encode())
            elif url.path == "/state":
                have = parse_qs(url.query).get("have", [""])[0]
                answer = (200, "application/json", json.dumps(self.report.state(have)).encode())
            else:
                answer = (404, "text/plain; charset=utf-8", b"not found: / is the report, /state what changed\n")
        except Exception as err:  # noqa: BLE001  a storage that cannot be read now: the page says so and asks again
            answer = (503, "text/plain; charset=utf-8", f"{type(err).__name__}: {err}".encode())
        try:
            self._send(*answer)
        except ConnectionError:  # the reader closed the page meanwhile
            pass

    def _send(self, code: int, kind: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  one line per poll would flood the terminal
        pass


def make_server(paths: Sequence[str | Path], host: str = "127.0.0.1", port: int = 8050, every: float = 5.0) -> ThreadingHTTPServer:
    """The live report's server, bound (port 0: any free one) but not yet serving; stop it with `shutdown()`."""
    handler = type("Handler", (_Handler,), {"report": LiveReport(paths, every)})
    kind = type("Server", (ThreadingHTTPServer,), {"address_family": socket.AF_INET6 if ":" in host else socket.AF_INET,
                                                   "daemon_threads": True})
    try:
        return kind((host, port), handler)
    except (OSError, OverflowError) as err:  # the port is taken or out of range, the address is not this machine's
        taken = isinstance(err, OSError) and err.errno == errno.EADDRINUSE
        hint = "; pass --port 0 for any free port, or another --port" if taken else ""
        raise ExplorerError(f"cannot listen on {host}:{port}: {getattr(err, 'strerror', None) or err}{hint}",
                            field="--port") from None


def serve(paths: Sequence[str | Path], host: str = "127.0.0.1", port: int = 8050, every: float = 5.0,
          on_ready: Callable[[str], None] | None = None) -> None:
    """Serve the live report of `paths` until Ctrl-C; `on_ready(url)` once it listens."""
    server = make_server(paths, host, port, every)
    bound_host, bound_port = server.server_address[:2]
    shown = f"[{bound_host}]" if ":" in str(bound_host) else bound_host
    if on_ready is not None:
        on_ready(f"http://{shown}:{bound_port}/")
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
