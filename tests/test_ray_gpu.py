"""The Ray executor on a cluster with GPUs (issue 27): a one-node Ray on this machine that declares two fake
GPUs (`num_gpus=2`), so Ray schedules and assigns GPUs (CUDA_VISIBLE_DEVICES per worker) as on GPU nodes,
while torch here sees none. And the driver's searcher, driven as Tune drives it, with no cluster at all.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from conftest import TINY_SPACE, write_study

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

import explorer  # noqa: E402
from explorer.errors import ExplorerError  # noqa: E402
from explorer.executors.ray_bridge import OptunaBridge, _Link  # noqa: E402
from explorer.executors.ray_tune import RayExecutor, experiment_root, resources  # noqa: E402
from explorer.study import load_study_spec  # noqa: E402

COMPLETE, FAIL, WAITING = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL, optuna.trial.TrialState.WAITING
RAY = {"name": "ray", "cpu": 1, "max_failures": 1, "checkpoint_every_s": 0}
ONE = {**TINY_SPACE, "free": {"layers": [2], "heads": [1]}}  # one configuration (the baseline)
QUICK = {"epochs": 2, "batch_size": 128, "lr": 0.003, "seed": 0}


@pytest.fixture(scope="module")
def gpu_cluster() -> Iterator[Cluster]:
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 2, "include_dashboard": False})
    ray.init(address=c.address, logging_level="WARNING")
    yield c
    ray.shutdown()
    c.shutdown()


def test_a_gpu_cluster_gives_each_trial_a_gpu_and_runs_as_many_as_it_holds(gpu_cluster: Cluster, tmp_path: Path) -> None:
    """Before: `gpu: 0` by default (a GPU cluster trained on its CPUs, silently) and `max_concurrent: 2`."""
    def resolved(**executor):
        return RayExecutor().prepare(load_study_spec(write_study(tmp_path / str(len(list(tmp_path.iterdir()))), executor={**RAY, **executor})))

    auto = resolved()
    assert (auto.device, auto.gpu, auto.slots, auto.name) == ("cuda", 1.0, 2, "cuda bfloat16")
    assert auto.line(True) == "trains on the Ray cluster's 2 GPUs on 1 node: 2 trials at once, 1 GPU per trial, in bfloat16"
    assert resolved(max_concurrent=1).slots == 1
    assert resolved(gpu=0.5).slots == 2  # four GPU halves, but two CPUs at one a trial
    assert resolved(gpu=0.5, cpu=0.5).slots == 4  # a fraction only when asked for
    cpu = resolved(device="cpu")
    assert (cpu.device, cpu.gpu, cpu.slots, cpu.name) == ("cpu", 0.0, 2, "cpu float32")


@pytest.mark.parametrize("executor, words", [
    ({"cpu": 3}, r"executor\.cpu: a trial asks for 3 CPUs and 1 GPU, and no node of the Ray cluster has that \(its nodes: 2 CPUs, 2 GPUs\)"),
    ({"gpu": 2}, r"executor\.gpu: gpu: 2: a trial trains on one GPU"),
])
def test_a_request_the_cluster_cannot_meet_is_one_line_at_once(gpu_cluster: Cluster, tmp_path: Path, executor: dict, words: str) -> None:
    """Before: Tune left such a trial pending for good, saying why only in a log file (the run never ended).
    Now resolving the cluster's devices refuses it, before a Tuner starts or the storage opens."""
    path = write_study(tmp_path, executor={**RAY, **executor})
    with pytest.raises(ExplorerError, match=words):
        RayExecutor().prepare(load_study_spec(path))
    with pytest.raises(ExplorerError, match=words):
        explorer.load(path).run()
    assert not (tmp_path / "tiny.db").exists()  # refused before the storage opened


@pytest.mark.slow
def test_a_trial_given_a_gpu_never_trains_on_the_cpu_instead(gpu_cluster: Cluster, tmp_path: Path) -> None:
    """The fake GPUs are invisible to torch: each attempt is a fault, retried by Ray on a fresh worker, and
    then the trial fails saying why. Nothing trains on a CPU in the GPUs' stead."""
    path = write_study(tmp_path, ONE, n_trials=1, budget=QUICK, executor=RAY)
    explorer.load(path).run()
    ostudy = load_study_spec(path).read()
    assert ostudy.user_attrs["execution"] == "cuda bfloat16"
    (trial,) = ostudy.get_trials(states=(FAIL,))
    assert re.match(r"gave up after 2 failed attempts on fresh Ray workers \(executor\.max_failures: 1\); the last: Ray assigned GPU \d on "
                    r"node [\d.]+, but torch there sees no CUDA device \(CUDA_VISIBLE_DEVICES='\d'", trial.user_attrs["fail_reason"])
    assert "torch there sees no CUDA device" in trial.user_attrs["fault"] and "device" not in trial.user_attrs
    rows = [json.loads(line) for f in experiment_root(load_study_spec(path)).glob("*/*/result.json") for line in f.read_text().splitlines()]
    assert len({r["pid"] for r in rows if "fault" in r}) == 2  # two attempts, two worker processes


@pytest.mark.slow
def test_device_cpu_on_a_gpu_cluster_trains_on_its_cpus(gpu_cluster: Cluster, tmp_path: Path) -> None:
    path = write_study(tmp_path, ONE, n_trials=1, budget=QUICK, executor={**RAY, "device": "cpu"})
    explorer.load(path).run()
    (trial,) = load_study_spec(path).read().get_trials(states=(COMPLETE,))
    assert (trial.user_attrs["device"], trial.user_attrs["execution"]) == ("cpu", "cpu float32")


# -- the driver's searcher, without a cluster --------------------------------------------------------------------
def bridge(tmp_path: Path, **overrides) -> tuple:
    study = load_study_spec(write_study(tmp_path, **{"executor": RAY, **overrides}))
    ostudy = study.open()
    link = _Link(study, ostudy)
    return study, ostudy, link, OptunaBridge(link)


def test_out_of_memory_beside_others_on_a_shared_gpu_is_queued_again_with_a_gpu_of_its_own(tmp_path: Path) -> None:
    study, ostudy, link, searcher = bridge(tmp_path, sampler={"name": "random", "seed": 0})
    try:
        first = searcher.suggest("ray-1")
        assert first["alone"] is False and resources(1, 0.5, first).required_resources == {"CPU": 1, "GPU": 0.5}
        searcher.on_trial_complete("ray-1", {"fault": "out of memory on cuda:0: ... (other trials shared the device: rerun alone)",
                                             "alone": True})
        faulted = ostudy.trials[first["optuna_number"]]
        assert faulted.state == FAIL and "fault" in faulted.user_attrs and "fail_reason" not in faulted.user_attrs
        again = searcher.suggest("ray-2")  # the retry is queued, so it comes first
        assert again["arch"] == first["arch"] and again["alone"] is True and again["lineage"] == first["optuna_number"]
        assert resources(1, 0.5, again).required_resources == {"CPU": 1, "GPU": 1.0}  # the whole GPU
        assert study.reads.finished(ostudy) == 0  # the fault is no measurement
    finally:
        link.release()


def test_the_driver_never_copies_the_stored_trials_per_suggest_or_tell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: `suggest` deep-copied every stored trial twice per running trial (`ostudy.trials`), and `tell`
    once more: about 11 s a suggest at 32 running and 2,000 stored. bench/ray_suggest.py times it."""
    study, ostudy, link, searcher = bridge(tmp_path, sampler={"name": "random", "seed": 0})
    try:
        link.on_trial = lambda s, t: None  # the progress callback is handed the one finished trial

        def copied(self):
            raise AssertionError("copied every stored trial")

        monkeypatch.setattr(optuna.Study, "trials", property(copied))
        launched = [searcher.suggest(f"ray-{i}") for i in range(3)]
        searcher.on_trial_complete("ray-0", {"attrs": json.dumps({"accuracy": 0.5, "params": 1, "curve": [0.5]})})
        searcher.suggest("ray-3")
        assert all(isinstance(c, dict) for c in launched) and set(searcher.running) == {"ray-1", "ray-2", "ray-3"}
    finally:
        link.release()
