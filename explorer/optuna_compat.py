"""Optuna's private names: every use in explorer and its benches, in one module on the bottom floor.

Each is looked up when a feature needs it, never at import, and a missing one says which feature it
breaks and which Optuna versions explorer is tested with; so an Optuna release that renames one breaks
that feature with one line, not `import explorer`. This module imports nothing of explorer's but its
errors, so the study package and `pareto.py` both use it downward.
"""

from __future__ import annotations

import functools
from typing import Any

import optuna

from explorer.errors import ExplorerError


def _private(owner: Any, name: str, feature: str) -> Any:
    try:
        return getattr(owner, name)
    except AttributeError:
        raise ExplorerError(f"{feature} needs Optuna's private {name!r}, which Optuna {optuna.__version__} "
                            "does not have (explorer is tested with Optuna 4 and 5)") from None


def storage_of(ostudy: optuna.Study) -> optuna.storages.BaseStorage:
    """The storage an Optuna study writes to (no public accessor): heartbeats and trial records by id."""
    return _private(ostudy, "_storage", "reaching a study's storage")


def backend_of(storage: optuna.storages.BaseStorage) -> optuna.storages.BaseStorage:
    """The RDB storage behind Optuna's cache in front of it (the storage itself when there is none)."""
    return getattr(storage, "_backend", storage)


def trial_storage_id(trial: optuna.Trial | optuna.trial.FrozenTrial) -> int:
    """A trial's id in its storage (Optuna's public API numbers trials per study; the storage's calls take ids)."""
    return _private(trial, "_trial_id", "recording a trial by its storage id")


def heartbeat_base() -> type:
    """Optuna's heartbeat interface (`fail_stale_trials` and `optimize` use a storage that implements it)."""
    import optuna.storages._heartbeat as hb

    return _private(hb, "BaseHeartbeat", "heartbeats on a journal file")


def hypervolume(loss_points: Any, reference: Any) -> float:
    """Optuna's exact hypervolume (WFG) of points to minimise, against a reference point."""
    import optuna._hypervolume as hv

    return float(_private(hv, "compute_hypervolume", "the hypervolume")(loss_points, reference))


def pareto_mask(loss_points: Any) -> Any:
    """Optuna's own non-dominated mask of points to minimise (bench/pareto.py compares explorer's with it)."""
    import optuna.study._multi_objective as mo

    return _private(mo, "_is_pareto_front", "Optuna's Pareto mask")(loss_points, assume_unique_lexsorted=False)


def rdb_models() -> Any:
    """Optuna's SQLAlchemy table models (bench/dashboard.py writes large synthetic studies with them)."""
    import optuna.storages._rdb as rdb

    return _private(rdb, "models", "writing trial rows directly")


def pop_waiting(ostudy: optuna.Study) -> int | None:
    """Claim the first queued trial atomically, as `ask()` does first; its storage id, or None when none
    waits (tests use it to play a worker that dies right after its claim)."""
    return _private(ostudy, "_pop_waiting_trial_id", "claiming a queued trial")()


@functools.cache
def rdb_private_readers() -> tuple[str, ...]:
    """RDBStorage's private methods that only read (what Optuna's cache calls): explorer's SQLite storage
    lets them read without the write lock. A reader Optuna renamed is left out: it then takes the write
    lock, slower but correct."""
    names = ("_get_stale_trial_ids", "_get_trials", "_get_best_trial_id")
    return tuple(n for n in names if hasattr(optuna.storages.RDBStorage, n))


def study_user_attrs(ostudy: optuna.Study) -> dict[str, Any]:
    """The study's user attrs as its storage holds them, to read only (`Study.user_attrs` deep-copies them all,
    the study's space and spec included, on every read)."""
    return storage_of(ostudy).get_study_user_attrs(_private(ostudy, "_study_id", "reading a study's attributes"))
