"""run_trial on real families and tasks: loss falls, metrics reach the callback, failures and resumes."""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest
import torch
from pydantic import ValidationError

from explorer.errors import ExplorerError, TrialFailed
from explorer.families import get_family
from explorer.tasks import get_task
from explorer.train import Budget, TrialResult, run_trial

IMAGE = dict(layers=2, heads=4, width=32, mlp=64, img_size=8, patch=2, in_chans=1, num_classes=10)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def train(family: str, dims: dict, task, budget: Budget, **kwargs) -> tuple[TrialResult, list]:
    reports: list[tuple[int, dict[str, float]]] = []
    result = run_trial(family, dims, task, budget, callback=lambda e, m: reports.append((e, m)), device="cpu", **kwargs)
    return result, reports


def assert_learns(result: TrialResult, reports: list, metric: str, layers: int) -> None:
    assert [epoch for epoch, _ in reports] == list(range(len(result.curve)))
    assert [m[metric] for _, m in reports] == result.curve
    assert result.metrics == reports[-1][1] and result.metric == result.curve[-1]
    losses = [m["train_loss"] for _, m in reports]
    assert losses[-1] < losses[0], losses
    assert all(math.isfinite(v) for v in result.metrics.values())
    assert len(result.kappa_init) == len(result.kappa_final) == layers
    assert [b["name"] for b in result.kappa_init] == [b["name"] for b in result.kappa_final]
    assert all(b["kappa"] >= 1 for b in result.kappa_init + result.kappa_final)
    assert result.device == "cpu" and result.train_time_s > 0


def test_image_encoder_learns_digits():
    task = get_task("digits", {})
    # the standard init (N(0, 0.02)) is small for width 32: it takes a few epochs to leave chance
    result, reports = train("image-encoder", IMAGE, task, Budget(epochs=5, lr=3e-3))
    assert_learns(result, reports, "accuracy", layers=2)
    assert result.curve[-1] > 0.3  # chance is 0.1
    assert result.params == get_family("image-encoder").params(IMAGE)
    assert result.steps == 5 * len(task.load(64, 0).train)
    assert set(result.metrics) == {"accuracy", "eval_loss", "train_loss"}


def test_sequence_classifier_learns_listops():
    task = get_task("listops", {"n_train": 256, "n_eval": 64, "min_length": 8, "max_length": 32})
    dims = dict(layers=1, heads=2, width=32, mlp=64, **task.dims())
    result, reports = train("sequence-classifier", dims, task, Budget(epochs=3, batch_size=32, lr=3e-3))
    assert_learns(result, reports, "accuracy", layers=1)


def test_causal_lm_learns_a_text_file(tmp_path: Path):
    text = "".join(f"the cat {w} sat on the mat number {i % 7}. " for i, w in enumerate(["red", "old", "big"] * 60))
    (tmp_path / "stories.txt").write_text(text)
    task = get_task("text-file", {"path": str(tmp_path / "stories.txt"), "seq_len": 32})
    dims = dict(layers=1, heads=2, width=32, mlp=64, **task.dims())
    result, reports = train("causal-lm", dims, task, Budget(epochs=3, batch_size=16, lr=3e-3))
    assert_learns(result, reports, "eval_loss", layers=1)
    assert set(result.metrics) == {"eval_loss", "perplexity", "train_loss"}
    assert result.metrics["perplexity"] == pytest.approx(math.exp(result.metrics["eval_loss"]))
    assert result.metrics["eval_loss"] < math.log(256)  # better than a uniform guess over bytes


TIMM = {  # tiny members of each timm family, with the number of attention modules each has
    "timm-vit": (dict(model="vit_small_patch16_224", layers=2, heads=2, width=32, mlp=64, patch=4), 16, 2),
    "timm-deit": (dict(model="deit_tiny_patch16_224", layers=2, heads=2, width=32, mlp=64, patch=4), 16, 2),
    "timm-xcit": (dict(model="xcit_nano_12_p8_224", layers=2, heads=2, width=32, mlp=64, patch=8), 32, 2),
    "timm-tnt": (dict(model="tnt_s_patch16_224", layers=2, heads=2, width=32, mlp=64, patch=16), 32, 4),
    "timm-davit": (dict(model="davit_tiny", layers=1, heads=1, width=16, mlp=32), 32, 8),
}


@pytest.mark.parametrize("family", sorted(TIMM))
def test_timm_families_learn_resized_digits(family: str):
    dims, img_size, attention_modules = TIMM[family]
    task = get_task("digits", {"img_size": img_size, "in_chans": 3, "eval_fraction": 0.8})
    dims = {**dims, **task.dims()}
    result, reports = train(family, dims, task, Budget(epochs=3, lr=3e-3))
    assert_learns(result, reports, "accuracy", layers=attention_modules)
    assert result.params == get_family(family).params(dims)


def test_crammed_bert_trains_as_a_sequence_classifier():
    task = get_task("listops", {"n_train": 256, "n_eval": 64, "min_length": 8, "max_length": 32})
    dims = dict(layers=1, heads=2, width=32, mlp=64, **task.dims())
    result, reports = train("crammed-bert", dims, task, Budget(epochs=3, batch_size=32, lr=3e-3))
    assert_learns(result, reports, "accuracy", layers=1)


def test_max_steps_stops_early_and_still_evaluates():
    result, reports = train("image-encoder", IMAGE, get_task("digits", {}), Budget(epochs=5, max_steps=3))
    assert result.steps == 3 and len(result.curve) == len(reports) == 1


def test_time_limit_stops_early_and_still_evaluates():
    result, reports = train("image-encoder", IMAGE, get_task("digits", {}), Budget(epochs=5, time_limit_s=1e-6))
    assert result.steps == 1 and len(reports) == 1 and 0 <= result.metric <= 1


def test_diverging_loss_fails_the_trial():
    with pytest.raises(TrialFailed, match=r"loss is (nan|inf) at step \d+"):
        budget = Budget(epochs=1, lr=1e30, grad_clip=None)  # the first AdamW step moves weights by ~1e30
        run_trial("image-encoder", IMAGE, get_task("digits", {}), budget, device="cpu")


def forward_calls(monkeypatch: pytest.MonkeyPatch, fail_at: int | None) -> list[bool]:
    """Every built model's forward calls, recorded as `model.training`; call number `fail_at` runs out of memory."""
    family = get_family("image-encoder")
    build, calls = type(family).build, []

    def patched(self, dims):
        model = build(self, dims)
        forward = model.forward

        def counted(*args, **kwargs):
            calls.append(model.training)
            if len(calls) - 1 == fail_at:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return forward(*args, **kwargs)

        model.forward = counted
        return model

    monkeypatch.setattr(type(family), "build", patched)
    return calls


@pytest.mark.parametrize("when", ["kappa at init", "training", "kappa after training"])
def test_out_of_memory_anywhere_in_the_trial_fails_it(monkeypatch: pytest.MonkeyPatch, when: str):
    budget, task = Budget(epochs=1, max_steps=2), get_task("digits", {})
    calls = forward_calls(monkeypatch, fail_at=None)
    run_trial("image-encoder", IMAGE, task, budget, device="cpu")
    fail_at = {"kappa at init": 0, "training": calls.index(True), "kappa after training": len(calls) - 1}[when]
    assert when != "training" or fail_at > 0  # the first training forward comes after κ at init
    forward_calls(monkeypatch, fail_at)
    with pytest.raises(TrialFailed, match="^out of memory on cpu: CUDA out of memory. Tried to allocate 2.00 GiB$"):
        run_trial("image-encoder", IMAGE, task, budget, device="cpu")


def test_callback_exceptions_propagate():
    def prune(epoch: int, metrics: dict[str, float]) -> None:
        raise optuna.TrialPruned(f"epoch {epoch}")

    with pytest.raises(optuna.TrialPruned, match="epoch 0"):
        budget = Budget(epochs=2, max_steps=4)
        run_trial("image-encoder", IMAGE, get_task("digits", {}), budget, callback=prune, device="cpu")


class Interrupt(Exception):
    pass


def test_resumed_trial_matches_an_uninterrupted_one(tmp_path: Path):
    task, budget = get_task("digits", {}), Budget(epochs=3, max_steps=60, lr=3e-3)  # epoch 2 stops at step 60
    whole = run_trial("image-encoder", IMAGE, task, budget, device="cpu")

    def die_in_epoch_1(epoch: int, metrics: dict[str, float]) -> None:
        if epoch == 1:
            raise Interrupt  # killed while reporting epoch 1, after its checkpoint: resume goes on at epoch 2

    with pytest.raises(Interrupt):
        run_trial("image-encoder", IMAGE, task, budget, die_in_epoch_1, checkpoint_dir=tmp_path, device="cpu")
    assert (tmp_path / "checkpoint.pt").exists()
    epochs: list[int] = []
    resumed = run_trial(
        "image-encoder", IMAGE, task, budget, lambda e, m: epochs.append(e), checkpoint_dir=tmp_path, device="cpu"
    )
    assert epochs == [2]
    for field in ("metric", "metrics", "curve", "kappa_init", "kappa_final", "steps", "params"):
        assert getattr(resumed, field) == getattr(whole, field), field
    again = run_trial("image-encoder", IMAGE, task, budget, checkpoint_dir=tmp_path, device="cpu")
    assert again.metrics == whole.metrics and again.steps == whole.steps  # a finished trial just reports


def test_checkpoint_of_another_configuration_is_refused(tmp_path: Path):
    task, budget = get_task("digits", {}), Budget(epochs=1, max_steps=1)
    run_trial("image-encoder", IMAGE, task, budget, checkpoint_dir=tmp_path, device="cpu")
    with pytest.raises(ExplorerError, match="checkpoint.pt"):
        run_trial("image-encoder", {**IMAGE, "heads": 2}, task, budget, checkpoint_dir=tmp_path, device="cpu")


def test_budget_rejects_unknown_and_invalid_fields():
    with pytest.raises(ValidationError, match="epoch"):
        Budget(epoch=3)
    with pytest.raises(ValidationError, match="lr"):
        Budget(lr=0)


def test_trials_in_threads_initialise_as_they_would_alone(monkeypatch: pytest.MonkeyPatch):
    """Trials in threads (executor.n_jobs) share torch's global RNG: each seeds it and builds its model
    without the other drawing in between, so a replicate's seed gives the same model as alone. The build
    here pauses between two draws, which lets the other thread reseed in the gap unless building is guarded."""
    import threading
    import time

    import explorer.train as train_module

    family = get_family("image-encoder")

    class SlowBuild:
        def __getattr__(self, name):
            return getattr(family, name)

        def build(self, dims):
            family.build(dims)
            time.sleep(0.2)
            return family.build(dims)

    monkeypatch.setattr(train_module, "get_family", lambda name: SlowBuild())
    task = get_task("digits", {})
    runs = [(IMAGE, Budget(epochs=1, max_steps=3, seed=0)), ({**IMAGE, "layers": 1}, Budget(epochs=1, max_steps=3, seed=1))]
    alone = [train("image-encoder", dims, task, budget)[0].curve for dims, budget in runs]
    together: list = [None, None]

    def one(i: int) -> None:
        dims, budget = runs[i]
        together[i] = train("image-encoder", dims, task, budget)[0].curve

    threads = [threading.Thread(target=one, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
        time.sleep(0.05)  # the second starts while the first is inside its build
    for t in threads:
        t.join()
    assert together == alone


def test_a_resume_in_another_thread_leaves_a_trial_being_initialised_alone(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Trial B resumes from a checkpoint (restoring torch's global RNG state) while trial A, in another thread,
    is seeding that RNG and drawing its model's initialisation. Before, B set the state outside the seed lock,
    in the middle of A's draws, and A's model came out different from A alone."""
    import threading
    import time

    import explorer.train as train_module

    family = get_family("image-encoder")
    task = get_task("digits", {})
    a_dims, b_dims = {**IMAGE, "layers": 1}, IMAGE
    budget = Budget(epochs=2, max_steps=6, seed=0)
    with pytest.raises(Interrupt):  # B's checkpoint after its first epoch
        run_trial("image-encoder", b_dims, task, Budget(epochs=2, seed=1), checkpoint_dir=tmp_path, device="cpu",
                  callback=lambda e, m: _raise(Interrupt))
    a_building, b_loaded, racing = threading.Event(), threading.Event(), threading.Event()

    class SlowBuild:  # A: draws half its initialisation, lets B resume meanwhile, draws the rest
        def __getattr__(self, name):
            return getattr(family, name)

        def build(self, dims):
            if dims["layers"] != a_dims["layers"]:
                return family.build(dims)
            family.build(dims)
            if racing.is_set():
                a_building.set()
                b_loaded.wait(10)
                time.sleep(0.3)  # time for B to restore the RNG state unless it waits for the seed lock
            return family.build(dims)

    load = torch.load

    def loaded(*args, **kwargs):  # B: about to restore its RNG state once A is inside its build
        a_building.wait(10)
        out = load(*args, **kwargs)
        b_loaded.set()
        return out

    monkeypatch.setattr(train_module, "get_family", lambda name: SlowBuild())
    alone = train("image-encoder", a_dims, task, budget)[0].curve
    monkeypatch.setattr(torch, "load", loaded)
    racing.set()
    together: dict[str, list] = {}
    resumed = threading.Thread(target=lambda: together.setdefault("b", run_trial(
        "image-encoder", b_dims, task, Budget(epochs=2, seed=1), checkpoint_dir=tmp_path, device="cpu").curve))
    resumed.start()
    time.sleep(0.2)  # B is past its own build (fast), waiting in its load for A
    together["a"] = train("image-encoder", a_dims, task, budget)[0].curve
    resumed.join(30)
    assert together["a"] == alone and len(together["b"]) == 2


def _raise(err: type[Exception]) -> None:
    raise err


def test_a_checkpoint_resumes_with_fewer_gpus_than_it_was_saved_with(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """A checkpoint of a 2-GPU node (every visible GPU's RNG state, as explorer saved them) resumed where one GPU
    is visible: before, restoring GPU 1's state raised IndexError (torch.cuda.default_generators[1]), the trial
    failed and its checkpoint was deleted. Now only the trial's own GPU's state is restored, on its device."""
    import explorer.checkpoints as checkpoints_module
    from explorer import checkpoints
    from explorer.steps import adamw

    task, budget = get_task("digits", {}), Budget(epochs=2, lr=3e-3)
    with pytest.raises(Interrupt):
        run_trial("image-encoder", IMAGE, task, budget, lambda e, m: _raise(Interrupt), checkpoint_dir=tmp_path, device="cpu")
    path = tmp_path / "checkpoint.pt"
    payload = torch.load(path, weights_only=True)
    states = [torch.full((16,), i, dtype=torch.uint8) for i in range(2)]
    payload["rng"]["cuda"] = states  # as saved on a node with two GPUs
    torch.save(payload, path)
    restored: list = []

    def set_rng_state(state, device="cuda"):  # one GPU visible: torch indexes its generators by the device
        index = torch.device(device).index or 0
        if index >= 1:
            raise IndexError("tuple index out of range")
        restored.append((int(state[0]), index))

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_rng_state", set_rng_state)
    monkeypatch.setattr(torch.cuda.random, "set_rng_state", set_rng_state)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda new: [set_rng_state(s, i) for i, s in enumerate(new)])
    model = get_family("image-encoder").build(IMAGE)
    optimizer = adamw(((p, p.ndim >= 2) for p in model.parameters()), budget.lr, budget.weight_decay, "cpu")  # as run_trial
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    loader = task.load(64, 0).train
    owner = {"family": "image-encoder", "dims": dict(IMAGE)}
    progress = checkpoints.load(path, owner, checkpoints.Parts(model, optimizer, scheduler, loader), "cuda:0", checkpoints_module.threading.Lock())
    assert progress["epoch"] == 1 and restored == [(0, 0)]  # the trial's own GPU's state (it was the first), on cuda:0
    assert path.exists()
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": torch.full((16,), torch.device(device).index, dtype=torch.uint8))
    checkpoints.save(path, owner, checkpoints.Parts(model, optimizer, scheduler, loader), progress, "cuda:1")
    assert int(torch.load(path, weights_only=True)["rng"]["cuda"][0]) == 1  # saved: the trial's GPU only


def test_checkpoints_are_written_as_often_as_asked(tmp_path: Path):
    task, budget = get_task("digits", {}), Budget(epochs=3, batch_size=512)
    path = tmp_path / "checkpoint.pt"
    seen: list[bool] = []
    run_trial("image-encoder", IMAGE, task, budget, lambda e, m: seen.append(path.exists()), checkpoint_dir=tmp_path, device="cpu",
              checkpoint_every_s=3600)
    assert seen == [False, False, False]  # a trial shorter than the interval writes none
    stamps: list[int] = []
    run_trial("image-encoder", IMAGE, task, budget, lambda e, m: stamps.append(path.stat().st_mtime_ns), checkpoint_dir=tmp_path,
              device="cpu", checkpoint_every_s=0)
    assert len(set(stamps)) == 3  # every epoch


def test_out_of_memory_on_a_gpu_says_what_the_trial_needed(monkeypatch: pytest.MonkeyPatch):
    import explorer.train as train_module

    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 70 * 2**30)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 71 * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: type("P", (), {"total_memory": 80 * 2**30})())
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    words = train_module._memory_needed("cuda:0", "CUDA out of memory. Tried to allocate 12.00 GiB. GPU 0 has a total capacity")
    assert words == "it needed more than 82.00 GiB of the 80.00 GiB of NVIDIA H100 80GB HBM3; "
    assert train_module._memory_needed("cpu", "anything") == ""
