"""Data tasks by name: what a trial trains on, how it is split, and which metric judges it.

A task is configured by the study YAML's `task:` mapping (its `name` picks the task, the rest are
the task's validated `Options`). `dims()` tells the search space what the data fixes (image size,
vocabulary, classes) without loading it; `load(batch_size, seed)` gives train/eval loaders whose
batches are `(x, y)` tensors: `Batches` for data held in memory (moved to the trial's device once,
explorer.device_data), a DataLoader for data read lazily. Adding a task is one new module in this package that calls `register`;
a task in the user's own package arrives as a plugin (`explorer.plugins`: an `explorer.tasks` entry
point, or `module:Class` as the task's name in the study YAML).
"""

from __future__ import annotations

import importlib
import pkgutil
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ValidationError

from explorer import plugins
from explorer.errors import ExplorerError
from explorer.yamlio import validation_error

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from explorer.budget import Budget
    from explorer.result import TrialResult
    from explorer.tasks._data import TaskData

Modality = Literal["image", "sequence", "lm"]

_REGISTRY: dict[str, type["Task"]] = {}


class Task(ABC):
    """A data set with a fixed train/eval split and a metric.

    `source` is the file the options came from, so that errors found later (a missing directory, a
    file too short) still name it.
    """

    name: ClassVar[str]
    modality: ClassVar[Modality]
    metric: ClassVar[str]  # "accuracy" (classification) | "eval_loss" (language modelling)
    higher_is_better: ClassVar[bool]
    Options: ClassVar[type[BaseModel]]
    trains_itself: ClassVar[bool] = False  # trials train with the task's own `run_trial`, not explorer.train's

    def __init__(self, options: BaseModel, source: str | None = None):
        self.options = options
        self.source = source

    def error(self, message: str, field: str | None = None) -> ExplorerError:
        """An ExplorerError about this task's options, e.g. `error("not found", "root")`."""
        return ExplorerError(message, source=self.source, field=f"task.{field}" if field else "task")

    @abstractmethod
    def dims(self) -> dict[str, Any]:
        """The model dims the data fixes; cheap (no full data load).

        image: {img_size, in_chans, num_classes}; sequence: {vocab, seq_len, num_classes};
        lm: {vocab, seq_len}.
        """

    @abstractmethod
    def load(self, batch_size: int, seed: int) -> TaskData:
        """Train/eval loaders; the same `seed` gives the same batches in the same order."""

    def run_trial(self, family: str, dims: dict[str, Any], budget: Budget, *, callback: Callable[[int, dict[str, float]], None] | None,
                  checkpoint_dir: Path | None, device: str | None, checkpoint_every_s: float) -> TrialResult:
        """One trial the task's own way, where `trains_itself` (explorer.train.run_trial's arguments and
        result; it reports each epoch to `callback` and resumes from `checkpoint_dir`): a stand-in that
        needs no torch (bench/standin.py: the simulated cluster of bench/cluster.py), or a model outside torch."""
        raise NotImplementedError(f"task {self.name} trains with explorer.train (trains_itself is False)")


def register(task_cls: type[Task]) -> type[Task]:
    """Class decorator: make a task available by its `name`."""
    if task_cls.name in _REGISTRY:
        raise ValueError(f"task {task_cls.name!r} registered twice")
    _REGISTRY[task_cls.name] = task_cls
    return task_cls


def _load_all() -> None:
    for mod in pkgutil.iter_modules(__path__):
        if not mod.name.startswith("_"):
            importlib.import_module(f"{__name__}.{mod.name}")


def task_names() -> list[str]:
    """Registered tasks and those installed packages offer through entry points (a `module:Class` a study
    named, loaded since, is no name of the registry's)."""
    _load_all()
    return sorted({*(n for n in _REGISTRY if not plugins.is_reference(n)), *plugins.entry_point_names("task")})


def get_task(name: str, options: dict[str, Any] | None = None, source: str | None = None) -> Task:
    """The task `name` configured by `options` (the YAML `task:` mapping without `name`).

    An unknown name or a bad option is an ExplorerError naming `source` and the field.
    """
    _load_all()
    if name not in _REGISTRY:
        try:
            plugin = plugins.load("task", name, Task)
        except ExplorerError as err:
            raise ExplorerError(str(err), source=source, field="task.name") from None
        if plugin is None:
            raise ExplorerError(f"unknown task {name!r}; known: {', '.join(task_names())} (or a plugin's module:Class)",
                                source=source, field="task.name")
        _REGISTRY[name] = plugin
    task_cls = _REGISTRY[name]
    try:
        opts = task_cls.Options.model_validate(dict(options or {}))
    except ValidationError as err:
        raise validation_error(err, source or "", prefix="task", model=task_cls.Options) from None
    return task_cls(opts, source=source)


_DATA = ("EpochBatches", "Loader", "TaskData", "batch_loader", "tensor_data")


def __getattr__(name: str) -> Any:
    """The data side (`TaskData`, `tensor_data`, ...) loads with torch on first use: reading a study
    (`explorer status`) needs a task's metric and options, never its data."""
    if name in _DATA:
        from explorer.tasks import _data

        return getattr(_data, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
