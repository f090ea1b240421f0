"""Executors run a study's trials and record them in its Optuna storage.

One narrow interface, like Optuna's samplers: `prepare(study)` resolves the devices the trials will
train on (explorer.executors.devices) before the storage is opened, so a device that cannot be had is
one line with nothing written; `run(study, optuna_study, on_trial)` runs the trials. `local` runs
trials in this process; `ray` runs them through Ray Tune (the only modules that import Ray are
`ray_tune.py` and `ray_bridge.py`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING

import optuna

from explorer.study import Study

if TYPE_CHECKING:
    from explorer.executors.devices import Execution

TrialCallback = Callable[[optuna.Study, optuna.trial.FrozenTrial], None]


class Executor(ABC):
    execution: Execution | None = None  # what `prepare` resolved

    @abstractmethod
    def prepare(self, study: Study) -> Execution:
        """Resolve the devices `study`'s trials train on (and how many at once); one line if they cannot be had."""

    @abstractmethod
    def run(self, study: Study, ostudy: optuna.Study, on_trial: TrialCallback | None = None) -> None:
        """Run trials until `study.queue.remaining(ostudy)` is 0, recording each in `ostudy`'s storage."""

    def settle(self, study: Study, ostudy: optuna.Study, force: bool = False) -> Execution:
        """The run's `Execution`, its class recorded on the study (or refused: explorer.executors.devices.settle_class)."""
        from explorer.executors.devices import settle_class

        execution = self.execution or self.prepare(study)
        settle_class(study, ostudy, execution, force)
        return execution


def get_executor(name: str) -> Executor:
    if name == "ray":
        from explorer.executors.ray_tune import RayExecutor  # Ray is imported only when asked for

        return RayExecutor()
    from explorer.executors.local import LocalExecutor

    return LocalExecutor()
