"""Devices and faults on the local executor (issue 27): `device: auto|cpu|cuda`, one trial per GPU, the
execution class a study records, faults retried and never measured, out of memory beside other trials
rerun alone.

No GPU here: "GPUs" are torch.cuda's answers monkeypatched (`fake_gpus`), and the trial that gets
`cuda:i` trains on the CPU and reports the device it was given; the pool, the queue, the storage and the
training are real. `CUDA_VISIBLE_DEVICES=""` hides every GPU from torch on any machine, so the tests of
what happens without one run as a user's `explorer run` in a subprocess.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
import torch
from conftest import TINY_SPACE, write_study

import explorer
import explorer.train as train_module  # the evaluator imports its run_trial when a trial trains
from explorer.errors import ExplorerError, TrialFailed
from explorer.executors import devices
from explorer.executors.devices import DevicePool, Execution, local_execution
from explorer.faults import Fault, OutOfMemory, classify
from explorer.identity import trial_class
from explorer.study import load_study_spec
from explorer.train import precision

COMPLETE, FAIL, WAITING = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL, optuna.trial.TrialState.WAITING
QUICK = {"epochs": 2, "max_steps": 4, "batch_size": 64, "lr": 0.003, "seed": 0}
FAULTY = {**TINY_SPACE, "family": "faulty:FaultyEncoder", "free": {"layers": [1, 2], "heads": [1]}}  # a grid of two
TESTS = Path(__file__).resolve().parent


@pytest.fixture
def fake_gpus(monkeypatch: pytest.MonkeyPatch):
    """`install(n)`: explorer sees n GPUs; a trial given `cuda:i` trains on the CPU and reports `cuda:i`. Returns
    the runs as (device, start, end, dims), in the order they ended; `before(device, dims)` runs first in each."""
    runs: list[tuple] = []
    real = train_module.run_trial

    def install(n: int, before=None):
        monkeypatch.setattr(devices, "visible_gpus", lambda: ["Fake GPU"] * n)  # torch.cuda itself stays: the CPU training needs it

        def on_cpu(family, dims, task, budget, callback=None, checkpoint_dir=None, device=None, checkpoint_every_s=0.0):
            start = time.monotonic()
            try:
                if before is not None:
                    before(device, dims)
                result = real(family, dims, task, budget, callback, checkpoint_dir, "cpu", checkpoint_every_s)
            finally:
                runs.append((device, start, time.monotonic(), dims))
            return dataclasses.replace(result, device=device, device_name="Fake GPU", precision=precision(device, budget.bf16))

        monkeypatch.setattr(train_module, "run_trial", on_cpu)
        return runs

    return install


def overlapping(runs: list[tuple]) -> list[tuple[tuple, tuple]]:
    return [(a, b) for i, a in enumerate(runs) for b in runs[i + 1:] if a[1] < b[2] and b[1] < a[2]]


# -- choosing the device ---------------------------------------------------------------------------------------
def explorer_run(path: Path, *args: str, gpus: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpus}  # "": torch sees no GPU, on any machine
    return subprocess.run([sys.executable, "-m", "explorer.cli", "run", str(path), "--no-dashboard", *args],
                          env=env, capture_output=True, text=True, timeout=300)


def test_cuda_asked_where_torch_sees_no_gpu_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    """One line before anything else is printed, naming what asked for CUDA: the flag, or the YAML's field."""
    out = explorer_run(write_study(tmp_path / "flag"), "--device", "cuda")
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(lines) == 1 and lines[0].startswith(
        "error: --device cuda, but this machine has no GPU") and "pass --device cpu (or auto)" in lines[0], out.stderr
    out = explorer_run(write_study(tmp_path / "yaml", executor={"device": "cuda"}))
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(lines) == 1 and lines[0].startswith(
        f"error: {tmp_path / 'yaml' / 'study.yaml'}: executor.device: device: cuda, but this machine has no GPU"), out.stderr
    assert not (tmp_path / "flag" / "tiny.db").exists() and not (tmp_path / "yaml" / "tiny.db").exists()  # refused before the storage opened


def test_auto_without_a_gpu_trains_on_the_cpu_and_says_what_runs(tmp_path: Path) -> None:
    out = explorer_run(write_study(tmp_path, n_trials=1, budget=QUICK))
    assert out.returncode == 0, out.stderr
    said = " ".join(out.stderr.split())  # prose wraps at 80 columns in a pipe
    assert "trains on this machine's CPU: 1 trial at once, in float32 (budget.bf16 applies on CUDA only)" in said
    study = load_study_spec(tmp_path / "study.yaml")
    ostudy = study.read()
    (t,) = ostudy.get_trials(states=(COMPLETE,))
    assert ostudy.user_attrs["execution"] == "cpu float32"
    assert {k: t.user_attrs[k] for k in ("device", "device_name", "precision", "execution", "torch")} == {
        "device": "cpu", "device_name": "CPU", "precision": "float32", "execution": "cpu float32", "torch": torch.__version__}


@pytest.mark.parametrize("executor, field, words", [
    ({"device": "cpu", "gpu": 1}, "executor.gpu", "gpu: 1 with device: cpu"),
    ({"gpu": 2}, "executor.gpu", "gpu: 2: a trial trains on one GPU"),
    ({"device": "cuda", "gpu": 0}, "executor.gpu", "gpu: 0 with device: cuda"),
])
def test_contradictory_device_settings_are_one_line(tmp_path: Path, fake_gpus, executor: dict, field: str, words: str) -> None:
    fake_gpus(2)
    with pytest.raises(ExplorerError, match=f"study.yaml: {field}: {words}"):
        local_execution(load_study_spec(write_study(tmp_path, executor=executor)))


def test_auto_takes_the_gpus_one_trial_each_and_gpu_0_or_cpu_keeps_the_cpu(tmp_path: Path, fake_gpus) -> None:
    fake_gpus(2)
    gpu = local_execution(load_study_spec(write_study(tmp_path / "a")))
    assert (gpu.device, gpu.gpu, gpu.slots, gpu.name) == ("cuda", 1.0, 2, "cuda bfloat16")
    assert gpu.where == "2 GPUs (2x Fake GPU)"
    half = local_execution(load_study_spec(write_study(tmp_path / "b", executor={"gpu": 0.5, "n_jobs": 3})))
    assert (half.slots, half.gpu) == (3, 0.5)  # n_jobs, within the 4 slots of two GPUs at half each
    for executor in ({"gpu": 0}, {"device": "cpu"}):
        cpu = local_execution(load_study_spec(write_study(tmp_path / str(executor), executor=executor)))
        assert (cpu.device, cpu.gpu, cpu.slots, cpu.name) == ("cpu", 0.0, 1, "cpu float32")
    fp32 = local_execution(load_study_spec(write_study(tmp_path / "c", budget={**QUICK, "bf16": False})))
    assert fp32.name == "cuda float32"


def test_local_trials_rotate_over_the_gpus_one_trial_per_gpu(tmp_path: Path, fake_gpus) -> None:
    """Before: every trial on cuda:0 whatever n_jobs. The first two trials are held until both started, so
    both GPUs must be in use at once; no GPU ever runs two trials."""
    both = threading.Barrier(2, timeout=60)
    runs = fake_gpus(2, before=lambda device, dims: both.wait() if len(started) < 2 and not started.append(device) else None)
    started: list[str] = []
    exp = explorer.load(write_study(tmp_path, budget=QUICK))
    exp.run()
    devices = [r[0] for r in runs]
    assert len(runs) == 6 and set(devices) == {"cuda:0", "cuda:1"} and set(started) == {"cuda:0", "cuda:1"}
    assert all(a[0] != b[0] for a, b in overlapping(runs)), runs  # one trial per GPU at a time
    trials = exp.measured()
    assert set(trials["execution"]) == {"cuda bfloat16"} and set(trials["device_name"]) == {"Fake GPU"}


def test_the_pool_shares_a_gpu_only_as_asked_and_an_alone_lease_empties_one() -> None:
    pool = DevicePool(Execution("cuda", "bfloat16", 0.5, 4, "2 GPUs"), gpus=2)
    with pool.lease() as a, pool.lease() as b, pool.lease() as c:
        assert sorted([a.device, b.device, c.device]) == ["cuda:0", "cuda:0", "cuda:1"]  # least loaded first, two per GPU
        shared = [x for x in (a, b, c) if x.device == "cuda:0"]
        assert all(x.shared for x in shared) and not [x for x in (a, b, c) if x.device == "cuda:1"][0].shared
        got, done = [], threading.Event()

        def alone() -> None:
            with pool.lease(alone=True) as lease:
                got.append(lease)
                done.wait(10)

        waiter = threading.Thread(target=alone)
        waiter.start()
        time.sleep(0.3)
        assert not got  # no GPU is empty: the alone lease waits, and no new lease joins a held GPU meanwhile
    waiter_deadline = time.monotonic() + 5
    while not got and time.monotonic() < waiter_deadline:
        time.sleep(0.01)
    assert got and not got[0].shared
    with pool.lease() as e:  # the alone lease keeps its GPU to itself: a new lease takes the other
        assert e.device != got[0].device
    done.set()
    waiter.join(5)


# -- the execution class ----------------------------------------------------------------------------------------
def test_a_trial_reads_as_the_class_it_ran_under() -> None:
    assert trial_class("COMPLETE", {"execution": "cuda float32", "device": "cpu"}) == "cuda float32"
    assert trial_class("COMPLETE", {"device": "cuda"}) == "cuda bfloat16"  # stored before trials recorded a class
    assert trial_class("COMPLETE", {"device": "cuda:1"}, bf16=False) == "cuda float32"
    assert trial_class("FAIL", {}) == "cpu float32"  # no device attr says otherwise
    assert trial_class("WAITING", {}) is None  # queued: takes the class of the run that runs it


def test_a_cpu_study_continued_on_gpus_is_refused_unless_forced_and_never_mixed(tmp_path: Path, fake_gpus) -> None:
    two = {**TINY_SPACE, "free": {"layers": [1, 2], "heads": [1]}}
    path = write_study(tmp_path, two, budget={**QUICK, "seeds": 2}, n_trials=2)
    exp = explorer.load(path)
    exp.run()  # on the CPU: both seeds of two configurations
    cpu = exp.measured()
    assert len(cpu) == 4 and set(cpu["execution"]) == {"cpu float32"}
    fake_gpus(1)
    with pytest.raises(ExplorerError, match=r"study\.yaml: executor\.device: this study's trials ran as cpu float32, and this run "
                                            r"would train as cuda bfloat16 on 1 GPU \(Fake GPU\): set executor\.device: cpu"):
        explorer.load(path).run()
    gpu = explorer.load(path).run(force=True)
    rows = gpu.measured()
    assert set(rows["execution"]) == {"cuda bfloat16"} and len(rows) == 4  # measured again, on the GPU
    stats = gpu.stats()
    assert len(stats) == 2 and (stats["n"] == 2).all()  # a configuration's CPU seeds are not paired with its GPU seeds
    note = gpu.status().classes
    assert note and "2 execution classes: the 4 of cuda bfloat16 are read, 4 of cpu float32 are kept and set aside" in note
    assert "train_time_s" in rows and len(gpu.trials()) > len(rows)  # every trial stays stored


# -- faults ---------------------------------------------------------------------------------------------------------
def test_what_went_wrong_is_sorted_into_results_and_faults() -> None:
    illegal = classify(torch.AcceleratorError("CUDA error: an illegal memory access was encountered"), shared=False)
    assert isinstance(illegal, Fault) and illegal.broken and "illegal memory access" in str(illegal)
    assert isinstance(classify(RuntimeError("CUDA error: device-side assert triggered"), shared=False), Fault)
    oom = OutOfMemory("out of memory on cuda:0: CUDA out of memory")
    assert classify(oom, shared=False) is oom  # alone: the configuration cannot run here
    rerun = classify(oom, shared=True)
    assert isinstance(rerun, Fault) and rerun.alone and not rerun.broken
    bug = classify(ValueError("shapes differ"), shared=True)
    assert isinstance(bug, TrialFailed) and str(bug) == "ValueError: shapes differ"


@pytest.fixture
def faults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The `faulty` family (tests/faulty.py), armed through a folder of this test's."""
    monkeypatch.setenv("EXPLORER_TEST_FAULT_DIR", str(tmp_path / "faults"))
    (tmp_path / "faults").mkdir()
    monkeypatch.syspath_prepend(str(TESTS))
    import faulty

    return faulty


def test_a_broken_cuda_context_stops_the_run_and_the_trial_is_retried_not_measured(tmp_path: Path, faults) -> None:
    """Before: an illegal memory access was the trial's measurement (FAILED with a reason, counted, never
    retried), and the next trials ran in the same broken CUDA context."""
    path = write_study(tmp_path, FAULTY, n_trials=2, budget={**QUICK, "max_steps": None})
    faults.arm("illegal")
    exp = explorer.load(path)
    with pytest.raises(ExplorerError, match=r"trial 0 \(layers=1,heads=1\): AcceleratorError: CUDA error: an illegal memory access "
                                            r"was encountered; this process's CUDA context is unusable, so the run stops: .* explorer resume"):
        exp.run()
    study = load_study_spec(path)
    ostudy = study.read()
    (faulted,) = ostudy.get_trials(states=(FAIL,))
    assert "fault" in faulted.user_attrs and "fail_reason" not in faulted.user_attrs
    assert study.reads.finished(ostudy) == 0 and study.reads.failures(ostudy) == 0  # not a measurement, not a failure
    assert explorer.load(path).status().states.get("FAULT") == 1  # `explorer status`: "fault 1"
    assert [t.user_attrs.get("retry_of") for t in ostudy.get_trials(states=(WAITING,)) if "retry_of" in t.user_attrs] == [faulted.number]
    assert (study.checkpoint_dir(study.configs["layers=1,heads=1"], faulted.number) / "checkpoint.pt").exists()  # kept for it
    explorer.load(path).run(resume=True)
    ostudy = study.read()
    done = ostudy.get_trials(states=(COMPLETE,))
    assert sorted(t.params["arch"] for t in done) == ["layers=1,heads=1", "layers=2,heads=1"]
    assert len(next(t for t in done if t.user_attrs.get("retry_of") == faulted.number).user_attrs["curve"]) == 2


def test_out_of_memory_beside_another_trial_is_rerun_alone_before_it_counts(tmp_path: Path, faults, fake_gpus) -> None:
    """`gpu: 0.5`: two trials share the GPU. The one that runs out of memory while the other holds the GPU
    is queued again `alone` and runs with the GPU to itself; before, the neighbour's memory decided it."""
    both = threading.Barrier(2, timeout=60)
    started: list[str] = []
    runs = fake_gpus(1, before=lambda device, dims: both.wait() if len(started) < 2 and not started.append(device) else None)
    path = write_study(tmp_path, FAULTY, n_trials=2, budget={**QUICK, "max_steps": None}, executor={"gpu": 0.5, "checkpoint_every_s": 0})
    faults.arm("oom")
    exp = explorer.load(path).run()
    ostudy = exp.optuna_study()
    (faulted,) = ostudy.get_trials(states=(FAIL,))
    assert faulted.user_attrs["fault"].endswith("(other trials shared the device: rerun alone)") and "fail_reason" not in faulted.user_attrs
    (rerun,) = [t for t in ostudy.get_trials(states=(COMPLETE,)) if t.user_attrs.get("retry_of") == faulted.number]
    assert rerun.user_attrs["alone"] is True and rerun.params["arch"] == faulted.params["arch"]
    assert len(exp.measured()) == 2 and not faults.armed()
    alone = [r for r in runs if r[3] == faulted.user_attrs["config"]][-1]  # the rerun: the last run of that configuration
    assert not [pair for pair in overlapping(runs) if alone in pair], runs  # the GPU was its own


def test_out_of_memory_alone_on_the_device_is_the_configurations_result(tmp_path: Path, faults, fake_gpus) -> None:
    fake_gpus(1)
    path = write_study(tmp_path, FAULTY, n_trials=2, budget={**QUICK, "max_steps": None})
    faults.arm("oom")
    ostudy = explorer.load(path).run().optuna_study()
    (failed,) = ostudy.get_trials(states=(FAIL,))
    # (the "GPU" trains on the CPU here, so the reason names it; on CUDA it says what memory the trial needed)
    assert failed.user_attrs["fail_reason"] == "out of memory on cpu: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert "fault" not in failed.user_attrs and explorer.load(path).status().outcomes == (1, 1)  # measured: failed


def test_a_fault_past_max_failures_fails_by_itself_saying_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def always(*args, **kwargs):
        raise Fault("NCCL error: unhandled system error")

    monkeypatch.setattr(train_module, "run_trial", always)
    path = write_study(tmp_path, {**TINY_SPACE, "free": {"layers": [2], "heads": [1]}}, n_trials=1, executor={"max_failures": 2})
    ostudy = explorer.load(path).run().optuna_study()
    trials = ostudy.get_trials(states=(FAIL,))
    assert [("fail_reason" in t.user_attrs) for t in trials] == [False, False, True]  # two retries, then given up
    assert trials[-1].user_attrs["fail_reason"] == ("gave up after 3 faults (executor.max_failures: 2); the last: "
                                                    "NCCL error: unhandled system error")
    assert [t.user_attrs.get("retry_of") for t in trials] == [None, 0, 0]
