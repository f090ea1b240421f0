"""In-memory data on the trial's device: moved there once, each batch one gather where it lives.

A small model is launch-bound: gathering a batch on the CPU and copying it to the GPU every step costs
more than the step's kernels. Tasks whose data fit in memory (digits, ListOps, a CSV of texts, a text
file's tokens) hand the trainer `Batches` instead of a DataLoader; `to(device)` moves the tensors once
per trial, and each epoch's order is a permutation drawn on the CPU from (seed, epoch) alone and
moved once per epoch. So the order is the same on every device and after a resume (like
`DistributedSampler.set_epoch`), and on the CPU a trial trains on exactly the batches it did before.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import torch


def epoch_order(n: int, shuffle: bool, seed: int, epoch: int) -> torch.Tensor:
    """The CPU permutation of `range(n)` for `epoch`: a function of (seed, epoch) alone."""
    if not shuffle:
        return torch.arange(n)
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))


class Indexed(Protocol):
    """Samples gathered by a tensor of indices (of any shape), movable to a device."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: torch.Tensor) -> tuple[torch.Tensor, ...]: ...

    @property
    def device(self) -> torch.device: ...

    def to(self, device: str | torch.device) -> Indexed: ...

    def same(self, other: object) -> bool:
        """Whether `other` holds the same samples (the seeds of a task share one copy on the device)."""
        ...


class Tensors:
    """Aligned tensors (x, y): `tensors[index]` gathers the same rows of each."""

    def __init__(self, *tensors: torch.Tensor):
        if len({len(t) for t in tensors}) != 1:
            raise ValueError(f"tensors of different lengths: {[len(t) for t in tensors]}")
        self.tensors = tensors

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitem__(self, index: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(t[index] for t in self.tensors)

    @property
    def device(self) -> torch.device:
        return self.tensors[0].device

    def to(self, device: str | torch.device) -> Tensors:
        return Tensors(*(t.to(device) for t in self.tensors))

    def same(self, other: object) -> bool:
        return isinstance(other, Tensors) and len(other.tensors) == len(self.tensors) and all(
            same_tensor(a, b) for a, b in zip(self.tensors, other.tensors))


class Batches:
    """Batches of `data` (`.dataset`, as a DataLoader names it) in the epoch's order, gathered where it lives.

    Loader-like for the trainer: `len` is the number of batches, iterating runs one epoch and
    advances to the next, `set_epoch` picks one. The last batch of an epoch is ragged when
    `batch_size` does not divide the data (every sample is seen every epoch).
    """

    def __init__(self, data: Indexed, batch_size: int, shuffle: bool, seed: int = 0):
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.dataset, self.batch_size, self.shuffle, self.seed = data, batch_size, shuffle, seed
        self.epoch = 0

    def __len__(self) -> int:
        return -(-len(self.dataset) // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def to(self, device: str | torch.device) -> Batches:
        moved = Batches(self.dataset.to(device), self.batch_size, self.shuffle, self.seed)
        moved.epoch = self.epoch
        return moved

    def order(self, epoch: int, device: str | torch.device | None = None) -> torch.Tensor:
        """The epoch's sample order, on `device` (one copy of n indices)."""
        return epoch_order(len(self.dataset), self.shuffle, self.seed, epoch).to(device or "cpu")

    def slices(self) -> list[slice]:
        """Each batch's positions in the epoch's order."""
        n = len(self.dataset)
        return [slice(start, min(start + self.batch_size, n)) for start in range(0, n, self.batch_size)]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        order = self.order(self.epoch, self.dataset.device)
        self.epoch += 1
        for part in self.slices():
            yield self.dataset[order[part]]


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal tensors: the same memory (a cached data set), or else the same values."""
    if (a.data_ptr(), a.shape, a.stride(), a.dtype, a.device) == (b.data_ptr(), b.shape, b.stride(), b.dtype, b.device):
        return True
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    b = b.to(a.device)
    return torch.allclose(a, b, rtol=0, atol=0, equal_nan=True) if a.is_floating_point() else torch.equal(a, b)
