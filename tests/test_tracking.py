"""Trackers: a real MLflow tracking server (SQLite backend, started here), MLflow's local store beside the
study, and TensorBoard's event files read back with TensorBoard's own EventAccumulator; on the local and
Ray executors, across an interrupted and resumed run, and with a tracker that is down."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
import yaml
from conftest import write_study
from test_api import docs_block

import explorer
from explorer.errors import ExplorerError
from explorer.study import load_study_spec
from explorer.tracking.feed import Feed
from explorer.tracking.spec import TrackingSpec

mlflow = pytest.importorskip("mlflow", reason="the mlflow extra is not installed (pip install 'explorer[mlflow]')")
pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed (pip install 'explorer[tensorboard]')")
from mlflow import MlflowClient  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.plugins.hparams import plugin_data_pb2  # noqa: E402

COMPLETE = optuna.trial.TrialState.COMPLETE
ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`mlflow server` with an SQLite backend on a free port of 127.0.0.1, its files (and $HOME) in a temp dir; stopped after."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    command = shutil.which("mlflow", path=str(Path(sys.executable).parent)) or "mlflow"
    log = (root / "server.log").open("w")
    env = {**os.environ, "HOME": str(root), "TMPDIR": str(root)}  # its settings (under $HOME) and lock files stay here
    server = subprocess.Popen([command, "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
                               "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1",
                               "--port", str(port), "--workers", "1"],
                              cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:  # until it answers its health check (or exits)
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2):
                    break
            except OSError:
                assert server.poll() is None, (root / "server.log").read_text()[-2000:]
                time.sleep(0.5)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and the workers it started, in its own process group
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)
        log.close()


def runs(uri: str, experiment: str = "tiny") -> tuple[MlflowClient, dict[str, object], list[object]]:
    """The experiment's trial runs by name, and its summary runs."""
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no experiment {experiment!r} in {uri}"
    every = client.search_runs([found.experiment_id])
    trials = [r for r in every if "explorer.lineage" in r.data.tags]
    by_name = {r.info.run_name: r for r in trials}
    assert len(by_name) == len(trials), sorted(r.info.run_name for r in trials)  # one run per lineage
    return client, by_name, [r for r in every if r.data.tags.get("explorer.summary")]


def history(client: MlflowClient, run: object, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))


def board(folder: Path) -> dict[str, EventAccumulator]:
    """Each run folder of a TensorBoard log dir, loaded by TensorBoard's own reader."""
    out = {}
    for path in sorted(p for p in folder.iterdir() if p.is_dir()):
        acc = EventAccumulator(str(path))
        acc.Reload()
        out[path.name] = acc
    return out


def measured(path: Path) -> dict[int, optuna.trial.FrozenTrial]:
    """The completed trials by lineage (the first trial of their chain of retries)."""
    study = load_study_spec(path)
    return {study.lineage(t): t for t in study.read().get_trials(states=(COMPLETE,))}


def check_trial_runs(client: MlflowClient, by_name: dict, trials: dict[int, optuna.trial.FrozenTrial],
                     before: frozenset[int] = frozenset()) -> None:
    """Every completed trial is one finished run named by its lineage: configuration and seed as params,
    the stored curve epoch by epoch, the losses each epoch (not for those trained `before` tracking: the
    storage holds their metric's curve only), κ at initialisation (step 0) and at the end."""
    assert sorted(by_name) == sorted(str(k) for k in trials)
    for key, t in trials.items():
        run = by_name[str(key)]
        tags, params = run.data.tags, run.data.params
        assert run.info.status == "FINISHED" and tags["state"] == "COMPLETE" and tags["number"] == str(t.number)
        assert tags["explorer.arch"] == t.params["arch"] and tags["direction"] == "['MAXIMIZE', 'MINIMIZE']"
        assert {k: params[k] for k in ("layers", "heads", "seed")} == {"layers": str(t.user_attrs["layers"]),
                                                                        "heads": str(t.user_attrs["heads"]), "seed": "0"}
        curve = t.user_attrs["curve"]
        epochs = list(range(1, len(curve) + 1))
        accuracy, kappa = history(client, run, "accuracy"), history(client, run, "kappa")
        assert [s for s, _ in accuracy] == epochs and [v for _, v in accuracy] == pytest.approx(curve)
        assert [s for s, _ in history(client, run, "eval_loss")] == ([] if key in before else epochs)
        assert [s for s, _ in kappa] == [0, len(curve)]
        assert [v for _, v in kappa] == pytest.approx([t.user_attrs["kappa_init_mean"], t.user_attrs["kappa_final_mean"]])
        assert run.data.metrics["params"] == t.user_attrs["params"]


def check_board(folder: Path, trials: dict[int, optuna.trial.FrozenTrial]) -> None:
    """One TensorBoard run per lineage, its scalars at step = epoch, its configuration as hparams; and a summary."""
    runs_ = board(folder)
    assert "summary" in runs_ and "runs" in runs_["summary"].Tags()["scalars"]
    named = {int(name.split("-")[1]): acc for name, acc in runs_.items() if name.startswith("trial-")}
    assert sorted(named) == sorted(trials)
    for key, t in trials.items():
        acc = named[key]
        scalars = {e.step: e.value for e in acc.Scalars("accuracy")}
        assert [e.step for e in acc.Scalars("accuracy")] == list(range(1, len(t.user_attrs["curve"]) + 1))  # each epoch once
        assert list(scalars.values()) == pytest.approx(t.user_attrs["curve"])
        assert [e.step for e in acc.Scalars("kappa")] == [0, len(t.user_attrs["curve"])]
        start = plugin_data_pb2.HParamsPluginData.FromString(acc.PluginTagToContent("hparams")["_hparams_/session_start_info"])
        hparams = start.session_start_info.hparams
        assert hparams["heads"].number_value == t.user_attrs["heads"] and hparams["arch"].string_value == t.params["arch"]


def test_the_tracking_block_is_validated_and_names_the_file_and_field(tmp_path: Path) -> None:
    path = write_study(tmp_path, tracking={"mlflow": {"tracking_url": "http://x"}})
    with pytest.raises(ExplorerError, match=r"study\.yaml: tracking\.mlflow\.tracking_url: unknown field \(did you mean tracking_uri\?\)"):
        load_study_spec(path)
    path = write_study(tmp_path, tracking=["mlflow", "wandb"])
    with pytest.raises(ExplorerError, match=r"study\.yaml: tracking: 'wandb' is not a tracker; choose from mlflow, tensorboard"):
        load_study_spec(path)
    spec = load_study_spec(write_study(tmp_path, tracking=["mlflow", "tensorboard"])).spec.tracking
    assert spec.names == ["mlflow", "tensorboard"] and spec.mlflow.uri(tmp_path, "tiny") == f"sqlite:///{tmp_path.resolve()}/tiny.mlflow.db"
    spec = load_study_spec(write_study(tmp_path, tracking={"mlflow": False, "tensorboard": {"log_dir": "tb"}})).spec.tracking
    assert spec.names == ["tensorboard"] and spec.tensorboard.folder(tmp_path, "tiny") == (tmp_path / "tb").resolve()
    flagged = TrackingSpec().with_flags(["mlflow=http://127.0.0.1:5000", "tensorboard"])
    assert flagged.mlflow.tracking_uri == "http://127.0.0.1:5000" and flagged.tensorboard.log_dir is None
    assert spec.with_flags(["none"]).names == [] and spec.with_flags(["none", "mlflow"]).names == ["mlflow"]
    with pytest.raises(ExplorerError, match=r"--tracking: 'wandb': write mlflow or tensorboard"):
        TrackingSpec().with_flags(["wandb"])
    assert TrackingSpec().names == [] and load_study_spec(write_study(tmp_path)).spec.tracking.names == []  # opt-in
    readme = TrackingSpec.model_validate(yaml.safe_load(docs_block("how-to/trackers.md", "Turn it on", "yaml"))["tracking"])
    assert readme.names == ["mlflow", "tensorboard"]  # the docs' block, as written


@pytest.mark.slow
def test_a_tracking_server_and_tensorboard_hold_each_trial_once_and_a_resumed_trial_continues_its_run(
        mlflow_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C after the first epoch of trial 1 leaves its run KILLED; the resume's retry continues that run
    from epoch 2 (no second run, no epoch twice), in MLflow (a real server) and in TensorBoard's files."""
    path = write_study(tmp_path, n_trials=6, tracking={"mlflow": {"tracking_uri": mlflow_server}, "tensorboard": True})
    epoch = Feed.epoch

    def interrupting(self: Feed, ostudy: optuna.Study, trial_id: int, n: int, metrics: dict[str, float]) -> None:
        epoch(self, ostudy, trial_id, n, metrics)
        if self.ids[trial_id][0] == 1 and n == 1:
            os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, while trial 1 trains

    monkeypatch.setattr(Feed, "epoch", interrupting)
    lines: list[str | None] = []
    with pytest.raises(KeyboardInterrupt):
        explorer.load(path).run(on_start=lambda started: lines.append(started.tracking))
    assert lines == [f"tracking: mlflow {mlflow_server}; tensorboard {(tmp_path / 'tiny.tensorboard').resolve()}"]
    client, by_name, summaries = runs(mlflow_server)
    assert by_name["1"].info.status == "KILLED" and by_name["1"].data.tags["state"] == "INTERRUPTED"
    assert [s for s, _ in history(client, by_name["1"], "accuracy")] == [1] and not summaries

    monkeypatch.setattr(Feed, "epoch", epoch)
    explorer.load(path).run(resume=True)
    trials = measured(path)
    assert trials[1].number != 1  # the retry of trial 1 finished it, from its checkpoint
    client, by_name, summaries = runs(mlflow_server)
    check_trial_runs(client, by_name, trials)
    (summary,) = summaries
    assert summary.info.run_name == "summary" and summary.data.metrics["runs"] == 6
    assert any(k.startswith("answer at ") for k in summary.data.tags)
    assert {a.path for a in client.list_artifacts(summary.info.run_id)} == {"answers.csv", "configurations.csv"}
    check_board(tmp_path / "tiny.tensorboard", trials)
    out, err = capfd.readouterr()
    assert "View run" not in out and "warning" not in err  # no line per run through the progress bar


@pytest.mark.slow
def test_the_default_store_is_beside_the_study_and_tracking_turned_on_mid_study_leaves_no_gap(tmp_path: Path) -> None:
    """Trials run before `--tracking mlflow` are written from the storage when it is turned on, once: a
    later run with nothing left to train adds no run."""
    path = write_study(tmp_path, n_trials=2)
    explorer.load(path).run()
    before = frozenset(measured(path))
    doc = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**doc, "n_trials": 3}))
    explorer.load(path).run(resume=True, tracking=["mlflow"])
    uri = f"sqlite:///{tmp_path.resolve() / 'tiny.mlflow.db'}"
    client, by_name, summaries = runs(uri)
    trials = measured(path)
    assert len(trials) == 3 and len(before) == 2
    check_trial_runs(client, by_name, trials, before)
    explorer.load(path).run(resume=True, tracking=["mlflow"])
    client, again, summaries = runs(uri)
    assert {k: r.info.run_id for k, r in again.items()} == {k: r.info.run_id for k, r in by_name.items()} and len(summaries) == 1
    assert client.get_experiment_by_name("tiny").artifact_location == (tmp_path.resolve() / "tiny.mlflow-artifacts").as_uri()


@pytest.mark.slow
def test_a_tracker_that_is_down_is_one_warning_line_and_the_study_goes_on(tmp_path: Path) -> None:
    path = write_study(tmp_path, n_trials=2)
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "explorer.cli", "run", str(path), "--no-dashboard", "--tracking", f"mlflow={down}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line.lower()]
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: tracking: mlflow cannot start: {down} does not answer"), proc.stderr
    assert "the study goes on without it" in warnings[0] and "Traceback" not in proc.stderr
    assert len(measured(path)) == 2


@pytest.mark.slow
def test_the_ray_driver_tracks_each_trial_epoch_by_epoch(tmp_path: Path) -> None:
    """On Ray the driver writes the runs (Tune hands it every result): the same runs as a local study's."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    executor = {"name": "ray", "cpu": 1, "max_concurrent": 2, "checkpoint_every_s": 0}
    path = write_study(tmp_path, n_trials=3, executor=executor, tracking=["mlflow", "tensorboard"])
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})  # as tests/test_ray.py
    ray.init(address=cluster.address, logging_level="WARNING")
    try:
        explorer.load(path).run()
    finally:
        ray.shutdown()
        cluster.shutdown()
    trials = measured(path)
    client, by_name, summaries = runs(f"sqlite:///{tmp_path.resolve() / 'tiny.mlflow.db'}")
    check_trial_runs(client, by_name, trials)
    assert len(summaries) == 1
    check_board(tmp_path / "tiny.tensorboard", trials)
