"""MLflow: each trial a run in the experiment named after the study, as Optuna's MLflowCallback makes them.

Its conventions, so that users find what they expect: run name = trial number (here the lineage's first
trial, which a resumed retry continues), tags `number`, `state`, `direction`, `datetime_start` and
`datetime_complete`, the trial's parameters as params; and explorer's: the configuration, seed and
budget as params, the per-epoch metrics and κ at step = epoch, `explorer.*` tags that key a run to its
study and lineage (what a resume looks up instead of opening a second run), and one `summary` run with
the study's answers. MLflow is imported here only, when a study tracks to it; it is written through
`MlflowClient` (not the fluent API, whose active run is one per process) from the feed's one thread.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
import urllib.error
import urllib.request
from typing import Any

from explorer.tracking.base import STATUS, End, Run, Summary, Tracker, TrackerDown

MAX_TAG = 5000  # MLflow refuses tag values over 8000 characters (a long failure reason); Optuna cuts them too


class MLflowTracker(Tracker):
    name = "mlflow"

    def __init__(self, uri: str, experiment: str, scope: dict[str, str], artifacts: str | None = None):
        """`scope`: the tags every run of this study carries (its name, storage and a key of both), by which
        its runs are found again; `artifacts`: where a new experiment keeps its files (the local default store's)."""
        self.uri, self.scope = uri, scope
        _reachable(uri)
        logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)  # "Creating initial MLflow database tables..."
        from mlflow import MlflowClient
        from mlflow.entities import Metric, Param, RunTag

        self._metric, self._param, self._tag = Metric, Param, RunTag
        self.client = MlflowClient(uri)
        found = self.client.get_experiment_by_name(experiment)
        if found is None:
            try:
                found = self.client.get_experiment(self.client.create_experiment(experiment, artifact_location=artifacts))
            except Exception:  # another process created it meanwhile
                found = self.client.get_experiment_by_name(experiment)
                if found is None:
                    raise
        if found.lifecycle_stage == "deleted":  # deleted in the UI: its name is still taken
            self.client.restore_experiment(found.experiment_id)
        self.experiment: str = found.experiment_id
        self.runs: dict[int, tuple[str, str]] = {}  # lineage -> (run id, state tag)
        self.last: dict[int, int] = {}  # lineage -> the last epoch it holds
        self.summary_id: str | None = None
        self._find()

    def where(self) -> str:
        return self.uri

    def _find(self) -> None:
        """This study's runs already in the experiment (an earlier run or resume of it)."""
        token = None
        while True:
            page = self.client.search_runs([self.experiment], f"tags.`explorer.study_key` = '{self.scope['explorer.study_key']}'",
                                           max_results=10_000, page_token=token)
            for r in page:
                tags = r.data.tags
                if tags.get("explorer.summary"):
                    self.summary_id = r.info.run_id
                elif "explorer.lineage" in tags:
                    self.runs[int(tags["explorer.lineage"])] = (r.info.run_id, tags.get("state", "RUNNING"))
            token = page.token
            if not token:
                return

    def known(self) -> dict[int, str | None]:
        return {key: state for key, (_, state) in self.runs.items()}

    def open(self, run: Run) -> None:
        if run.key in self.runs:  # a retry continues its lineage's run, after the epochs it holds
            run_id = self.runs[run.key][0]
            self.client.update_run(run_id, status="RUNNING")
            if run.key not in self.last:
                self.last[run.key] = max((m.step for m in self.client.get_metric_history(run_id, run.metric)), default=0)
            self.client.log_batch(run_id, tags=self._tags(run.tags))
        else:
            created = self.client.create_run(self.experiment, start_time=run.start_ms, tags={**self.scope, **_cut(run.tags)},
                                             run_name=str(run.key))
            run_id = created.info.run_id
            params = [self._param(k, str(v)) for k, v in run.params.items()]
            for i in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
                self.client.log_batch(run_id, params=params[i:i + 100])
            self.last[run.key] = 0
        self.runs[run.key] = (run_id, "RUNNING")

    def log(self, key: int, metrics: dict[str, float], step: int) -> None:
        if key not in self.runs or step <= self.last.get(key, 0):
            return
        now = _now()
        self.client.log_batch(self.runs[key][0], metrics=[self._metric(k, v, now, step) for k, v in metrics.items()])
        self.last[key] = step

    def end(self, end: End) -> None:
        if end.key not in self.runs:
            return
        run_id = self.runs[end.key][0]
        now = _now()
        self.client.log_batch(run_id, metrics=[self._metric(k, v, now, step) for k, v, step in end.metrics],
                              tags=self._tags({**end.tags, "state": end.state}))
        with _no_link():
            self.client.set_terminated(run_id, STATUS.get(end.state, "FINISHED"), end_time=end.end_ms)
        self.runs[end.key] = (run_id, end.state)

    def summary(self, summary: Summary) -> None:
        if self.summary_id is None:
            self.summary_id = self.client.create_run(self.experiment, tags={**self.scope, "explorer.summary": "true"},
                                                     run_name="summary").info.run_id
        else:
            self.client.update_run(self.summary_id, status="RUNNING")
        now = _now()
        self.client.log_batch(self.summary_id, metrics=[self._metric(k, v, now, summary.step) for k, v in summary.metrics.items()],
                              tags=self._tags(summary.tags))
        for name, text in summary.tables.items():
            self.client.log_text(self.summary_id, text, name)
        with _no_link():
            self.client.set_terminated(self.summary_id, "FINISHED")

    def _tags(self, tags: dict[str, str]) -> list[Any]:
        return [self._tag(k, v) for k, v in _cut(tags).items()]


def _cut(tags: dict[str, str]) -> dict[str, str]:
    return {k: v if len(v) <= MAX_TAG else v[:MAX_TAG - 3] + "..." for k, v in tags.items()}


@contextmanager
def _no_link() -> Iterator[None]:
    """MLflow prints "View run ... at: URL" on stdout as a run ends on a server: through a progress bar, for every trial."""
    name = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"
    before = os.environ.get(name)
    os.environ[name] = "true"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def _now() -> int:
    return int(time.time() * 1000)


def _reachable(uri: str) -> None:
    """A tracking server answers its health check within seconds, or it is down: MLflow's own client
    would retry each request for minutes."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=5) as response:
            response.read()
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise TrackerDown(f"{uri} does not answer ({reason})") from None
