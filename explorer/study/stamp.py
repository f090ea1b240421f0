"""What a stored study was made with (its identity: space, task, objectives, ...): recorded by the first
worker to open it, checked by every one after, so two questions never mix in one study's trials."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna

from explorer.errors import ExplorerError
from explorer.identity import identity_key

if TYPE_CHECKING:
    from explorer.study.spec import ResolvedStudy


def changed(study: ResolvedStudy, ostudy: optuna.Study, where: str) -> str | None:
    """One line saying how this YAML differs from what the stored study was made with, each changed field with
    its stored and its new value, or None; a study another YAML (still there) made under the same `name:` in
    this storage is said to be that."""
    stored = ostudy.user_attrs.get("identity")
    identity = study.identity()
    if stored is None or stored == identity:
        return None
    was = {**stored, "space": ostudy.user_attrs.get("space")}
    now = {**identity, "space": study.space.to_dict()}
    fields = " and ".join(_what_changed(k, was.get(k), now[k]) for k in sorted(identity) if identity[k] != stored.get(k))
    maker = ostudy.user_attrs.get("source")
    if maker and Path(maker) != study.source.resolve() and Path(maker).is_file():
        return (f"{where} already holds a study named {study.spec.name!r}, made from {maker} "
                f"(another {fields}): give this YAML its own `name:` or `storage:`; rerun with --force to continue it anyway")
    return f"the stored study was made with another {fields}; rerun with --force to continue it anyway"


SHOWN = 3  # changed fields named per part; the rest are counted


def _what_changed(part: str, was: Any, now: Any) -> str:
    """`budget (lr 0.002 -> 0.003)`: a part of the identity with its fields that changed, stored value first."""
    old, new = _leaves(was), _leaves(now)
    diffs = [f"{k} {_shown(old.get(k))} -> {_shown(new.get(k))}" for k in sorted(old.keys() | new.keys())
             if old.get(k) != new.get(k)] if was is not None else []
    more = f", {len(diffs) - SHOWN} more" if len(diffs) > SHOWN else ""
    return f"{part} ({', '.join(diffs[:SHOWN])}{more})" if diffs else part


def _leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    """A nested mapping as {dotted.path: value}; lists and scalars are leaves."""
    if not isinstance(value, dict):
        return {prefix or "value": value}
    out: dict[str, Any] = {}
    for key, item in value.items():
        out.update(_leaves(item, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _shown(value: Any) -> str:
    """A stored value as YAML writes it inline: `null`, `[10, 20]`, `0.002`, `none` for a field absent."""
    return "none" if value is None else json.dumps(value) if isinstance(value, (list, dict, bool)) else str(value)


def record_or_check(study: ResolvedStudy, ostudy: optuna.Study, force: bool, grid: Callable[[optuna.Study], Any],
                    where: str) -> None:
    """Record what the study answers (whoever finds it unrecorded: its creator, or the next worker if
    the creator died first) or check it matches; under the study's lock."""
    identity = study.identity()
    stored = ostudy.user_attrs.get("identity")
    if stored is None:
        if [d.name.lower() for d in ostudy.directions] != [o.direction for o in study.objectives]:
            raise ExplorerError("the stored study has other objectives", source=str(study.source), field="objectives")
        grid(ostudy)
        ostudy.set_metric_names([o.name for o in study.objectives])  # optuna-dashboard and optuna.visualization label them
        for key, value in {**identity, "encoding": study.encoding().name, "spec": study.spec.model_dump(mode="json"),
                           "source": str(study.source.resolve()),  # which YAML made it (`changed` names it)
                           "space": study.space.to_dict(),
                           "baseline": study.space.baseline.key if study.space.baseline else None,
                           "metric": study.task.metric, "higher_is_better": study.task.higher_is_better,
                           "objectives": [o.model_dump() for o in study.objectives]}.items():
            ostudy.set_user_attr(key, value)
        ostudy.set_user_attr("identity", identity)
        return
    changed_from = changed(study, ostudy, where)
    if changed_from:
        if not force:
            raise ExplorerError(changed_from, source=str(study.source))
        clash = _new_choices(study, ostudy)
        if clash:
            raise ExplorerError(f"--force cannot continue this study: the new space changes the choices of "
                                f"{', '.join(clash)}, which Optuna keeps for the life of a study; give this YAML its own "
                                f"`name:` to start a study beside it (the stored trials stay)", source=str(study.source))
        if "legacy_identity" not in ostudy.user_attrs and any(
                "identity" not in t.user_attrs and t.state.is_finished() for t in ostudy.get_trials(deepcopy=False)):
            # trials stored before trials recorded their identity answered the question asked until now
            ostudy.set_user_attr("legacy_identity", identity_key(stored))
        ostudy.set_user_attr("identity", identity)
        ostudy.set_user_attr("source", str(study.source.resolve()))
        ostudy.set_user_attr("space", study.space.to_dict())  # what the next change is said against
        ostudy.set_user_attr("spec", study.spec.model_dump(mode="json"))
        ostudy.set_metric_names([o.name for o in study.objectives])
        grid(ostudy)  # a forced new space: queue its configurations no trial has taken


def _new_choices(study: ResolvedStudy, ostudy: optuna.Study) -> list[str]:
    """The categorical parameters whose choices a forced new space changes (Optuna refuses to store them)."""
    new = study.encoding().distributions
    for trial in ostudy.get_trials(deepcopy=False):
        if trial.distributions:
            return [name for name, old in trial.distributions.items()
                    if name in new and isinstance(old, optuna.distributions.CategoricalDistribution) and old != new[name]]
    return []
