"""The executor interface: run a study's trials and record them in its Optuna storage.

One narrow interface, like Optuna's samplers: `run(study, optuna_study, on_trial)`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import optuna

from explorer.study import Study

TrialCallback = Callable[[optuna.Study, optuna.trial.FrozenTrial], None]


class Executor(ABC):
    @abstractmethod
    def run(self, study: Study, ostudy: optuna.Study, on_trial: TrialCallback | None = None) -> None:
        """Run trials until none is left to start and none runs, recording each in `ostudy`'s storage."""
