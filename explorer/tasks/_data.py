"""The data side of a task: the loaders a trial trains on (explorer.tasks re-exports these names)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Sampler

from explorer.device_data import Batches, Indexed, Tensors, epoch_order

Loader = Batches | DataLoader


@dataclass(frozen=True)
class TaskData:
    """Loaders for one trial. Batches are `(x, y)`; the train loader reshuffles every epoch."""

    train: Loader
    eval: Loader

    def to(self, device: str | torch.device) -> TaskData:
        """In-memory batches moved to `device` once; a DataLoader's batches are copied as they come."""
        return TaskData(*(part.to(device) if isinstance(part, Batches) else part for part in (self.train, self.eval)))


class EpochBatches(Sampler[list[int]]):
    """Batches of indices, reshuffled each epoch from `(seed, epoch)` alone.

    Like `DistributedSampler.set_epoch`: the order of epoch k does not depend on how many epochs ran
    in this process, so a trial resumed from a checkpoint sees the same batches it would have seen.
    Each iteration advances the epoch; `set_epoch` sets it explicitly.
    """

    def __init__(self, n: int, batch_size: int, shuffle: bool, seed: int = 0):
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.n, self.batch_size, self.shuffle, self.seed = n, batch_size, shuffle, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return -(-self.n // self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        order = epoch_order(self.n, self.shuffle, self.seed, self.epoch)
        self.epoch += 1
        for start in range(0, self.n, self.batch_size):
            yield order[start : start + self.batch_size].tolist()


def batch_loader(data: Indexed, batch_size: int, shuffle: bool, seed: int = 0) -> Batches:
    """Batches of an in-memory data set, each fetched with one gather by a tensor of indices.

    No per-sample collation, no worker processes, no DataLoader: an epoch of digits costs
    milliseconds, and on a GPU the data stays there (explorer.device_data).
    """
    return Batches(data, batch_size, shuffle, seed)


def tensor_data(
    train: Sequence[torch.Tensor], eval: Sequence[torch.Tensor], batch_size: int, seed: int
) -> TaskData:
    """TaskData over in-memory `(x, y)` tensors: train shuffled by `seed`, eval in order."""
    return TaskData(
        train=batch_loader(Tensors(*train), batch_size, shuffle=True, seed=seed),
        eval=batch_loader(Tensors(*eval), batch_size, shuffle=False),
    )
