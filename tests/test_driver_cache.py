"""The Ray driver's cache of its storage (explorer.optuna_cache, issue 34): the searcher driven as Tune drives
it, without a Ray cluster, through the cache and through Optuna's plain storage, asks and tells the same
trials with the same results; what it keeps for a running trial reaches the storage when the study's lock
is released, with the trial's end, or with the heartbeat; another worker's changes show at the next lock;
a trial another worker failed as dead is not written over; a driver that dies is resumed with nothing
trained twice. On SQLite, and on PostgreSQL where a server can be started (as tests/test_postgres.py)."""

from __future__ import annotations

import json
import pickle
import sys
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pytest
from conftest import TINY_SPACE, write_study

ray = pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench.standin: the stand-in task

from ray import cloudpickle  # noqa: E402
from ray.exceptions import ActorDiedError, RayTaskError  # noqa: E402

from explorer import optuna_cache  # noqa: E402
from explorer.executors import ray_bridge  # noqa: E402
from explorer.executors.ray_bridge import OptunaBridge, _Link  # noqa: E402
from explorer.executors.ray_tune import scheduler  # noqa: E402
from explorer.optuna_compat import storage_of  # noqa: E402
from explorer.study import load_study_spec  # noqa: E402
from explorer.study import storage as storage_module  # noqa: E402
from explorer.study.queue import Queue  # noqa: E402

COMPLETE, RUNNING, FAIL = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.FAIL
SPACE = {**TINY_SPACE, "fixed": {**TINY_SPACE["fixed"], "width": 32, "mlp": 64}, "free": {"layers": [1, 2, 3], "heads": "divisors"}}
STANDIN = {"name": "bench.standin:StandIn", "seconds": 0}
# what differs between two runs of the same trials: who ran them, when, and how long they took
VARIES = {"worker", "queued_by", "trial_time_s", "train_time_s"}


@pytest.fixture(params=["sqlite", "postgresql"])
def storage(request: pytest.FixtureRequest) -> Callable[[], str | None]:
    """A new storage for each study: None (the study's SQLite file beside it), or a new PostgreSQL database."""
    if request.param == "sqlite":
        return lambda: None
    return request.getfixturevalue("server").database


def study_at(folder: Path, storage: Callable[[], str | None], **overrides: Any) -> Path:
    doc = {"task": STANDIN, "budget": {"epochs": 2, "seeds": 2}, "replicates": {"policy": "decide"},
           "sampler": {"name": "random", "seed": 3}, "n_trials": 12, "heartbeat_s": 60, **overrides}
    url = storage()
    if url:
        doc["storage"] = url
    return write_study(folder, SPACE, **doc)


def drive(path: Path, running: int = 3, stop_after: int | None = None, inline: bool = True) -> tuple[optuna.Study, _Link]:
    """Ask and tell as Tune would, `running` trials at once, the oldest finishing first, each trained by
    the stand-in through the study's real evaluator; until the searcher says FINISHED (or `stop_after` tells).
    `inline`: the replicate policy is read in the searcher's call rather than on the link's policy thread,
    so that what is asked does not depend on the thread's timing (runs are compared trial for trial)."""
    study = load_study_spec(path)
    ostudy = study.open()
    link = _Link(study, ostudy)
    if inline:
        link.replicate = lambda free=1: (study.queue.replicates(link.open()[1], free), link.queued.set())
    bridge = OptunaBridge(link)
    open_ids: list[tuple[str, dict]] = []
    told, asked = 0, 0
    while stop_after is None or told < stop_after:
        while len(open_ids) < running:
            config = bridge.suggest(f"ray-{asked}")
            asked += 1
            if not isinstance(config, dict):
                break
            open_ids.append((f"ray-{asked - 1}", config))
        if not open_ids:
            assert config == bridge.FINISHED
            break
        trial_id, config = open_ids.pop(0)
        cfg = study.configs[config["arch"]]
        attrs = study.evaluator.evaluate(cfg, config["lineage"], None, "cpu", seed=config["seed"])
        for epoch, value in enumerate(attrs["curve"]):
            bridge.on_trial_result(trial_id, {"epoch": epoch + 1, "accuracy": value})
        bridge.on_trial_complete(trial_id, {"attrs": json.dumps(attrs)})
        told += 1
    return ostudy, link


def stored(path: Path) -> list[tuple]:
    """Every trial as the storage holds it, read afresh, less what varies from run to run."""
    fresh = load_study_spec(path).read()
    return [(t.number, t.state, t.params, t.values, {k: v for k, v in t.user_attrs.items() if k not in VARIES},
             t.system_attrs.get("fixed_params")) for t in fresh.get_trials()]


def test_the_driver_asks_and_tells_the_same_trials_through_its_cache(tmp_path: Path, storage: Callable[[], str | None],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Same trials, same results: the searcher over Optuna's plain storage and over the driver's cache ask
    the same configurations at the same seeds (first seeds, then the decide policy's rounds) and store the
    same values and attributes, trial for trial."""
    with monkeypatch.context() as plain:  # the searcher as it was before its cache
        plain.setattr(storage_module, "owner_cache", lambda s: s)
        reference = study_at(tmp_path / "plain", storage)
        ostudy, link = drive(reference)
        assert not hasattr(storage_of(link.open()[1]), "flush")
        link.release()
    cached = study_at(tmp_path / "cached", storage)
    ostudy, link = drive(cached)
    assert hasattr(storage_of(link.open()[1]), "flush")
    link.release()
    view = link.open()[1].get_trials(deepcopy=False)  # what the driver decided on: the storage's trials, field for field
    assert [t.__dict__ for t in view] == [t.__dict__ for t in load_study_spec(cached).read().get_trials()]
    a, b = stored(reference), stored(cached)
    assert any(attrs.get("replicate") for *_, attrs, _ in a)  # the decide policy's rounds ran
    assert a == b
    assert not [t for t in ostudy.get_trials() if t.state == RUNNING]


def test_what_the_driver_keeps_reaches_the_storage_with_the_lock_the_end_and_the_heartbeat(
        tmp_path: Path, storage: Callable[[], str | None], monkeypatch: pytest.MonkeyPatch) -> None:
    # a curve is stored when the last store was a second ago: under load a second passes between two lines
    # of this test (CI once saw the curve stored), so the driver's "recent" is an hour here
    monkeypatch.setattr(ray_bridge, "flush_due", lambda storage, seconds=1.0: optuna_cache.flush_due(storage, 3600.0))
    path = study_at(tmp_path, storage, replicates={"policy": "fixed"}, budget={"epochs": 2, "seeds": 1})
    study = load_study_spec(path)
    outside = study.open()  # another process's view: Optuna's plain storage
    link = _Link(study, study.open())
    bridge = OptunaBridge(link)
    config = bridge.suggest("a")  # claimed under the study's lock: its parameters and attributes are stored at its release
    number = config["optuna_number"]
    seen = outside.get_trials()[number]
    assert seen.state == RUNNING and seen.params["arch"] == config["arch"] and seen.user_attrs["config"]
    bridge.on_trial_result("a", {"epoch": 1, "accuracy": 0.5})  # kept: the curve of a running trial
    assert "curve" not in outside.get_trials()[number].user_attrs
    assert link.open()[1].get_trials()[number].user_attrs["curve"] == [0.5]  # the driver reads what it keeps
    storage_of(link.open()[1]).flush()  # what the heartbeat thread does every heartbeat_s
    assert outside.get_trials()[number].user_attrs["curve"] == [0.5]
    cfg = study.configs[config["arch"]]
    attrs = study.evaluator.evaluate(cfg, config["lineage"], None, "cpu", seed=config["seed"])
    bridge.on_trial_complete("a", {"attrs": json.dumps(attrs)})  # its attributes and its end: one transaction
    done = outside.get_trials()[number]
    assert done.state == COMPLETE and done.user_attrs["accuracy"] == attrs["accuracy"] and done.values[0] == attrs["accuracy"]
    assert link.open()[1].get_trials()[number].datetime_complete == done.datetime_complete
    link.release()


def test_another_workers_changes_show_at_the_next_lock_and_a_reclaimed_trial_is_not_written_over(
        tmp_path: Path, storage: Callable[[], str | None]) -> None:
    path = study_at(tmp_path, storage, replicates={"policy": "fixed"}, budget={"epochs": 2, "seeds": 1}, sampler={"name": "grid"})
    study = load_study_spec(path)
    outside = study.open()
    link = _Link(study, study.open())
    bridge = OptunaBridge(link)
    first, second = bridge.suggest("a"), bridge.suggest("b")
    # another worker takes a queued configuration meanwhile: the driver's next claim (under the lock) sees it
    other = load_study_spec(path)
    taken, _ = other.queue.claim(other.open())
    third = bridge.suggest("c")
    assert taken.number not in {first["optuna_number"], second["optuna_number"], third["optuna_number"]}
    assert link.open()[1].get_trials()[taken.number].state == RUNNING
    # another worker fails the driver's trial "a" as dead (its heartbeat starved): the driver records nothing over it
    number = first["optuna_number"]
    outside.tell(number, state=FAIL)
    cfg = study.configs[first["arch"]]
    attrs = study.evaluator.evaluate(cfg, first["lineage"], None, "cpu", seed=first["seed"])
    bridge.on_trial_result("b", {"epoch": 1, "accuracy": 0.25})
    bridge.on_trial_result("a", {"epoch": 1, "accuracy": 0.5, "iterations_since_restore": 1})  # its run's count: stored at once
    bridge.on_trial_complete("a", {"attrs": json.dumps(attrs)})
    after = outside.get_trials()[number]
    assert after.state == FAIL and "accuracy" not in after.user_attrs and "attempts" not in after.user_attrs
    storage_of(link.open()[1]).flush()  # the others' kept writes still go
    assert outside.get_trials()[second["optuna_number"]].user_attrs["curve"] == [0.25]
    link.release()


def test_a_driver_that_dies_is_resumed_with_nothing_trained_twice(tmp_path: Path, storage: Callable[[], str | None]) -> None:
    """Same resume: a driver that dies (its kept writes of running trials lost, never released) leaves
    RUNNING trials that `resume --reclaim` queues again; the resumed driver finishes the study with every
    (configuration, seed) trained once and none left running."""
    path = study_at(tmp_path, storage)
    ostudy, link = drive(path, stop_after=4)  # two trials still running when it "dies"
    link._beating.set()  # its heartbeat stops with it; nothing is flushed or released
    study = load_study_spec(path)
    dead = study.queue.reclaim_running(study.open())
    assert len(dead) == 2
    ostudy, link = drive(path)
    link.release()
    trials = ostudy.get_trials()
    trained = [(t.params["arch"], t.user_attrs.get("seed", 0)) for t in trials if t.state == COMPLETE and "duplicate_of" not in t.user_attrs]
    assert len(trained) == len(set(trained)) and len({a for a, _ in trained}) == 12
    assert not [t for t in trials if t.state == RUNNING]
    assert sorted(t.number for t in trials if t.state == FAIL) == sorted(dead)  # the dead driver's, queued again and trained


def test_the_replicate_policy_is_read_off_the_searchers_thread_and_its_runs_are_claimed(tmp_path: Path) -> None:
    """Issue 34: a posterior fit no longer holds Tune's loop. While trials run, the decide policy reads
    their results on the link's policy thread; what it queues is claimed by the next `suggest`, and the
    study ends with every run trained once and none left running."""
    path = study_at(tmp_path, lambda: None)
    readers: list[str] = []
    real = Queue.replicates

    def replicates(self, ostudy, free=1):
        readers.append(threading.current_thread().name)
        return real(self, ostudy, free)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Queue, "replicates", replicates)
        ostudy, link = drive(path, running=3, inline=False)
    link.release()
    trials = load_study_spec(path).read().get_trials()
    runs = Counter((t.params["arch"], t.user_attrs.get("seed", 0)) for t in trials if t.state == COMPLETE)
    assert set(runs.values()) == {1} and not [t for t in trials if t.state == RUNNING]
    assert any(t.user_attrs.get("replicate") for t in trials if t.state == COMPLETE)
    assert {name for name in readers if name != threading.current_thread().name}  # read beside the searcher's thread


def test_a_restored_driver_leaves_a_trial_that_ended_after_its_snapshot_as_stored(tmp_path: Path) -> None:
    """`Tuner.restore` resumes the trials of the experiment's last snapshot. A trial that ended after it (the
    driver died before the next) is run again by Tune; the restored searcher writes nothing of that run over
    its stored result, neither its epochs nor its end (CI saw `UpdateFinishedTrialError` from its first epoch)."""
    path = study_at(tmp_path, lambda: None, replicates={"policy": "fixed"}, budget={"epochs": 2, "seeds": 1})
    study = load_study_spec(path)
    link = _Link(study, study.open())
    bridge = OptunaBridge(link)
    config = bridge.suggest("a")
    bridge.save(str(tmp_path / "searcher.pkl"))  # Tune's snapshot, taken while "a" runs
    cfg = study.configs[config["arch"]]
    attrs = study.evaluator.evaluate(cfg, config["lineage"], None, "cpu", seed=config["seed"])
    bridge.on_trial_result("a", {"epoch": 1, "accuracy": attrs["curve"][0]})
    bridge.on_trial_complete("a", {"attrs": json.dumps(attrs)})
    link._beating.set()  # the driver dies
    before = stored(path)

    restored = OptunaBridge(pickle.loads(pickle.dumps(_Link(study))))  # as tuner.pkl holds it
    restored.restore(str(tmp_path / "searcher.pkl"))
    restored.on_trial_result("a", {"epoch": 1, "accuracy": 0.125})  # Tune's rerun of "a"
    restored.on_trial_complete("a", {"attrs": json.dumps({**attrs, "accuracy": 0.125, "curve": [0.125, 0.125]})})
    assert stored(path) == before
    assert config["optuna_number"] not in restored.link.open_trials
    nxt = restored.suggest("b")  # and the study goes on
    assert isinstance(nxt, dict) and nxt["optuna_number"] != config["optuna_number"]
    restored.link.release()


def tuner_of(study) -> tuple[OptunaBridge, Any]:
    """The searcher and scheduler as `make_tuner` builds them (one link) and `Tuner.restore` reads them back from
    tuner.pkl (pickled together at the Tuner's start: they still share one link)."""
    link = _Link(study)
    return pickle.loads(pickle.dumps((OptunaBridge(link), scheduler(link))))


def failed_run(folder: Path, config: dict, err: BaseException) -> SimpleNamespace:
    """A Tune trial whose run just failed with `err`, as Tune hands it to its scheduler: the error saved beside it."""
    path = folder / f"error-{id(err)}.pkl"
    path.write_bytes(cloudpickle.dumps(err))
    return SimpleNamespace(config=config, pickled_error_file=str(path))


def in_task(cause: BaseException) -> RayTaskError:
    return RayTaskError("train", "Traceback (most recent call last): ...", cause, proctitle="ray::ImplicitFunc.train", pid=1, ip="127.0.0.1")


GONE = "Could not recover from checkpoint as it does not exist on storage anymore. Got storage fs type `local` and path: x"


def one_trial_reported(tmp_path: Path) -> tuple:
    """A study with its Tuner's searcher and scheduler, one trial suggested and its first epoch reported."""
    path = study_at(tmp_path, lambda: None, replicates={"policy": "fixed"}, budget={"epochs": 2, "seeds": 1})
    study = load_study_spec(path)
    study.open()  # created, as `explorer run` does before its Tuner starts
    bridge, tune_scheduler = tuner_of(study)
    config = bridge.suggest("a")
    bridge.on_trial_result("a", {"epoch": 1, "accuracy": 0.5, "iterations_since_restore": 1})
    return path, study, bridge, tune_scheduler, config


def test_a_restored_trial_whose_runs_fail_before_training_is_queued_again_with_its_attempts_counted(tmp_path: Path) -> None:
    """Issue 44. The driver dies while a trial trains; the restored Tuner's runs of it all fail before training (its
    snapshot named a Ray checkpoint that Ray deleted before writing the next), and Tune ends it with an error after
    max_failures + 1 runs by its count. Before, that stored `gave up after 3 attempts ... its worker or node was lost`
    and the configuration was lost. Its one attempt, the run the driver's death cut, is stored: a fault, queued again."""
    path, study, bridge, tune_scheduler, config = one_trial_reported(tmp_path)
    bridge.save(str(tmp_path / "searcher.pkl"))
    bridge.link._beating.set()  # the driver dies

    bridge, tune_scheduler = tuner_of(study)
    bridge.restore(str(tmp_path / "searcher.pkl"))
    for _ in range(3):  # executor.max_failures (2) + 1 runs, each failing to restore the checkpoint
        tune_scheduler.on_trial_error(None, failed_run(tmp_path, config, in_task(ValueError(GONE))))
    bridge.on_trial_complete("a", error=True)
    trial = load_study_spec(path).read().trials[config["optuna_number"]]
    assert trial.state == FAIL and "fail_reason" not in trial.user_attrs, trial.user_attrs
    assert trial.user_attrs["fault"] == f"ValueError: {GONE}" and trial.user_attrs["attempts"] == 1
    assert "faults" not in trial.user_attrs  # no run failed in training

    assert tune_scheduler.link is bridge.link  # it recorded on the restored searcher's open trials
    retry = bridge.suggest("b")  # queued again, before any other configuration
    assert retry["arch"] == config["arch"] and retry["optuna_number"] != config["optuna_number"]
    attrs = study.evaluator.evaluate(study.configs[retry["arch"]], retry["lineage"], None, "cpu", seed=retry["seed"])
    bridge.on_trial_result("b", {"epoch": 1, "accuracy": attrs["curve"][0], "iterations_since_restore": 1})
    bridge.on_trial_complete("b", {"attrs": json.dumps(attrs)})
    done = load_study_spec(path).read().trials[retry["optuna_number"]]
    assert done.state == COMPLETE and done.user_attrs["attempts"] == 1 and done.user_attrs["retry_of"] == config["lineage"]
    bridge.link.release()


def test_a_trial_that_fails_in_training_on_every_run_gives_up_with_the_real_count_and_cause_across_a_restore(tmp_path: Path) -> None:
    """Its failed attempts are stored as they happen, so a restored driver counts on from the dead one's; the reason
    says how many runs failed in training and the last one's cause (before: `max_failures + 1`, and a guessed cause)."""
    path, study, bridge, tune_scheduler, config = one_trial_reported(tmp_path)
    tune_scheduler.on_trial_error(None, failed_run(tmp_path, config, ActorDiedError()))  # its worker died: Tune retries it
    bridge.on_trial_result("a", {"epoch": 1, "accuracy": 0.5, "iterations_since_restore": 1})
    bridge.save(str(tmp_path / "searcher.pkl"))
    bridge.link._beating.set()  # the driver dies while the second run trains: no failure of the trial

    bridge, tune_scheduler = tuner_of(study)
    bridge.restore(str(tmp_path / "searcher.pkl"))
    for cause in ("boom", "boom again"):
        bridge.on_trial_result("a", {"epoch": 2, "accuracy": 0.5, "iterations_since_restore": 1})
        tune_scheduler.on_trial_error(None, failed_run(tmp_path, config, in_task(RuntimeError(f"{cause}\nmore lines"))))
    bridge.on_trial_complete("a", error=True)
    trial = load_study_spec(path).read().trials[config["optuna_number"]]
    assert trial.state == FAIL and trial.user_attrs["attempts"] == 4
    assert trial.user_attrs["faults"] == ["its worker was lost (ActorDiedError: The actor died unexpectedly before finishing this task.)",
                                          "RuntimeError: boom", "RuntimeError: boom again"]
    assert trial.user_attrs["fail_reason"] == ("gave up after 3 failed attempts on fresh Ray workers (executor.max_failures: 2); "
                                               "the last: RuntimeError: boom again")
    bridge.link.release()
