"""Which stored trials answer a study's current question.

A study's identity is what changes its results (space, task, budget, objectives: `Study.identity`).
`run --force` continues a study whose identity changed; its older trials then answer another question
(5 epochs against 1), so every trial records the identity it ran under, and summaries, replicates,
queues, samplers and pruners read only the trials of the identity the storage holds now. A trial
that ran before trials recorded it belongs to the identity the study had then: `run --force` records
that one as the study's `legacy_identity`, and until a force it is the current one. A queued trial
records none until a worker takes it: it answers whatever the study asks when it runs.
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


def is_current(t: optuna.trial.FrozenTrial, key: str | None, legacy: str | None = None) -> bool:
    """Whether trial `t` answers the identity `key`; `legacy` is the identity of trials that recorded none."""
    if key is None or t.state == optuna.trial.TrialState.WAITING and "identity" not in t.user_attrs:
        return True
    return t.user_attrs.get("identity", legacy or key) == key


def legacy_key(ostudy: optuna.Study) -> str | None:
    """The identity that trials stored without one ran under, once `run --force` changed it (else None)."""
    return ostudy.user_attrs.get("legacy_identity")


def current_trials(ostudy: optuna.Study, states: tuple[optuna.trial.TrialState, ...] | None = None) -> list[optuna.trial.FrozenTrial]:
    """The study's trials that ran (or will run) under its current identity."""
    key, legacy = current_key(ostudy), legacy_key(ostudy)
    return [t for t in ostudy.get_trials(deepcopy=False, states=states) if is_current(t, key, legacy)]


def current_rows(frame: pd.DataFrame, ostudy: optuna.Study) -> pd.DataFrame:
    """The rows of a `trials_frame` of `ostudy` that ran under its current identity."""
    key, legacy = current_key(ostudy), legacy_key(ostudy)
    if key is None or "identity" not in frame:
        return frame if legacy in (None, key) else frame.iloc[:0]
    recorded = frame["identity"].fillna(legacy or key)
    return frame[recorded == key].reset_index(drop=True)
