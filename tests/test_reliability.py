"""Reliability under load and faults: several workers, storage faults, kills, hung and failing trials.

Everything here is real: `explorer run` subprocesses on one SQLite or journal file, real training
steps, real SQLite errors. What is simulated is said where it is.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
import sqlalchemy
import torch
import yaml
from conftest import TINY_SPACE, write_study

import explorer
from explorer.errors import ExplorerError
from explorer.executors.local import LocalExecutor
from explorer.families import get_family
from explorer.study import load_study_spec
from explorer.study.evaluate import Evaluator
from explorer.optuna_compat import pop_waiting, storage_of
from explorer.study.liveness import beating
from explorer.study.storage import Store
from explorer.watchdog import TrialTimeout, time_limit

COMPLETE, FAIL, RUNNING = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL, optuna.trial.TrialState.RUNNING
# 12 feasible configurations (layers 1-4 x heads 1, 2, 4) that train in a fraction of a second
WIDE_SPACE = {**TINY_SPACE, "free": {"layers": [1, 2, 3, 4], "heads": "divisors"}}
QUICK = {"epochs": 1, "max_steps": 2, "batch_size": 64, "lr": 0.003, "seed": 0}
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def run(path: Path, **open_kwargs) -> optuna.Study:
    study = load_study_spec(path)
    ostudy = study.open(**open_kwargs)
    LocalExecutor().run(study, ostudy)
    return ostudy


def worker(path: Path, command: str = "run") -> subprocess.Popen:
    """One `explorer run` process, as a user would start it on another core or host."""
    return subprocess.Popen([sys.executable, "-m", "explorer.cli", command, str(path), "--no-dashboard"], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def await_condition(condition, timeout: float = 120) -> None:
    """Poll `condition()` until it holds (a storage state, not a guessed delay)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not reached in {timeout} s"
        time.sleep(0.1)


def stale_failed(study, ostudy: optuna.Study) -> bool:
    """Fail (and re-queue) the trials of dead workers whose grace period has passed, as every worker does."""
    study.queue.waiting(ostudy)
    return True


def trained(ostudy: optuna.Study) -> list[str]:
    """The configuration of each trial that actually trained to completion (not answered from storage)."""
    return [t.params["arch"] for t in ostudy.get_trials(states=(COMPLETE,)) if "duplicate_of" not in t.user_attrs]


# -- several workers on one study ----------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("storage, n", [(None, 3), ("journal:tiny.log", 2)], ids=["sqlite", "journal"])
def test_workers_share_a_grid_study_and_train_each_configuration_once(tmp_path: Path, storage: str | None, n: int) -> None:
    path = write_study(tmp_path, space_doc=WIDE_SPACE, budget=QUICK, n_trials=12, storage=storage)
    procs = [worker(path) for _ in range(n)]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert not any("database is locked" in o for o in outs)
    ostudy = load_study_spec(path).open(create=False)
    archs = trained(ostudy)
    assert sorted(archs) == sorted(load_study_spec(path).keys)  # each configuration exactly once
    # a worker that asks just after another popped the last queued trial gets a configuration answered from
    # storage: recorded as a duplicate, it neither trains nor counts
    complete = ostudy.get_trials(states=(COMPLETE,))
    assert len([t for t in complete if "duplicate_of" not in t.user_attrs]) == 12 and not ostudy.get_trials(states=(FAIL, RUNNING))
    by_number = {t.number: t for t in complete}
    assert all(t.values == by_number[t.user_attrs["duplicate_of"]].values for t in complete if "duplicate_of" in t.user_attrs)


def test_queued_grid_trials_are_popped_once_under_a_race(tmp_path: Path) -> None:
    """Six threads pop one queue at once through separate storages (connections): no trial twice."""
    path = write_study(tmp_path, space_doc=WIDE_SPACE, n_trials=12)
    load_study_spec(path).open()
    got: list[str] = []
    start = threading.Barrier(6)

    def pop() -> None:
        study = load_study_spec(path)
        ostudy = study.open(create=False)
        start.wait()
        while True:
            trial_id = pop_waiting(ostudy)  # what `ask()` does first: the atomic claim
            if trial_id is None:
                return
            got.append(storage_of(ostudy).get_trial(trial_id).system_attrs["fixed_params"]["arch"])

    threads = [threading.Thread(target=pop) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == sorted(load_study_spec(path).keys)


def test_a_worker_waits_for_another_workers_trial_and_runs_the_replicates_its_result_asks_for(tmp_path: Path) -> None:
    """With nothing to start while another worker trains the last configuration, a worker neither trains
    it again nor exits: it waits, and trains the replicate seeds that trial's result queues."""
    path = write_study(tmp_path, budget={**QUICK, "seeds": 2}, replicates={"policy": "fixed"}, n_trials=1,
                       sampler={"name": "random", "seed": 0})
    study = load_study_spec(path)
    ostudy = study.open()
    other, cfg = study.queue.claim(ostudy)  # another worker's trial, mid-training, beating
    beats = beating(ostudy, other)
    beats.__enter__()

    def finish_other() -> None:  # once this worker has found nothing to start (it repairs and waits)
        await_condition(lambda: waited.is_set())
        attrs = study.evaluator.evaluate(cfg, other.number)
        for key, value in attrs.items():
            other.set_user_attr(key, value)
        ostudy.tell(other, study.evaluator.values(attrs))
        beats.__exit__(None, None, None)

    waited = threading.Event()
    waiting = study.queue.waiting
    study.queue.waiting = lambda s: (waited.set(), waiting(s))[1]
    threading.Thread(target=finish_other).start()
    LocalExecutor().run(study, ostudy)
    runs = sorted((t.params["arch"], t.user_attrs.get("seed", 0), t.number) for t in ostudy.get_trials(states=(COMPLETE,)))
    assert [r[:2] for r in runs] == [(cfg.key, 0), (cfg.key, 1)] and runs[0][2] == other.number
    assert not any("duplicate_of" in t.user_attrs for t in ostudy.trials)


def test_a_trial_taken_by_a_worker_that_died_before_its_first_heartbeat_is_rerun(tmp_path: Path) -> None:
    """Optuna fails only trials whose heartbeat went stale; one popped from the queue by a worker
    killed before its first heartbeat (a window of milliseconds) is failed and re-queued too."""
    path = write_study(tmp_path, budget=QUICK)
    study = load_study_spec(path)
    ostudy = study.open()
    orphan = pop_waiting(ostudy)  # what the dead worker's `ask()` did, and no more
    await_condition(lambda: stale_failed(study, ostudy) and storage_of(ostudy).get_trial(orphan).state == FAIL)  # past the grace period
    LocalExecutor().run(study, ostudy)
    assert storage_of(ostudy).get_trial(orphan).state == FAIL
    assert sorted(trained(ostudy)) == sorted(study.keys)


# -- storage faults ----------------------------------------------------------------------------------------
def hold_lock(db: Path, seconds: float, kind: str = "EXCLUSIVE") -> subprocess.Popen:
    """Another process takes SQLite's exclusive lock on `db` (or, IMMEDIATE, a writer's) and keeps it for `seconds`."""
    code = (f"import sqlite3, time; c = sqlite3.connect({str(db)!r}, isolation_level=None); c.execute('BEGIN {kind}');"
            f" print('locked', flush=True); time.sleep({seconds}); c.execute('COMMIT')")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def stored(ostudy: optuna.Study) -> dict[int, tuple]:
    """Every completed trial: its configuration and values, and the accuracy a measurement recorded."""
    return {t.number: (t.params["arch"], tuple(t.values), t.user_attrs.get("accuracy")) for t in ostudy.get_trials(states=(COMPLETE,))}


def wait_for_completed(path: Path, at_least: int, timeout: float = 120) -> None:
    """Poll the storage until it holds `at_least` completed trials (start-up is slow on a busy machine)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.3)
        try:
            if len(stored(load_study_spec(path).open(create=False))) >= at_least:
                return
        except ExplorerError:  # the study is not created yet
            continue
    raise AssertionError(f"no {at_least} completed trials after {timeout} s")


def one_line_naming_storage(err: ExplorerError, path: Path, words: str) -> None:
    message = str(err)
    assert "\n" not in message and message.startswith(f"{path}: storage: ") and words in message, message


def test_a_briefly_locked_storage_is_waited_for(tmp_path: Path) -> None:
    path = write_study(tmp_path, budget=QUICK, n_trials=2, storage_timeout_s=20)
    before = stored(run(path))
    lock = hold_lock(tmp_path / "tiny.db", 1.5)
    ostudy = run(write_study(tmp_path, budget=QUICK, n_trials=3, storage_timeout_s=20))
    lock.wait()
    after = stored(ostudy)
    assert len(after) == 3 and all(after[n] == v for n, v in before.items())


def test_a_storage_locked_past_the_timeout_is_one_clear_error_and_loses_nothing(tmp_path: Path) -> None:
    path = write_study(tmp_path, budget=QUICK, n_trials=2, storage_timeout_s=0.5)
    before = stored(run(path))
    lock = hold_lock(tmp_path / "tiny.db", 4)
    with pytest.raises(ExplorerError) as info:
        run(write_study(tmp_path, budget=QUICK, n_trials=4, storage_timeout_s=0.5))
    one_line_naming_storage(info.value, path, "database is locked")
    lock.wait()
    assert stored(load_study_spec(path).open(create=False)) == before


def test_a_reader_does_not_queue_behind_a_worker_holding_the_write_lock(tmp_path: Path) -> None:
    """A worker mid-transaction holds SQLite's write lock: `status`/`dashboard` reads go on (with a
    0.5 s timeout they would fail with "database is locked" if they took the lock), writes still wait."""
    path = write_study(tmp_path, budget=QUICK, n_trials=1, storage_timeout_s=0.5)
    run(path)
    lock = hold_lock(tmp_path / "tiny.db", 30, kind="IMMEDIATE")
    try:
        study = load_study_spec(path)
        ostudy = study.read()
        assert len(ostudy.get_trials(states=(COMPLETE,))) == 1 and study.reads.finished(ostudy) == 1
        with pytest.raises(optuna.exceptions.StorageInternalError) as info:
            study.open(create=False).ask()
        assert "database is locked" in str(study.store.error(info.value))
    finally:
        lock.kill()
        lock.wait()


def test_a_read_only_storage_is_one_clear_error_and_loses_nothing(tmp_path: Path) -> None:
    path = write_study(tmp_path, budget=QUICK, n_trials=2)
    db = tmp_path / "tiny.db"
    before = stored(run(path))
    if os.geteuid() == 0:  # root ignores file modes: open the same file through SQLite's read-only mode instead
        storage = f"sqlite:///file:{db}?mode=ro&uri=true"
    else:
        db.chmod(0o444)
        storage = None
    with pytest.raises(ExplorerError) as info:
        run(write_study(tmp_path, budget=QUICK, n_trials=4, storage=storage))
    one_line_naming_storage(info.value, path, "readonly database")
    db.chmod(0o644)
    assert stored(load_study_spec(write_study(tmp_path, budget=QUICK, n_trials=2)).open(create=False)) == before


def test_a_full_storage_is_one_clear_error_and_loses_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulated: SQLite's `max_page_count` caps the file at its current size, so the next growing write
    fails with SQLITE_FULL ("database or disk is full"), the error a full disk gives."""
    path = write_study(tmp_path, budget=QUICK, n_trials=2)
    before = stored(run(path))
    real_storage = Store.storage

    def capped(self, **kwargs):
        storage = real_storage(self, **kwargs)

        @sqlalchemy.event.listens_for(storage.engine, "connect")
        def cap(dbapi_connection, record) -> None:
            pages = dbapi_connection.execute("PRAGMA page_count").fetchone()[0]
            dbapi_connection.execute(f"PRAGMA max_page_count = {pages}")

        storage.engine.dispose()
        return storage

    monkeypatch.setattr(Store, "storage", capped)
    with pytest.raises(ExplorerError) as info:
        run(write_study(tmp_path, budget=QUICK, n_trials=12))
    one_line_naming_storage(info.value, path, "full")
    monkeypatch.undo()
    assert {n: v for n, v in stored(load_study_spec(path).open(create=False)).items() if n in before} == before


@pytest.mark.parametrize("damage", ["garbage", "header"])
def test_a_corrupted_storage_is_one_clear_error(tmp_path: Path, damage: str) -> None:
    path = write_study(tmp_path, budget=QUICK, n_trials=1)
    run(path)
    db = tmp_path / "tiny.db"
    if damage == "garbage":
        db.write_bytes(random.Random(0).randbytes(8192))
    else:
        with db.open("r+b") as f:
            f.write(b"\xff" * 100)
    with pytest.raises(ExplorerError) as info:
        load_study_spec(path).open()
    one_line_naming_storage(info.value, path, "not a database")


def test_a_corrupted_journal_is_one_clear_error(tmp_path: Path) -> None:
    path = write_study(tmp_path, budget=QUICK, n_trials=1, storage="journal:tiny.log")
    run(path)
    log = tmp_path / "tiny.log"
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:2]) + b"{not json\n" + b"".join(lines[2:]))
    with pytest.raises(ExplorerError) as info:
        load_study_spec(path).open()
    one_line_naming_storage(info.value, path, "cannot open storage")


@pytest.mark.slow
def test_sigkill_during_storage_writes_keeps_every_finished_trial(tmp_path: Path) -> None:
    """Kill a worker at random moments while it tells trials (a dozen writes each); after every kill the
    storage opens and holds each trial that was complete before it, unchanged."""
    # 120 configurations: four kill windows finished 16 to 30 trials here (30 of 30 once in CI, which then waited
    # for a 31st); a study that still finishes first ends the loop rather than waiting on a trial never due
    deep = {**TINY_SPACE, "free": {"layers": list(range(1, 41)), "heads": "divisors"}}
    path = write_study(tmp_path, space_doc=deep, budget=QUICK, sampler={"name": "random", "seed": 0}, n_trials=120)
    rng = random.Random(7)
    seen: dict[int, tuple] = {}
    for _ in range(4):
        if len(seen) == 120:
            break
        proc = worker(path)
        wait_for_completed(path, len(seen) + 1)
        time.sleep(rng.uniform(0, 1.5))  # trials finish every fraction of a second: this lands in writes
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        now = stored(load_study_spec(path).open(create=False))
        assert all(now[n] == v for n, v in seen.items())
        seen = now
    assert len(seen) >= 4
    with sqlite3.connect(tmp_path / "tiny.db") as con:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


# -- resource faults inside a trial ---------------------------------------------------------------------------
def faulty_model(monkeypatch: pytest.MonkeyPatch, fault, when=lambda dims: dims["layers"] == 2) -> None:
    """Models of the configurations `when` picks run `fault` in their forward pass (the real trial path)."""
    family = get_family("image-encoder")
    build = type(family).build

    def patched(self, dims):
        model = build(self, dims)
        if when(dims):
            forward = model.forward

            def failing(*args, **kwargs):
                fault()
                return forward(*args, **kwargs)

            model.forward = failing
        return model

    monkeypatch.setattr(type(family), "build", patched)


def reasons(ostudy: optuna.Study) -> dict[str, str]:
    return {t.params["arch"]: t.user_attrs["fail_reason"] for t in ostudy.get_trials(states=(FAIL,))}


def oom() -> None:
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def bug() -> None:
    raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x16 and 32x16)\nsecond line")


@pytest.mark.parametrize("fault, words", [(oom, "out of memory on cpu: CUDA out of memory. Tried to allocate 2.00 GiB"),
                                          (bug, "RuntimeError: mat1 and mat2 shapes cannot be multiplied")])
def test_a_failing_trial_is_marked_failed_with_its_reason_and_the_study_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault, words: str) -> None:
    faulty_model(monkeypatch, fault)
    ostudy = run(write_study(tmp_path, budget=QUICK))
    failed = reasons(ostudy)
    assert sorted(failed) == ["layers=2,heads=1", "layers=2,heads=2", "layers=2,heads=4"]
    assert all(words in r and "\n" not in r for r in failed.values()), failed
    assert sorted(trained(ostudy)) == ["layers=1,heads=1", "layers=1,heads=2", "layers=1,heads=4"]


def test_a_hung_trial_fails_at_its_time_limit_and_the_study_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    faulty_model(monkeypatch, lambda: time.sleep(60), when=lambda dims: dims["layers"] == 2 and dims["heads"] == 2)
    ostudy = run(write_study(tmp_path, budget=QUICK, trial_timeout_s=1.5))
    assert reasons(ostudy) == {"layers=2,heads=2": "ran past its time limit of 1.5 s (trial_timeout_s)"}
    assert len(trained(ostudy)) == 5


def test_the_time_limit_is_lifted_after_the_trial() -> None:
    with time_limit(0.3):
        pass
    time.sleep(0.5)  # no alarm left behind
    with pytest.raises(TrialTimeout), time_limit(0.2):
        time.sleep(5)


def test_a_study_whose_every_trial_fails_stops_at_max_failures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    faulty_model(monkeypatch, bug, when=lambda dims: True)
    with pytest.raises(ExplorerError) as info:
        run(write_study(tmp_path, budget=QUICK, max_failures=3))
    assert "\n" not in str(info.value) and "stopped after 3 failed trials (max_failures: 3)" in str(info.value)
    assert len(load_study_spec(tmp_path / "study.yaml").open(create=False).get_trials(states=(FAIL,))) == 3


# -- Ctrl-C and failing studies --------------------------------------------------------------------------------
def await_storage(path: Path, condition, timeout: float = 120) -> list[optuna.trial.FrozenTrial]:
    """Poll the study's storage (read only) until `condition(trials)` holds; returns those trials."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            trials = load_study_spec(path).read().get_trials()
        except ExplorerError:  # not created yet
            trials = []
        if trials and condition(trials):
            return trials
        time.sleep(0.1)
    raise AssertionError(f"the storage did not reach the awaited state in {timeout} s")


@pytest.mark.slow
def test_ctrl_c_mid_trial_exits_130_with_how_to_resume_and_the_trial_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    path = write_study(tmp_path, budget={"epochs": 6, "batch_size": 16, "lr": 0.003, "seed": 0}, n_trials=3,
                       sampler={"name": "random", "seed": 0})  # no grid queue: the retry is the next trial
    proc = worker(path)
    trials = await_storage(path, lambda ts: any(t.state == RUNNING and len(t.user_attrs.get("curve", [])) >= 1 for t in ts))
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130 and f"continue with: explorer resume {path}" in out and "Traceback" not in out, out
    study = load_study_spec(path)
    ostudy = study.read()
    (stopped,) = ostudy.get_trials(states=(FAIL,))
    assert stopped.number == next(t.number for t in trials if t.state == RUNNING)
    assert "interrupted" in stopped.user_attrs and "fail_reason" not in stopped.user_attrs
    states = explorer.load(path).status().states  # counted apart from failures
    assert states.get("INTERRUPTED") == 1 and "FAIL" not in states
    retry = [t for t in ostudy.get_trials(states=(optuna.trial.TrialState.WAITING,)) if t.user_attrs.get("retry_of") == stopped.number]
    assert retry and (study.checkpoint_dir(study.configs[stopped.params["arch"]], stopped.number) / "checkpoint.pt").exists()
    ostudy = run(path, create=False)
    assert len(set(trained(ostudy))) == len(trained(ostudy)) == 3 and retry[0].number in {t.number for t in ostudy.get_trials(states=(COMPLETE,))}
    assert not study.checkpoint_root.exists()  # the resumed trial finished and spent its checkpoint


def test_ctrl_c_while_a_finished_trial_is_recorded_keeps_its_result_and_stops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGINT lands after training, while the trial's values go to Optuna: the result is stored, then the study stops."""
    write_study(tmp_path, budget=QUICK, n_trials=3)
    values = Evaluator.values

    def interrupted(self, attrs):
        os.kill(os.getpid(), signal.SIGINT)  # a real signal, delivered to this (the main) thread
        return values(self, attrs)

    monkeypatch.setattr(Evaluator, "values", interrupted)
    study = load_study_spec(tmp_path / "study.yaml")
    ostudy = study.open()
    with pytest.raises(KeyboardInterrupt):
        LocalExecutor().run(study, ostudy)
    (done,) = ostudy.get_trials(states=(COMPLETE,))
    assert done.user_attrs["accuracy"] == done.values[0] and not ostudy.get_trials(states=(FAIL, RUNNING))


def test_failed_trials_print_one_line_each_and_the_run_exits_1(tmp_path: Path) -> None:
    path = write_study(tmp_path, budget={**QUICK, "lr": 1e12, "grad_clip": None}, n_trials=2)
    proc = worker(path)
    out = proc.communicate(timeout=120)[0]
    failed = [line for line in out.splitlines() if line.startswith("trial ") and " failed: loss is " in line]
    assert proc.returncode == 1 and len(failed) == 2 and "Traceback" not in out, out
    assert out.strip().splitlines()[-1] == (f"error: {path}: 2 trials failed in this run (reasons above and in `explorer status`); "
                                            f"once the cause is fixed, `explorer run {path} --retry-failed` runs them again")


def test_a_corrupt_image_is_one_study_error_not_a_failure_per_trial(tmp_path: Path) -> None:
    from PIL import Image

    root = tmp_path / "images"
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(4):
            Image.new("L", (8, 8), color=40 * i).save(root / c / f"{i}.png")
    (root / "b" / "9.png").write_bytes(b"not a png")
    space = {**TINY_SPACE, "fixed": {**TINY_SPACE["fixed"], "num_classes": 2}}
    path = write_study(tmp_path, space_doc=space, task={"name": "image-folder", "root": "images", "img_size": 8, "in_chans": 1},
                       budget={**QUICK, "batch_size": 4, "max_steps": 4})
    proc = worker(path)
    out = proc.communicate(timeout=120)[0]
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and len(errors) == 1 and "cannot read image" in errors[0] and "9.png" in errors[0], out
    assert "Traceback" not in out and len(load_study_spec(path).read().get_trials(states=(FAIL,))) == 1


# -- hostile input and paths ---------------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["space", "study"])
def test_yaml_tags_never_construct_objects(tmp_path: Path, which: str) -> None:
    path = write_study(tmp_path)
    target = tmp_path / f"{which}.yaml"
    marker = tmp_path / "pwned"
    target.write_text(f"evil: !!python/object/apply:os.system ['touch {marker}']\n" + target.read_text())
    with pytest.raises(ExplorerError) as info:
        load_study_spec(path)
    assert "\n" not in str(info.value) and "could not determine a constructor" in str(info.value) and not marker.exists()


def test_relative_paths_resolve_against_the_study_folder_and_are_stated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "space.yaml").write_text(yaml.safe_dump(TINY_SPACE))
    path = write_study(tmp_path / "studies", space="../shared/space.yaml", storage="sqlite:///runs/tiny.db", n_trials=1)
    (tmp_path / "studies" / "runs").mkdir()
    monkeypatch.chdir(tmp_path / "shared")  # not where the storage must land
    study = load_study_spec(path)
    study.open()
    assert (tmp_path / "studies" / "runs" / "tiny.db").exists() and not (tmp_path / "shared" / "runs").exists()
    paths = study.paths()
    assert paths["space"] == str(tmp_path / "shared" / "space.yaml")  # `..` is allowed, and shown resolved
    assert paths["storage"] == str(tmp_path / "studies" / "runs" / "tiny.db")
    assert paths["checkpoints"] == str(tmp_path / "studies" / "tiny.ckpt")


def test_a_server_password_is_never_shown(tmp_path: Path) -> None:
    study = load_study_spec(write_study(tmp_path, storage="postgresql://bob:hunter2@127.0.0.1:1/explorer"))
    assert "hunter2" not in study.paths()["storage"]
    with pytest.raises(ExplorerError) as info:
        study.open()
    assert "hunter2" not in str(info.value) and "bob:***@" in str(info.value)


# -- soak ------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_soak_random_worker_kills_then_resume_lose_nothing_and_train_each_configuration_once(tmp_path: Path) -> None:
    """Two workers on one grid study; every few seconds one is SIGKILLed (mid-trial or mid-write) and
    restarted. `explorer resume` then finishes the study: every configuration completed exactly once,
    and every trial complete at any snapshot is still there, unchanged."""
    budget = {"epochs": 6, "batch_size": 16, "lr": 0.003, "seed": 0}  # ~2 s a trial: kills land mid-trial
    path = write_study(tmp_path, space_doc=WIDE_SPACE, budget=budget, n_trials=12)
    rng = random.Random(11)
    workers = [worker(path), worker(path)]
    wait_for_completed(path, 1)
    snapshots: dict[int, tuple] = {}
    kills, deadline = 0, time.monotonic() + 90
    try:
        while kills < 6 and time.monotonic() < deadline and len(snapshots) < 10:
            time.sleep(rng.uniform(1, 3))
            i = rng.randrange(len(workers))
            if workers[i].poll() is None and load_study_spec(path).open(create=False).get_trials(states=(RUNNING,)):
                workers[i].send_signal(signal.SIGKILL)
                kills += 1
            workers[i].wait()
            workers[i] = worker(path)
            now = stored(load_study_spec(path).open(create=False))
            assert all(now[n] == v for n, v in snapshots.items())
            snapshots = now
    finally:
        for w in workers:
            w.kill()
            w.wait()
    study = load_study_spec(path)
    ostudy = study.open(create=False)
    await_condition(lambda: stale_failed(study, ostudy) and not ostudy.get_trials(deepcopy=False, states=(RUNNING,)))
    proc = worker(path, "resume")
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0, out

    ostudy = load_study_spec(path).open(create=False)
    final = stored(ostudy)
    assert kills >= 3 and all(final[n] == v for n, v in snapshots.items())
    assert sorted(trained(ostudy)) == sorted(load_study_spec(path).keys)  # each configuration exactly once
    for t in ostudy.get_trials(states=(COMPLETE,)):  # a re-queued copy, if any, was answered from storage
        assert "duplicate_of" not in t.user_attrs or t.values == ostudy.trials[t.user_attrs["duplicate_of"]].values
    assert not ostudy.get_trials(states=(RUNNING, optuna.trial.TrialState.WAITING))
    interrupted = [t for t in ostudy.get_trials(states=(FAIL,)) if "fail_reason" not in t.user_attrs]
    print(f"soak: {kills} kills, {len(interrupted)} trials interrupted mid-run and re-run")
