"""Seed batching (explorer.seedbatch): seeds trained as one vmapped model end where each would alone.

Equal within float tolerance to `run_trial` one seed at a time: the same final weights (read where both
measure κ on the trained model), curves, metrics and κ, on each family kind (image, sequence with
padding masks, causal LM), with gradient clipping that binds and a ragged last batch. A seed that
fails or is pruned leaves the others as they would be alone."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch
from conftest import assert_within_rounding
from torch import nn

from explorer import seedbatch, steps, train
from explorer.device_data import Tensors
from explorer.errors import TrialFailed
from explorer.seedbatch import NotBatchable, run_seeds, worth_batching
from explorer.tasks import Task, TaskData, batch_loader, get_task
from explorer.tasks.digits import Digits
from explorer.train import Budget, TrialResult, run_trial

IMAGE = dict(layers=2, heads=4, width=32, mlp=64, img_size=8, patch=2, in_chans=1, num_classes=10)
SEEDS = [0, 1, 2]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def final_weights(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, torch.Tensor]]:
    """The trained models' weights, in order: both trainers measure κ on each trained model last."""
    seen: list[dict[str, torch.Tensor]] = []
    for module in (train, seedbatch):
        real = module.attention_condition

        def spy(model: nn.Module, probe: torch.Tensor, real: Callable = real) -> Any:
            seen.append({k: v.detach().clone() for k, v in model.state_dict().items()})
            return real(model, probe)

        monkeypatch.setattr(module, "attention_condition", spy)
    return seen


def alone_and_together(family: str, dims: dict, task: Task, budget: Budget, weights: list, seeds: Sequence[int] = SEEDS,
                       **kwargs: Any) -> tuple[list[TrialResult], list, list, list]:
    weights.clear()
    alone = [run_trial(family, dims, task, budget.model_copy(update={"seed": s}), device="cpu") for s in seeds]
    alone_weights = weights[1::2]  # κ at initialisation, then after training, per trial
    weights.clear()
    together = run_seeds(family, dims, task, budget, seeds, device="cpu", **kwargs)
    return alone, together, alone_weights, weights[-len(together):]


def assert_same(a: TrialResult, b: TrialResult, wa: dict, wb: dict, examples: int | None = None) -> None:
    """Within float32 rounding (vmapped matmuls sum in another order), an accuracy within one of `examples`."""
    assert b.steps == a.steps and b.params == a.params and b.seed_batch == len(SEEDS) and a.seed_batch == 1
    assert_within_rounding(a, b, 1e-5, examples)
    assert [k["kappa"] for k in b.kappa_init] == pytest.approx([k["kappa"] for k in a.kappa_init], rel=1e-4)
    assert [k["kappa"] for k in b.kappa_final] == pytest.approx([k["kappa"] for k in a.kappa_final], rel=1e-2)
    assert wb.keys() == wa.keys()
    for name in wa:  # atol: the key bias's gradient is float noise (softmax ignores it), which AdamW normalises
        assert torch.allclose(wb[name], wa[name], rtol=1e-4, atol=2e-5), name


def test_image_encoder_seeds_together_end_where_each_ends_alone(final_weights: list) -> None:
    # clipping at 0.05 binds on some steps of some seeds only: each seed must be clipped by its own norm
    budget = Budget(epochs=2, batch_size=100, lr=3e-3, grad_clip=0.05)  # 1437 images: a ragged batch of 37
    alone, together, wa, wb = alone_and_together("image-encoder", IMAGE, get_task("digits", {}), budget, final_weights)
    for a, b, x, y in zip(alone, together, wa, wb, strict=True):
        assert_same(a, b, x, y, examples=360)
    assert len({r.metrics["train_loss"] for r in together}) == len(SEEDS)  # three different runs


def test_sequence_and_lm_seeds_together_end_where_each_ends_alone(final_weights: list, tmp_path: Path) -> None:
    listops = get_task("listops", {"n_train": 200, "n_eval": 50, "min_length": 8, "max_length": 32})
    budget = Budget(epochs=2, batch_size=32, lr=3e-3, grad_clip=0.1)
    dims = dict(layers=1, heads=2, width=32, mlp=64, **listops.dims())  # padded keys masked in attention
    for a, b, x, y in zip(*alone_and_together("sequence-classifier", dims, listops, budget, final_weights), strict=True):
        assert_same(a, b, x, y, examples=50)
    (tmp_path / "t.txt").write_text("".join(f"the cat {w} sat on mat {i % 7}. " for i, w in enumerate(["red", "old"] * 40)))
    text = get_task("text-file", {"path": str(tmp_path / "t.txt"), "seq_len": 16})
    dims = dict(layers=1, heads=2, width=32, mlp=64, **text.dims())
    for a, b, x, y in zip(*alone_and_together("causal-lm", dims, text, budget, final_weights), strict=True):
        assert_same(a, b, x, y)
        assert b.metrics["perplexity"] == pytest.approx(a.metrics["perplexity"], rel=1e-5)


def test_graphed_group_matches_the_eager_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(steps, "_cuda_capture", lambda step, static: lambda: step(*static))
    monkeypatch.setattr(steps, "_cuda_side_stream", contextlib.nullcontext)
    monkeypatch.setattr(seedbatch, "compile_used", lambda mode, device: mode)
    budget = Budget(epochs=2, batch_size=100, lr=3e-3, grad_clip=0.05)
    task = get_task("digits", {})
    eager = run_seeds("image-encoder", IMAGE, task, budget, [0, 1], device="cpu")
    graphed = run_seeds("image-encoder", IMAGE, task, budget.model_copy(update={"compile": "cudagraphs"}), [0, 1], device="cpu")
    assert graphed[0].compile == "cudagraphs"
    with monkeypatch.context() as patch:  # AdamW reads its rate from a float32 tensor when graphed
        patch.setattr(seedbatch, "adamw", lambda *args, graphs=False: steps.adamw(*args, graphs=True))
        same_optimizer = run_seeds("image-encoder", IMAGE, task, budget, [0, 1], device="cpu")
    for g, s, e in zip(graphed, same_optimizer, eager, strict=True):
        assert g.metrics == s.metrics and g.curve == s.curve  # the same operations in the same order: bit for bit
        assert_within_rounding(e, g, 1e-5, 360)  # the eager group's float64 step sizes: within rounding


class Poisoned(Digits):
    """Digits with one train image made of NaNs: a seed fails at the step that first draws it."""

    def __init__(self, poisoned: int):
        super().__init__(Digits.Options())
        self.poisoned = poisoned

    def load(self, batch_size: int, seed: int) -> TaskData:
        data = super().load(batch_size, seed)
        x, y = data.train.dataset.tensors
        x = x.clone()
        x[self.poisoned] = float("nan")
        return TaskData(train=batch_loader(Tensors(x, y), batch_size, True, seed), eval=data.eval)


def test_a_seed_that_fails_fails_as_alone_and_the_others_go_on() -> None:
    first_of_seed_0 = int(get_task("digits", {}).load(64, 0).train.order(0)[0])
    task, budget = Poisoned(first_of_seed_0), Budget(max_steps=3, batch_size=64, lr=3e-3)
    alone = []
    for s in SEEDS:
        try:
            alone.append(run_trial("image-encoder", IMAGE, task, budget.model_copy(update={"seed": s}), device="cpu"))
        except TrialFailed as err:
            alone.append(err)
    together = run_seeds("image-encoder", IMAGE, task, budget, SEEDS, device="cpu")
    assert isinstance(alone[0], TrialFailed) and str(alone[0]) == "loss is nan at step 1"
    assert not all(isinstance(a, TrialFailed) for a in alone)  # some seed never draws the image in 3 steps
    for a, b in zip(alone, together, strict=True):
        assert type(a) is type(b)
        if isinstance(a, TrialFailed):
            assert str(b) == str(a)
        else:
            assert_within_rounding(a, b, 1e-5, 360)


def test_a_pruned_seed_stops_reporting_and_the_others_go_on() -> None:
    reports: dict[int, list[int]] = {s: [] for s in SEEDS}

    def callback(seed: int) -> Callable[[int, dict[str, float]], None]:
        def report(epoch: int, metrics: dict[str, float]) -> None:
            reports[seed].append(epoch)
            if seed == 1:
                raise optuna.TrialPruned("pruned at epoch 1")
        return report

    out = run_seeds("image-encoder", IMAGE, get_task("digits", {}), Budget(epochs=2, batch_size=128), SEEDS,
                    callbacks=[callback(s) for s in SEEDS], device="cpu")
    assert isinstance(out[1], optuna.TrialPruned) and reports == {0: [0, 1], 1: [0], 2: [0, 1]}
    assert all(isinstance(out[i], TrialResult) and len(out[i].curve) == 2 for i in (0, 2))


class LazyDigits(Digits):
    def load(self, batch_size: int, seed: int) -> TaskData:
        data = super().load(batch_size, seed)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*data.train.dataset.tensors), batch_size)
        return TaskData(train=loader, eval=data.eval)


class SeededSplit(Digits):
    """A task whose data depend on the seed: the seeds share no data set to gather from."""

    def load(self, batch_size: int, seed: int) -> TaskData:
        data = super().load(batch_size, seed)
        x, y = data.train.dataset.tensors
        return TaskData(train=batch_loader(Tensors(x[seed:], y[seed:]), batch_size, True, seed), eval=data.eval)


def test_what_cannot_train_as_one_model_says_why_before_training(monkeypatch: pytest.MonkeyPatch) -> None:
    digits = get_task("digits", {})
    cases = [
        (digits, Budget(time_limit_s=60), "wall-clock limit"),
        (LazyDigits(Digits.Options()), Budget(), "DataLoader"),
        (SeededSplit(Digits.Options()), Budget(), "do not share one data set"),
    ]
    for task, budget, reason in cases:
        with pytest.raises(NotBatchable, match=reason):
            run_seeds("image-encoder", IMAGE, task, budget, [0, 1], device="cpu")
    real = seedbatch.build_model
    monkeypatch.setattr(seedbatch, "build_model", lambda *a: nn.Sequential(real(*a), nn.Dropout(0.1)))
    with pytest.raises(NotBatchable, match="draws random numbers"):
        run_seeds("image-encoder", IMAGE, digits, Budget(), [0, 1], device="cpu")
    monkeypatch.setattr(seedbatch, "build_model", lambda *a: nn.Sequential(real(*a), nn.BatchNorm1d(10)))
    with pytest.raises(NotBatchable, match="running statistics"):
        run_seeds("image-encoder", IMAGE, digits, Budget(), [0, 1], device="cpu")


def test_batching_is_chosen_by_a_measurement_on_the_device_and_never_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    digits, probes = get_task("digits", {}), []

    def probe(family: str, dims: dict, task: Task, budget: Budget, n: int, device: str) -> tuple[float, float]:
        probes.append((n, device))
        return (1.0, 2.5) if device == "cuda:0" else (1.0, 3.5)  # seconds a step: alone, n together

    monkeypatch.setattr(seedbatch, "probe", probe)
    monkeypatch.setattr(seedbatch, "_CHOICES", {})
    assert not worth_batching("image-encoder", IMAGE, digits, Budget(), 3, "cpu")  # the stated rule: no probe
    assert worth_batching("image-encoder", IMAGE, digits, Budget(), 3, "cuda:0")  # 2.5 s for 3 < 3 x 1 s
    assert worth_batching("image-encoder", IMAGE, digits, Budget(), 3, "cuda:0")  # measured once
    assert not worth_batching("image-encoder", IMAGE, digits, Budget(), 3, "cuda:1")  # 3.5 s for 3: slower
    assert probes == [(3, "cuda:0"), (3, "cuda:1")]
    assert worth_batching("image-encoder", IMAGE, digits, Budget(seed_batch="on"), 2, "cpu")
    assert not worth_batching("image-encoder", IMAGE, digits, Budget(seed_batch="off"), 3, "cuda:0")
    assert not worth_batching("image-encoder", IMAGE, digits, Budget(seed_batch="on"), 1, "cuda:0")


def test_the_probe_times_both_ways_on_real_steps() -> None:
    alone, together = seedbatch.probe("image-encoder", IMAGE, get_task("digits", {}), Budget(), 2, "cpu", steps=2)
    assert 0 < alone and 0 < together


def test_tensors_of_one_cached_task_are_shared_not_copied() -> None:
    a, b = (get_task("digits", {}).load(64, s).train.dataset for s in (0, 1))
    assert isinstance(a, Tensors) and a.same(b) and a.tensors[0] is b.tensors[0]
