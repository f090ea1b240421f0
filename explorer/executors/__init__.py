"""Executors run a study's trials and record them in its Optuna storage.

One narrow interface, like Optuna's samplers: `run(study, optuna_study, on_trial)`. `local` runs
trials in this process; `ray` runs them through Ray Tune (the only module that imports Ray).
`seedgroups` lets a local worker train its configuration's queued seeds with its trial, as one model.
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
        """Run trials until `study.queue.remaining(ostudy)` is 0, recording each in `ostudy`'s storage."""


def get_executor(name: str) -> Executor:
    if name == "ray":
        from explorer.executors.ray_tune import RayExecutor  # Ray is imported only when asked for

        return RayExecutor()
    from explorer.executors.local import LocalExecutor

    return LocalExecutor()
