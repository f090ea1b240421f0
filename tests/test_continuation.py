"""Issue 42: a longer run continues a shorter run of its (configuration, seed) rather than restarting it, and
rounds of the replicate policy fill every free worker.

- Under wsd a run keeps its state at its cooldown start; a longer run of the seed resumes from it, trains
  only the epochs past it (counted in optimizer steps) and ends, bit for bit, as a run from scratch.
- The queue picks the seed `Budget.continues` names, never a stored (configuration, seed, length) again.
- A continued run killed mid-way (kill -9 locally, its Ray node lost) resumes and still ends as from scratch.
- A round hands out as many runs as there are free workers (local threads, the Ray searcher's free trials),
  and a grid study stopped short of its grid by `n_trials` still replicates (it used to stop at its first runs).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from conftest import TINY_SPACE, write_study
from torch.optim.optimizer import register_optimizer_step_post_hook

import explorer.study.queue as queue_module
from explorer.budget import Budget
from explorer.checkpoints import Carry
from explorer.executors.local import LocalExecutor
from explorer.rows import row_key
from explorer.study import load_study_spec
from explorer.tasks import get_task
from explorer.train import run_trial

COMPLETE, RUNNING, WAITING = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING
DIMS = dict(layers=1, heads=2, width=16, mlp=32, img_size=8, patch=4, in_chans=1, num_classes=10)
LADDER = Budget(epochs=[2, 4, 6], batch_size=128, lr=3e-3, seed=0)
STEPS_PER_EPOCH = -(-1437 // 128)  # digits' training split in batches of 128
ONE = {**{k: v for k, v in TINY_SPACE.items() if k != "baseline"}, "free": {"layers": [1], "heads": [2]}}  # one configuration

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def train(length: int, carry: Carry | None = None, budget: Budget = LADDER) -> tuple[Any, int]:
    """A run of `length` epochs (continuing `carry`'s kept state, if any) and the optimizer steps it took."""
    steps = [0]
    hook = register_optimizer_step_post_hook(lambda *_: steps.__setitem__(0, steps[0] + 1))
    try:
        result = run_trial("image-encoder", DIMS, get_task("digits", {}), budget.at(length), device="cpu", carry=carry)
    finally:
        hook.remove()
    return result, steps[0]


@pytest.fixture(scope="module")
def ladder(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One seed's runs of 2, 4 and 6 epochs, each continuing the last, what each left on disk, and the 4- and
    6-epoch runs from scratch."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("kept") / "kept" / "c-seed0"
    out: dict[str, Any] = {}
    for length in (2, 4, 6):
        carry = Carry(folder, length, 6)
        out[length] = train(length, carry)
        carry.ended(out[length][0].metrics)
        out[f"disk {length}"] = sorted(p.name for p in folder.iterdir()) if folder.exists() else None
    for length in (4, 6):
        out[f"scratch {length}"] = train(length)
    torch.set_num_threads(threads)
    return out


def test_a_continued_run_ends_as_the_run_from_scratch_bit_for_bit(ladder: dict[str, Any]) -> None:
    for length, after in ((4, 2), (6, 4)):
        continued, scratch = ladder[length][0], ladder[f"scratch {length}"][0]
        assert continued.resumed_from == after and scratch.resumed_from is None
        assert continued.metrics == scratch.metrics and continued.curve == scratch.curve  # exactly, not approximately
        assert continued.rungs == scratch.rungs and sorted(continued.rungs) == [r for r in (2, 4, 6) if r <= length]
        assert continued.kappa_init == scratch.kappa_init and continued.kappa_final == scratch.kappa_final
        assert continued.steps == scratch.steps  # the trajectory's steps, as stored
        assert 0 < continued.train_time_s < scratch.train_time_s  # only what it trained itself


def test_a_promotion_trains_only_the_extra_epochs(ladder: dict[str, Any]) -> None:
    """10 to 20 epochs trains 12 epochs, not 22 (Budget.compute): here 2 to 4 trains 3 epochs, not 5."""
    assert ladder[2][1] == 2 * STEPS_PER_EPOCH
    for length, after in ((4, 2), (6, 4)):
        assert ladder[length][1] == LADDER.compute(length, after=after) * STEPS_PER_EPOCH  # from the kept state on
        assert ladder[f"scratch {length}"][1] == LADDER.compute(length) * STEPS_PER_EPOCH  # every epoch, every branch
    assert (LADDER.compute(4, after=2), LADDER.compute(4), LADDER.compute(6, after=4), LADDER.compute(6)) == (3, 5, 3, 8)


def test_a_seed_keeps_one_state_and_none_once_its_longest_run_ended(ladder: dict[str, Any]) -> None:
    assert ladder["disk 2"] == ["2.json", "2.pt"]  # its state at its cooldown start, and its final metrics
    assert ladder["disk 4"] == ["4.json", "4.pt"]  # the 2-epoch run's state is spent
    assert ladder["disk 6"] is None  # nothing runs longer than the ladder's longest: nothing kept, the folder gone


def test_a_state_of_another_trajectory_is_not_continued(tmp_path: Path) -> None:
    """A kept state of another budget (a study changed with --force) is not resumed: the run trains from scratch."""
    other = LADDER.model_copy(update={"lr": 1e-3})
    carry = Carry(tmp_path, 2, 6)
    train(2, carry, other)
    assert carry.source is not None
    run, steps = train(4, Carry(tmp_path, 4, 6))
    assert run.resumed_from is None and steps == LADDER.compute(4) * STEPS_PER_EPOCH


# -- the queue: which seed a longer run takes, and rounds that fill the workers ------------------------------
def ladder_study(tmp_path: Path, space: dict | None = None, **overrides: Any) -> Path:
    doc = {"budget": {"epochs": [2, 4], "batch_size": 128, "lr": 0.003, "seed": 0, "seeds": 2},
           "replicates": {"policy": "decide"}, "sampler": {"name": "random", "seed": 0}, "n_trials": 1, **overrides}
    return write_study(tmp_path, space or ONE, **doc)


class Policy:
    """A stand-in for the decide policy (`queue.wanted`): the rows it is told to want, and what each reading saw."""

    def __init__(self, *rounds: list[str]):
        self.rounds, self.readings = list(rounds), []

    def __call__(self, summary: Any, *args: Any, batch: int | None = None, pending: dict[str, int] | None = None,
                 **kwargs: Any) -> list[str]:
        measured = int(summary["n"].sum()) if len(summary) else 0
        self.readings.append({"batch": batch, "pending": dict(pending or {}), "measured": measured})
        return self.rounds.pop(0) if self.rounds and measured else []


def test_a_longer_run_takes_the_seed_it_continues_and_no_run_is_queued_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The queue names each run's seed with Budget.continues: the 4-epoch run continues seed 0's 2-epoch run
    (and stores `resumed_from`), the next one is seed 1's, from scratch; a third finds no seed left."""
    study = load_study_spec(ladder_study(tmp_path))
    ostudy = study.open()
    key = study.keys[0]
    policy = Policy([row_key(key, 4)] * 3)
    monkeypatch.setattr(queue_module, "wanted", policy)
    LocalExecutor().run(study, ostudy)
    runs = {(t.user_attrs["seed"], t.user_attrs["epochs"]): t for t in ostudy.get_trials(states=(COMPLETE,))}
    assert sorted(runs) == [(0, 2), (0, 4), (1, 4)]  # a (configuration, seed, length) once
    assert runs[0, 4].user_attrs["resumed_from"] == 2 and "resumed_from" not in runs[1, 4].user_attrs
    scratch, _ = train(4, budget=study.spec.budget.model_copy(update={"seed": 0}))
    assert runs[0, 4].user_attrs["curve"] == scratch.curve and runs[0, 4].values[0] == scratch.metrics["accuracy"]
    assert runs[0, 4].user_attrs["rungs"] == {"2": scratch.rungs[2]["accuracy"], "4": scratch.rungs[4]["accuracy"]}
    assert not study.checkpoint_root.exists()  # every seed reached the ladder's top: nothing kept


def test_a_round_hands_out_a_run_for_every_free_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three threads free at once: one reading hands out three runs (distinct seeds of one row), knowing none
    in flight; with one thread the same study reads a run at a time (today's loop)."""
    for workers in (3, 1):
        folder = tmp_path / str(workers)
        doc = {"budget": {"epochs": 1, "batch_size": 128, "lr": 0.003, "seed": 0, "seeds": 4}, "replicates": {"policy": "decide"},
               "sampler": {"name": "random", "seed": 0}, "n_trials": 1}
        study = load_study_spec(write_study(folder, ONE, **doc))
        monkeypatch.setattr(queue_module, "wanted", Policy())
        LocalExecutor().run(study, study.open())  # the configuration at its first seed
        study = load_study_spec(write_study(folder, ONE, **doc, executor={"n_jobs": workers, "checkpoint_every_s": 0}))
        ostudy = study.open()
        policy = Policy(*[[study.keys[0]] * workers] * (3 // workers))
        monkeypatch.setattr(queue_module, "wanted", policy)
        LocalExecutor().run(study, ostudy)
        handed = [r for r in policy.readings if r["batch"] is not None]
        assert handed[0] == {"batch": workers, "pending": {}, "measured": 1}, policy.readings
        assert [r["batch"] for r in handed[:3 // workers]] == [workers] * (3 // workers)
        done = ostudy.get_trials(states=(COMPLETE,))
        assert sorted(t.user_attrs.get("seed", 0) for t in done) == [0, 1, 2, 3]


def test_a_reading_counts_the_runs_in_flight_at_every_rung_they_measure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`pending`: a queued or running 4-epoch run will measure its 2-epoch rung too; a round asks for what is
    free (`free` less the queued runs a worker would start); nothing new to read, no second reading."""
    study = load_study_spec(ladder_study(tmp_path, budget={"epochs": [2, 4], "batch_size": 128, "lr": 0.003, "seed": 0, "seeds": 3}))
    ostudy = study.open()
    monkeypatch.setattr(queue_module, "wanted", Policy())
    LocalExecutor().run(study, ostudy)  # the configuration at seed 0, 2 epochs
    key = study.keys[0]
    policy = Policy([row_key(key, 4), row_key(key, 2)])
    monkeypatch.setattr(queue_module, "wanted", policy)
    study.queue.evidence = None
    assert study.queue.replicates(ostudy, free=3) == [(key, 0), (key, 1)]
    assert policy.readings[-1] == {"batch": 3, "pending": {}, "measured": 1}
    assert study.queue.replicates(ostudy, free=3) == [] and len(policy.readings) == 1  # 2 queued of 3 free, same results
    assert study.queue.replicates(ostudy, free=4) == []  # a worker more: read again
    assert policy.readings[-1] == {"batch": 2, "pending": {row_key(key, 2): 2, row_key(key, 4): 1}, "measured": 1}
    trial, _ = study.queue.claim(ostudy)  # seed 0's 4-epoch run starts: seed 1's 2-epoch run may start beside it
    assert (study.seed_of(trial), study.length_of(trial)) == (0, 4) and study.queue.claim(ostudy) is not None


def test_a_run_waits_while_another_run_of_its_seed_trains(tmp_path: Path) -> None:
    """Under wsd a queued run whose (configuration, seed) trains now is held: it continues that run's state
    once it ends (started beside it, it would train from scratch the epochs that run is training)."""
    study = load_study_spec(ladder_study(tmp_path))
    ostudy = study.open()
    key = study.keys[0]
    queue_module.enqueue(study, ostudy, {"arch": key}, seed=0, epochs=2)
    queue_module.enqueue(study, ostudy, {"arch": key}, seed=0, epochs=4, replicate=True)
    first, _ = study.queue.claim(ostudy)
    assert study.length_of(first) == 2 and study.queue.claim(ostudy) is None  # held, and the sampler has no slot left
    plan = queue_module.startable(study.queue, ostudy, ostudy.get_trials(deepcopy=False))
    assert not plan.now and [study.length_of(t) for t in plan.held] == [4]
    ostudy.tell(first, state=optuna.trial.TrialState.PRUNED)
    second, _ = study.queue.claim(ostudy)
    assert (study.seed_of(second), study.length_of(second)) == (0, 4)


def test_a_grid_stopped_short_by_n_trials_still_replicates(tmp_path: Path) -> None:
    """Issue 42, item 5: a grid of 6 with n_trials 2 left 4 trials queued for ever, and a round waited for an
    empty queue, so the study stopped after its 2 first runs ("waiting 4 ... 2 more runs would narrow it"), and
    `run` again did nothing. The queued trials past n_trials never start: the policy's rounds go on."""
    path = write_study(tmp_path, budget={"epochs": [1, 2], "batch_size": 128, "lr": 0.003, "seed": 0, "seeds": 2},
                       replicates={"policy": "decide"}, n_trials=2)
    study = load_study_spec(path)
    ostudy = study.open()
    LocalExecutor().run(study, ostudy)
    done = ostudy.get_trials(states=(COMPLETE,))
    assert len({t.params["arch"] for t in done}) == 2 and len(done) > 2  # the policy's runs, on the 2 configurations
    assert len(ostudy.get_trials(states=(WAITING,))) == 4  # the grid's rest, never started
    assert study.queue.remaining(ostudy) == 0


def test_the_ray_searcher_hands_out_a_run_for_every_free_trial(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The searcher driven as Tune drives it (tests/test_driver_cache.py, the stand-in's trials), 3 trials at
    once: once the first configuration ends, one reading fills all three."""
    pytest.importorskip("ray")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench.standin
    from explorer.executors.ray_bridge import OptunaBridge, _Link

    path = write_study(tmp_path, ONE, task={"name": "bench.standin:StandIn", "seconds": 0}, budget={"epochs": 2, "seeds": 4},
                       replicates={"policy": "decide"}, sampler={"name": "random", "seed": 0}, n_trials=1, heartbeat_s=60)
    study = load_study_spec(path)
    ostudy = study.open()
    policy = Policy([study.keys[0]] * 3)
    monkeypatch.setattr(queue_module, "wanted", policy)
    link = _Link(study, ostudy)
    link.replicate = lambda free=1: (study.queue.replicates(link.open()[1], free), link.queued.set())  # read here, not on a thread
    bridge = OptunaBridge(link, slots=3)
    running: list[tuple[str, dict]] = []
    most, asked = 0, 0
    while True:
        while len(running) < 3 and isinstance(config := bridge.suggest(f"ray-{asked}"), dict):
            running.append((f"ray-{asked}", config))
            asked += 1
        most = max(most, len(running))
        if not running:
            break
        trial_id, config = running.pop(0)
        attrs = study.evaluator.evaluate(study.configs[config["arch"]], config["lineage"], None, "cpu", seed=config["seed"])
        bridge.on_trial_complete(trial_id, {"attrs": json.dumps(attrs)})
    link.release()
    assert next(r for r in policy.readings if r["measured"]) == {"batch": 3, "pending": {}, "measured": 1}
    assert most == 3 and sorted(t.user_attrs.get("seed", 0) for t in ostudy.get_trials(states=(COMPLETE,))) == [0, 1, 2, 3]


# -- a continued run killed mid-way ----------------------------------------------------------------------------
PROMOTED = {"epochs": [2, 6], "batch_size": 32, "lr": 0.003, "seed": 0, "seeds": 1}  # a 6-epoch run continues for 5 epochs


def promoted_study(tmp_path: Path, budget: dict = PROMOTED, **overrides: Any) -> tuple[Any, optuna.Study, str]:
    """One configuration's 2-epoch run at seed 0 (kept at its cooldown start) and its longer run queued, which
    continues it; the `fixed` policy at one seed queues nothing more."""
    path = write_study(tmp_path, ONE, budget=budget, replicates={"policy": "fixed"}, sampler={"name": "random", "seed": 0},
                       n_trials=1, **overrides)
    study = load_study_spec(path)
    ostudy = study.open()
    key = study.keys[0]
    queue_module.enqueue(study, ostudy, {"arch": key}, seed=0, epochs=2)
    return study, ostudy, key


@pytest.mark.slow
def test_a_continued_run_killed_mid_way_resumes_and_ends_as_from_scratch(tmp_path: Path) -> None:
    study, ostudy, key = promoted_study(tmp_path)
    LocalExecutor().run(study, ostudy)
    queue_module.enqueue(study, ostudy, {"arch": key}, seed=0, epochs=6, replicate=True)
    assert sorted(p.name for p in (study.checkpoint_root / "kept").rglob("*")) == ["2.json", "2.pt", "layers_1_heads_2-seed0"]
    command = [sys.executable, "-m", "explorer.cli", "run", str(study.source), "--no-dashboard"]
    driver = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    while not list(study.checkpoint_root.glob("trial-*/checkpoint.pt")):  # the continued run has stored an epoch of its own
        assert driver.poll() is None, driver.stdout.read()
        time.sleep(0.05)
    driver.send_signal(signal.SIGKILL)
    driver.communicate()
    time.sleep(3 * study.spec.heartbeat_s)  # its heartbeat goes stale: the next run fails it and queues it again
    again = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    trials = load_study_spec(study.source).read().get_trials()
    (six,) = [t for t in trials if t.state == COMPLETE and t.user_attrs["epochs"] == 6]
    assert any(t.state == optuna.trial.TrialState.FAIL for t in trials) and six.user_attrs["retry_of"] is not None
    scratch, _ = train(6, budget=study.spec.budget.model_copy(update={"seed": 0}))
    assert six.user_attrs["resumed_from"] == 2
    assert six.user_attrs["curve"] == scratch.curve and six.values[0] == scratch.metrics["accuracy"]
    assert not study.checkpoint_root.exists()  # the retry's checkpoint and the spent kept state are gone


@pytest.fixture
def nodes() -> Iterator[Any]:
    """A head with no CPU and two worker nodes of one CPU each: a trial runs on a worker node, which can be lost.
    Dead nodes are noticed within seconds (health checks every second)."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False,
                                                             "_system_config": {"health_check_period_ms": 1000,
                                                                                "health_check_failure_threshold": 3}})
    workers = [cluster.add_node(num_cpus=1) for _ in range(2)]
    ray.init(address=cluster.address, logging_level="WARNING",
             runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}})
    try:
        yield cluster, workers
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.mark.slow
def test_a_continued_run_moves_to_another_ray_node_and_ends_as_from_scratch(tmp_path: Path, nodes: Any) -> None:
    """The 2-epoch run's kept state reaches the experiment root (storage_path), not a node's disk; the 12-epoch run
    fetches it on its node, which is lost mid-run (9 epochs to go: it cannot end first): Ray retries it on the
    other node from its last checkpoint."""
    from explorer.executors.ray_tune import RayExecutor, experiment_root

    cluster, workers = nodes
    ray_executor = {"name": "ray", "cpu": 1, "max_concurrent": 1, "max_failures": 2, "storage_path": "ray-results",
                    "checkpoint_every_s": 0}
    study, ostudy, key = promoted_study(tmp_path, {**PROMOTED, "epochs": [2, 12]}, executor=ray_executor)
    RayExecutor().run(study, ostudy)
    shared = experiment_root(study) / "kept" / "layers_1_heads_2-seed0"
    assert sorted(p.name for p in shared.iterdir()) == ["2.json", "2.pt"] and not study.checkpoint_root.exists()
    queue_module.enqueue(study, ostudy, {"arch": key}, seed=0, epochs=12, replicate=True)
    lost: list[str] = []
    ended = threading.Event()

    def lose_its_node() -> None:  # once the continued run (its first epoch is the 2nd) reported its 2nd epoch: its node goes
        while not lost and not ended.is_set():
            for row in _rows(experiment_root(study)):
                if row.get("epoch") == 3 and row.get("training_iteration") == 2:
                    node = next(n for n in workers if n.node_id == row["node"])
                    cluster.remove_node(node, allow_graceful=False)
                    lost.append(row["node"])
                    return
            time.sleep(0.05)

    killer = threading.Thread(target=lose_its_node, daemon=True)
    killer.start()
    RayExecutor().run(study, ostudy)
    ended.set()
    killer.join()
    assert lost, "the continued run never reported its second epoch"
    (long,) = [t for t in ostudy.get_trials() if t.state == COMPLETE and t.user_attrs["epochs"] == 12]
    rows = _rows(experiment_root(study))
    moved = {r["trial_id"] for r in rows if r.get("epoch", 0) > 2}
    assert {r["node"] for r in rows if r["trial_id"] in moved} == {n.node_id for n in workers}  # it ran on both nodes
    scratch, _ = train(12, budget=study.spec.budget.model_copy(update={"seed": 0}))
    assert long.user_attrs["resumed_from"] == 2
    assert long.user_attrs["curve"] == scratch.curve and long.values[0] == scratch.metrics["accuracy"]
    assert not shared.exists()  # the 12-epoch run is the ladder's longest: the spent state is deleted there too


def _rows(root: Path) -> list[dict]:
    rows = []
    for f in root.glob("*/*/result.json"):
        rows += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return rows
