"""Executors run a study's trials and record them in its Optuna storage (the interface: base.py).

`prepare(study)` resolves the devices the trials will train on (explorer.executors.devices) before the
storage is opened, so a device that cannot be had is one line with nothing written; `run(study,
optuna_study, on_trial)` runs the trials. `local` runs trials in this process; `ray` runs them through
Ray Tune (the only modules that import Ray are `ray_tune.py` and `ray_bridge.py`). `seedgroups` lets a
local worker train its configuration's queued seeds with its trial, as one model.
"""

from __future__ import annotations

from explorer.executors.base import Executor, TrialCallback

__all__ = ["Executor", "TrialCallback", "get_executor"]


def get_executor(name: str) -> Executor:
    if name == "ray":
        from explorer.executors.ray_tune import RayExecutor  # Ray is imported only when asked for

        return RayExecutor()
    from explorer.executors.local import LocalExecutor

    return LocalExecutor()
