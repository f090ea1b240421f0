"""The executor interface: resolve the devices a study's trials train on, then run the trials and record
them in its Optuna storage. One narrow interface, like Optuna's samplers.
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
# after each epoch of a trial: (study, the trial's storage id, the epoch counted from 1, its metrics); trackers use it
EpochCallback = Callable[[optuna.Study, int, int, dict[str, float]], None]


class Executor(ABC):
    execution: Execution | None = None  # what `prepare` resolved

    @abstractmethod
    def prepare(self, study: Study) -> Execution:
        """Resolve the devices `study`'s trials train on (and how many at once); one line if they cannot be had."""

    @abstractmethod
    def run(self, study: Study, ostudy: optuna.Study, on_trial: TrialCallback | None = None,
            on_epoch: EpochCallback | None = None) -> None:
        """Run trials until none is left to start and none runs, recording each in `ostudy`'s storage; `on_trial`
        after each trial ends, `on_epoch` after each epoch of one (in the process that records it)."""

    def settle(self, study: Study, ostudy: optuna.Study, force: bool = False) -> Execution:
        """The run's `Execution`, its class recorded on the study (or refused: explorer.executors.devices.settle_class)."""
        from explorer.executors.devices import settle_class

        execution = self.execution or self.prepare(study)
        settle_class(study, ostudy, execution, force)
        return execution
