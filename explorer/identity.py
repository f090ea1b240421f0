"""Which stored trials answer a study's current question.

A study's identity is what changes its results (space, task, budget, objectives: `Study.identity`).
`run --force` continues a study whose identity changed; its older trials then answer another question
(5 epochs against 1), so every trial records the identity it ran under, and summaries, replicates,
queues, samplers and pruners read only the trials of the identity the storage holds now. A trial
stored before trials recorded it counts as current: nothing says otherwise.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import optuna
import pandas as pd


def identity_key(identity: dict[str, Any]) -> str:
    """A short, stable name for an identity (what trials store)."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:12]


def current_key(ostudy: optuna.Study) -> str | None:
    """The key of the identity the storage holds now (None before the study recorded one)."""
    stored = ostudy.user_attrs.get("identity")
    return identity_key(stored) if stored else None


def is_current(t: optuna.trial.FrozenTrial, key: str | None) -> bool:
    return key is None or t.user_attrs.get("identity", key) == key


def current_trials(ostudy: optuna.Study, states: tuple[optuna.trial.TrialState, ...] | None = None) -> list[optuna.trial.FrozenTrial]:
    """The study's trials that ran (or will run) under its current identity."""
    key = current_key(ostudy)
    return [t for t in ostudy.get_trials(deepcopy=False, states=states) if is_current(t, key)]


def current_rows(frame: pd.DataFrame, ostudy: optuna.Study) -> pd.DataFrame:
    """The rows of a `trials_frame` of `ostudy` that ran under its current identity."""
    key = current_key(ostudy)
    if key is None or "identity" not in frame:
        return frame
    return frame[frame["identity"].isna() | (frame["identity"] == key)].reset_index(drop=True)
