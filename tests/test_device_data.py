"""In-memory tasks hand the trainer `Batches`: moved to the trial's device once, each batch gathered there,
in an order that is a function of (seed, epoch) alone, the same as the DataLoader path gave."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from explorer.device_data import Batches, Tensors, epoch_order
from explorer.tasks import EpochBatches, get_task
from explorer.tasks.text_file import Windows

LISTOPS = {"n_train": 64, "n_eval": 16, "min_length": 8, "max_length": 32}


def test_batches_are_gathered_on_the_device_the_data_moved_to(tmp_path: Path) -> None:
    """The `meta` device stands in for a GPU: a batch built on the CPU and copied would come out on the CPU."""
    (tmp_path / "t.txt").write_text("abcdefgh" * 40)
    tasks = [get_task("digits", {}), get_task("listops", LISTOPS), get_task("text-file", {"path": str(tmp_path / "t.txt"), "seq_len": 8})]
    for task in tasks:
        data = task.load(16, seed=0).to("meta")
        for loader in (data.train, data.eval):
            assert isinstance(loader, Batches) and loader.dataset.device == torch.device("meta")
            batches = list(loader)
            assert len(batches) == len(loader) and all(t.device == torch.device("meta") for b in batches for t in b)
            assert sum(len(y) for _, y in batches) == len(loader.dataset)


def test_order_is_the_samplers_and_does_not_depend_on_the_device() -> None:
    x, y = torch.arange(100).float()[:, None], torch.arange(100)
    batches = Batches(Tensors(x, y), 32, shuffle=True, seed=5)
    sampler = EpochBatches(100, 32, shuffle=True, seed=5)
    for epoch in range(3):
        assert [b[1].tolist() for b in batches] == list(sampler)  # what the DataLoader path fetched, batch by batch
    batches.set_epoch(1)
    assert torch.equal(torch.cat([b for _, b in batches]), epoch_order(100, True, 5, 1))
    moved = Batches(Tensors(x, y), 32, shuffle=True, seed=5).to("meta")
    assert torch.equal(moved.order(2), batches.order(2))  # drawn on the CPU whatever the device


def test_a_task_moves_each_tensor_once_per_trial(monkeypatch: pytest.MonkeyPatch) -> None:
    from explorer.train import Budget, run_trial

    moves: list[str] = []
    real = Tensors.to
    monkeypatch.setattr(Tensors, "to", lambda self, device: moves.append(str(device)) or real(self, device))
    task = get_task("listops", LISTOPS)
    run_trial("sequence-classifier", dict(layers=1, heads=2, width=16, mlp=32, **task.dims()), task,
              Budget(epochs=2, batch_size=16), device="cpu")
    assert moves == ["cpu", "cpu"]  # the train split and the eval split, once each for 2 epochs of 4 steps


def test_windows_gather_on_their_device_and_compare_by_value() -> None:
    tokens = torch.arange(50, dtype=torch.uint8)
    windows = Windows(tokens, seq_len=4, stride=4)
    x, y = windows[torch.tensor([[0, 1], [2, 3]])]  # a (seeds, batch) index gives (seeds, batch, seq_len)
    assert x.shape == (2, 2, 4) and x.dtype == torch.long and torch.equal(x[..., 1:], y[..., :-1])
    assert windows.to("meta")[torch.tensor([0])][0].device == torch.device("meta")
    assert windows.same(Windows(tokens.clone(), 4, 4)) and not windows.same(Windows(tokens, 4, 2))
    assert not Tensors(torch.zeros(3)).same(Tensors(torch.ones(3)))
