"""Which stored trials answer a study's current question.

A study's identity is what changes its results (space, task, budget, objectives: `Study.identity`).
`run --force` continues a study whose identity changed; its older trials then answer another question
(5 epochs against 1), so every trial records the identity it ran under, and summaries, replicates,
queues, samplers and pruners read only the trials of the identity the storage holds now. A trial
that ran before trials recorded it belongs to the identity the study had then: `run --force` records
that one as the study's `legacy_identity`, and until a force it is the current one. A queued trial
records none until a worker takes it: it answers whatever the study asks when it runs.

The execution class (device kind and precision: `cpu float32`, `cuda bfloat16`) is part of the question
too: the same seeds on a CPU in float32 and on a GPU in bfloat16 train different models, so a CPU run
is never paired with a GPU one, nor its `train_time_s` compared with one. Each trial records the class
it ran under (`execution`), the study the class it runs under now (explorer.executors.devices records
it, or refuses a run of another class unless `--force`), and only trials of that class are current. A
trial stored before trials recorded it reads as the class it ran: `cuda` if its `device` says so (in
bfloat16 when its budget asked for it), else `cpu float32`; a queued trial has no class until it runs.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna
import pandas as pd

from explorer.optuna_cache import trial_view
from explorer.optuna_compat import storage_of, study_user_attrs

CLASS = "execution"  # the user attr, on trials and on the study, naming the execution class


@dataclass(frozen=True)
class Current:
    """What the storage's current question is: its identity's key and execution class (None: not recorded)."""

    identity: str | None
    execution: str | None
    bf16: bool = True  # the budget's, to read a trial stored before trials recorded their class
    legacy: str | None = None  # the identity of trials stored before trials recorded one, once `run --force` changed it

    def asks(self, t: optuna.trial.FrozenTrial) -> bool:
        """Whether trial `t` answers this identity (whatever its execution class)."""
        if self.identity is None or t.state == optuna.trial.TrialState.WAITING and "identity" not in t.user_attrs:
            return True
        return t.user_attrs.get("identity", self.legacy or self.identity) == self.identity


def execution_class(device: str, precision: str) -> str:
    """The class a trial runs under: its device kind (cpu, cuda) and what its forward runs in."""
    return f"{'cuda' if device.startswith('cuda') else 'cpu'} {precision}"


def trial_class(state: str, attrs: dict[str, Any], bf16: bool = True) -> str | None:
    """The class a trial ran (or runs) under; None for a queued one (it takes the class of the run that runs it)."""
    recorded = attrs.get(CLASS)
    if isinstance(recorded, str):
        return recorded
    if state == "WAITING":
        return None
    device = attrs.get("device")
    cuda = isinstance(device, str) and device.startswith("cuda")
    return execution_class(device if cuda else "cpu", "bfloat16" if cuda and bf16 else "float32")


def identity_key(identity: dict[str, Any]) -> str:
    """A short, stable name for an identity (what trials store)."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:12]


def current_key(ostudy: optuna.Study) -> Current:
    """The identity and execution class the storage holds now (None before the study recorded one)."""
    attrs = study_user_attrs(ostudy)
    stored = attrs.get("identity")
    bf16 = bool((stored or {}).get("budget", {}).get("bf16", True))
    return Current(identity_key(stored) if stored else None, attrs.get(CLASS), bf16, attrs.get("legacy_identity"))


def is_current(t: optuna.trial.FrozenTrial, key: Current) -> bool:
    if not key.asks(t):
        return False
    return key.execution is None or trial_class(t.state.name, t.user_attrs, key.bf16) in (None, key.execution)


def classes(ostudy: optuna.Study) -> Counter[str]:
    """Trials of the study's current identity by the execution class they ran under (queued ones left out)."""
    key = current_key(ostudy)
    out: Counter[str] = Counter()
    for t in ostudy.get_trials(deepcopy=False):
        cls = trial_class(t.state.name, t.user_attrs, key.bf16)
        if cls is not None and key.asks(t):
            out[cls] += 1
    return out


def current_trials(ostudy: optuna.Study, states: tuple[optuna.trial.TrialState, ...] | None = None) -> list[optuna.trial.FrozenTrial]:
    """The study's trials that ran (or will run) under its current identity.

    Through a worker's cache (optuna_cache.owner_cache), which says which trials changed, the answer is
    kept and only those are judged again: the queue reads it several times per trial it starts."""
    key = current_key(ostudy)
    view = trial_view(ostudy)
    if view is None:
        return [t for t in ostudy.get_trials(deepcopy=False, states=states) if is_current(t, key)]
    cache, study_id = view
    trials = cache.trials(study_id)
    kept = cache.memo.get(("current", study_id))
    changed = None if kept is None or kept[1] != key else cache.changes.since(kept[0])
    if changed is None:
        members = [n for n in sorted(trials) if is_current(trials[n], key)]
        member_set = set(members)
    else:
        members, member_set = kept[2], kept[3]
        flipped = {n for n in changed if n in trials and is_current(trials[n], key) != (n in member_set)}
        if flipped:
            member_set = member_set ^ flipped
            members = sorted(member_set)
    cache.memo[("current", study_id)] = (cache.changes.version, key, members, member_set)
    return [trials[n] for n in members if states is None or trials[n].state in states]


_MISSING = object()


def per_trial(ostudy: optuna.Study, trials: list[optuna.trial.FrozenTrial], name: str,
              fact: Callable[[optuna.trial.FrozenTrial], Any]) -> list[Any]:
    """`[fact(t) for t in trials]`; through a worker's cache (optuna_cache.owner_cache) each trial's
    fact is kept, under `name`, until that trial changes, so a queue reading thousands of trials per
    trial it starts judges each once."""
    storage = storage_of(ostudy)
    changes = getattr(storage, "changes", None)
    if changes is None:
        return [fact(t) for t in trials]
    kept = storage.memo.get(("fact", name))
    changed = None if kept is None else changes.since(kept[0])
    values = {} if changed is None else kept[1]
    for number in changed or ():
        values.pop(number, None)
    out = []
    for t in trials:
        value = values.get(t.number, _MISSING)
        if value is _MISSING:
            value = values[t.number] = fact(t)
        out.append(value)
    storage.memo[("fact", name)] = (changes.version, values)
    return out


def current_rows(frame: pd.DataFrame, ostudy: optuna.Study) -> pd.DataFrame:
    """The rows of a `trials_frame` of `ostudy` that ran under its current identity and execution class."""
    key = current_key(ostudy)
    if key.identity is None and key.execution is None:
        return frame
    keep = pd.Series(True, index=frame.index)
    if key.identity is not None:
        recorded = frame["identity"] if "identity" in frame else pd.Series(None, index=frame.index, dtype=object)
        keep &= recorded.fillna(key.legacy or key.identity) == key.identity
    if key.execution is not None:
        classes = row_classes(frame, key.bf16)
        keep &= classes.isna() | (classes == key.execution)
    return frame[keep].reset_index(drop=True)


def row_classes(frame: pd.DataFrame, bf16: bool = True) -> pd.Series:
    """`trial_class` of each row of a `trials_frame` (None for a queued trial)."""
    cuda = frame["device"].astype("string").str.startswith("cuda").fillna(False).astype(bool)
    inferred = cuda.map({True: execution_class("cuda", "bfloat16" if bf16 else "float32"), False: "cpu float32"}).astype(object)
    inferred[frame["state"] == "WAITING"] = None
    recorded = frame[CLASS] if CLASS in frame else pd.Series(None, index=frame.index, dtype=object)
    return recorded.where(recorded.map(lambda v: isinstance(v, str)), inferred)
