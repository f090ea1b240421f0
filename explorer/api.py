"""explorer from Python, for notebooks and scripts: the same library the `explorer` command drives.

    import explorer
    exp = explorer.load("studies/digits-vit-trade.yaml")      # or explorer.create(folder, name, space=..., task=...)
    exp.run()                                                  # create or continue, until n_trials are finished
    exp.trials(); exp.front(); exp.stats()                     # pandas DataFrames from the study's storage
    exp.recommend("100k"); exp.dashboard()

A study built from Python objects (`create`) is written as YAML into its folder first, so it is the
same study the command line sees (`explorer status folder/name.yaml`), resumable and comparable.
Reading (trials, front, stats, recommend) never writes to the storage.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
import yaml
from pydantic import BaseModel, ValidationError

from explorer.errors import ExplorerError
from explorer.executors import get_executor
from explorer.frame import trials_frame
from explorer.recommend import Recommendation, parse_budget, recommend
from explorer.space import SpaceSpec
from explorer.study import STORAGE_ERRORS, ExecutorSpec, Study, StudySpec, load_study_spec
from explorer.yamlio import validation_error

TrialCallback = Callable[[optuna.Study, optuna.trial.FrozenTrial], None]


class Experiment:
    """One study: its validated spec and files (`study`), and what its storage holds."""

    def __init__(self, study: Study):
        self.study = study

    def __repr__(self) -> str:
        return f"Experiment({self.name!r}, {str(self.study.source)!r})"

    @property
    def name(self) -> str:
        return self.study.spec.name

    @property
    def metric(self) -> str:
        return self.study.task.metric

    def run(self, *, executor: str | None = None, address: str | None = None, force: bool = False,
            on_trial: TrialCallback | None = None) -> "Experiment":
        """Create the study or continue the stored one until it has `n_trials` finished trials.

        `executor` ("local" or "ray") and `address` (a Ray cluster) override the spec; `force`
        continues a stored study whose space, task or budget changed; `on_trial(study, trial)` runs
        after each trial.
        """
        spec = self.study.spec
        if executor is not None or address is not None:
            changes = {k: v for k, v in {"name": executor, "address": address}.items() if v is not None}
            try:
                spec.executor = ExecutorSpec.model_validate({**spec.executor.model_dump(), **changes})
            except ValidationError as err:
                raise validation_error(err, str(self.study.source), prefix="executor") from None
        ostudy = self.study.open(create=True, force=force)
        get_executor(spec.executor.name).run(self.study, ostudy, on_trial)
        return self

    def optuna_study(self) -> optuna.Study:
        """The stored Optuna study, loaded without writing to it (an ExplorerError if it was never run)."""
        file = self.study.storage_file()
        if file is not None and not file.exists():
            raise ExplorerError(f"no study {self.name!r} yet: {file} does not exist (run it first)",
                                source=str(self.study.source), field="storage")
        try:
            return optuna.load_study(study_name=self.name, storage=self.study.storage())
        except KeyError:
            raise ExplorerError(f"no study {self.name!r} in its storage yet (run it first)",
                                source=str(self.study.source), field="storage") from None
        except STORAGE_ERRORS as err:
            raise self.study.storage_error(err, "cannot read") from None

    def trials(self) -> pd.DataFrame:
        """Every trial of the storage, one row each (`explorer export`'s table)."""
        return trials_frame(self.optuna_study())

    def measured(self) -> pd.DataFrame:
        """Completed trials that trained their configuration (not copies of an earlier trial's result)."""
        frame = self.trials()
        done = frame[frame["state"] == "COMPLETE"]
        if "duplicate_of" in done:
            done = done[done["duplicate_of"].isna()]
        return done.reset_index(drop=True)

    def front(self) -> pd.DataFrame:
        """The Pareto front of the configurations' means (over their seeds), by parameters: rows of `stats()`."""
        table = self.stats()
        return table[table["on_front"]].sort_values("params", ignore_index=True) if len(table) else table

    def stats(self) -> pd.DataFrame:
        """Per configuration, from its seeds (explorer.stats.summarize): n, seeds, values, mean, std, se,
        the 95% t interval lo-hi (NaN without replicates), front_prob, on_front, tied_with; and the
        mean over its seeds of FLOPs and κ. Best mean first."""
        table = self.study.summary(self.optuna_study())
        done = self.measured()
        for col in ("flops", "kappa_init_mean", "kappa_final_mean"):
            if col in done and len(table):
                table[col] = table["arch"].map(done.groupby("arch")[col].mean())
        ascending = not self.study.task.higher_is_better
        return table.sort_values(["mean", "params"], ascending=[ascending, True], ignore_index=True) if len(table) else table

    def recommend(self, budget: str | int) -> Recommendation:
        """The best configuration within `budget` (a count, "60M", or "10%-below-baseline"), measured
        or marked predicted; `.lines()` says it in words."""
        base = self.study.space.baseline
        limit = budget if isinstance(budget, int) else parse_budget(budget, base.params if base else None)
        candidates = [(c.key, c.dims, c.params) for c in self.study.space.configs()]
        return recommend(self.trials(), limit, base.key if base else None, self.metric, candidates,
                         self.study.task.higher_is_better)

    def dashboard(self, out: str | Path | None = None) -> Path:
        """Write the self-contained HTML dashboard; returns its path."""
        from explorer.dashboard import render_studies  # plotly: imported only when asked for

        return render_studies([self.study.source], Path(out) if out is not None else None)


def load(path: str | Path) -> Experiment:
    """The study a YAML file describes, with its space and task validated (one-line ExplorerError)."""
    return Experiment(load_study_spec(path))


def create(folder: str | Path, name: str, *, space: SpaceSpec | Mapping[str, Any] | str | Path,
           task: Mapping[str, Any], n_trials: int, **options: Any) -> Experiment:
    """Build a study from Python objects: written to `folder/<name>.yaml` (and the space, unless it is
    a path, to `folder/<name>.space.yaml`), then loaded. `options` are the study YAML's other fields
    (budget, objectives, sampler, pruner, storage, executor, ...), as dicts or explorer's models.
    The storage defaults to `folder/<name>.db`.
    """
    folder = Path(folder)
    study_path = folder / f"{name}.yaml"
    if isinstance(space, (str, Path)):
        space_ref = str(Path(space).resolve())
        space_doc = None
    else:
        try:
            space_doc = _plain(space if isinstance(space, SpaceSpec) else SpaceSpec.model_validate(dict(space)))
        except ValidationError as err:
            raise validation_error(err, "space") from None
        space_ref = f"{name}.space.yaml"
    doc = {"name": name, "space": space_ref, "task": _plain(task), "n_trials": n_trials,
           **{k: _plain(v) for k, v in options.items()}}
    try:
        StudySpec.model_validate(doc)  # before anything is written
    except ValidationError as err:
        raise validation_error(err, str(study_path)) from None
    folder.mkdir(parents=True, exist_ok=True)
    if space_doc is not None:
        (folder / space_ref).write_text(yaml.safe_dump(space_doc, sort_keys=False))
    study_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load(study_path)


def _plain(value: Any) -> Any:
    """`value` as YAML can hold it: pydantic models (Budget, SpaceSpec, ...) as the YAML they map onto,
    paths as strings, inside mappings and lists too."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_defaults=True)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
