"""Executors run a study's trials and record them in its Optuna storage (the interface: base.py).

`local` runs trials in this process; `ray` runs them through Ray Tune (the only module that imports Ray).
`seedgroups` lets a local worker train its configuration's queued seeds with its trial, as one model.
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
