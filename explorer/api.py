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

import typing
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
import pandas as pd
import yaml
from pydantic import BaseModel, ValidationError

from explorer.errors import ExplorerError
from explorer.frame import trials_frame
from explorer.identity import current_rows
from explorer.space import SpaceSpec
from explorer.yamlio import validation_error

if TYPE_CHECKING:  # the study's machinery (torch through its tasks, scipy through the statistics) loads on first
    # use, inside the functions below: `params` needs none of it
    from explorer.decisions import Answer
    from explorer.export import Exported
    from explorer.recommend import Recommendation
    from explorer.study import Study, StudySpec

TrialCallback = Callable[[optuna.Study, optuna.trial.FrozenTrial], None]


class Experiment:
    """One study: its validated spec and files (`study`), and what its storage holds."""

    def __init__(self, study: Study):
        self.study = study
        self._ran: optuna.Study | None = None  # the Optuna study `run` opened: reading after it reuses its storage

    def __repr__(self) -> str:
        return f"Experiment({self.name!r}, {str(self.study.source)!r})"

    @property
    def name(self) -> str:
        return self.study.spec.name

    @property
    def metric(self) -> str:
        return self.study.task.metric

    @property
    def spec(self) -> StudySpec:
        """The study's YAML, validated (read it; `run` takes the overrides)."""
        return self.study.spec

    def paths(self) -> dict[str, str]:
        """Every place on disk this study reads or writes, resolved (study, space, data, storage, checkpoints)."""
        return self.study.paths()

    def run(self, *, executor: str | None = None, address: str | None = None, device: str | None = None,
            force: bool = False, resume: bool = False, reclaim: bool = False, retry_failed: bool = False,
            on_start: Callable[[Started], None] | None = None, on_trial: TrialCallback | None = None,
            verbose: bool = False, tracking: Sequence[str] = ()) -> Experiment:
        """Create the study or continue the stored one until it has `n_trials` finished trials.

        `executor` ("local", "ray"), `address` (a Ray cluster), `device` (auto, cpu, cuda: resolved before the storage
        opens) and `tracking` (mlflow, tensorboard, NAME=URI or DIR, none: explorer.tracking) override the spec; `force`
        continues a study whose space, task, budget or execution class changed; `resume` requires it to exist; `reclaim`
        fails and re-queues trials left RUNNING (no other worker alive); `retry_failed` queues again every configuration
        whose trials all failed by themselves; `on_start(started)` runs once the storage is open, `on_trial(study, trial)`
        after each trial. Optuna's log lines show only with `verbose`. A KeyboardInterrupt propagates once every finished
        trial is stored.
        """
        from explorer.executors import get_executor
        from explorer.tracking.feed import tracked

        study = self.study
        _override(study, tracking, name=executor, address=address, device=device)
        with quiet(verbose):
            (runner := get_executor(study.spec.executor.name)).prepare(study)  # devices that cannot be had: nothing written
            ostudy = study.open(create=not resume, force=force)
            execution = runner.settle(study, ostudy, force)
            reclaimed = study.queue.reclaim_running(ostudy) if reclaim else []
            retried = study.queue.retry_failed(ostudy) if retry_failed else []
            with tracked(study, ostudy, self.status) as feed:  # trackers, fed from this process (on Ray: the driver)
                if on_start is not None:
                    on_start(Started(ostudy, reclaimed, retried, study.queue.grid_note(), execution.line(study.spec.budget.bf16), feed.line))
                self._ran = ostudy
                runner.run(study, ostudy, feed.chained(on_trial), feed.on_epoch)
        return self

    def stalled(self) -> str | None:
        """Why the study stopped short of `n_trials`, when its sampler ran out of new proposals; else None."""
        from explorer.study.queue import MAX_DUPLICATE_RUN

        if self.study.queue.stalled(self.optuna_study()):
            return f"stopped: the sampler proposed only measured configurations {MAX_DUPLICATE_RUN} times in a row"
        return None

    def progress(self, ostudy: optuna.Study) -> tuple[int, int]:
        """(runs finished, runs planned so far): finished, running and not yet started; an adaptive
        replicate policy raises the plan as it queues seeds."""
        study = self.study
        running = sum(t.state == optuna.trial.TrialState.RUNNING for t in ostudy.get_trials(deepcopy=False))
        finished = study.reads.finished(ostudy)
        return finished, max(study.spec.n_trials, finished + running + study.queue.unstarted(ostudy))

    def changed(self) -> str | None:
        """One line saying how the YAML differs from what the stored study was made with, or None."""
        return self.study.store.changed(self.optuna_study())

    def status(self) -> Status:
        """What the storage holds: counts by state, replicate compute, the per-configuration summary."""
        study, ostudy = self.study, self.optuna_study()
        frame = current_rows(trials_frame(ostudy), ostudy)
        runs, at_max = study.reads.replicate_cost(ostudy)
        summary = study.reads.summary(ostudy)
        return Status(
            name=self.name, n_trials=study.spec.n_trials, outcomes=study.reads.outcomes(ostudy),
            runs=study.reads.finished(ostudy),
            states=_states(frame),
            duplicates=len(current_rows(trials_frame(ostudy, duplicates=True), ostudy)) - len(frame),
            seeds=study.seeds, replicates=study.spec.replicates.model_dump(), replicate_runs=runs, replicate_at_max=at_max,
            summary=_with_free_dims(self.study, summary), trials=frame, set_aside=study.reads.set_aside(ostudy), free_dims=list(study.space.free_dims), metric=self.metric,
            answers=study.reads.answers(summary), higher_is_better=study.task.higher_is_better,
            classes=study.reads.classes_note(ostudy), epochs=summary.attrs.get("epochs"),
            learning=study.reads.learning(frame), lengths=tuple(study.spec.budget.ladder),
        )

    def export(self, target: str | Path, format: str | None = None) -> Exported:
        """Write the trials table to `target` (the trials that ran) and the per-configuration table beside it, a
        row per configuration and length (t.csv -> t.configs.csv; parquet likewise), in the format the extension
        names (`format` may repeat it; without an extension: `format`, default csv); returns what it wrote
        (explorer.export.Exported: both paths, the counts, `.lines()` in words)."""
        from explorer.export import export_format, write

        target = Path(target)
        format = export_format(target, format)  # a contradiction is refused before the storage is read
        ostudy = self.optuna_study()
        configs = {e: self.study.reads.summary(ostudy, epochs=e) for e in self.study.spec.budget.ladder}
        return write(self.trials(), configs, target, format)

    def optuna_study(self) -> optuna.Study:
        """The stored Optuna study, loaded without writing to it (an ExplorerError if it was never run);
        after `run`, the study it ran, on the same storage connection."""
        return self._ran if self._ran is not None else self.study.read()

    def trials(self) -> pd.DataFrame:
        """Every trial of the storage, one row each (`explorer export`'s table)."""
        return trials_frame(self.optuna_study())

    def measured(self) -> pd.DataFrame:
        """Completed trials of the current identity that trained their configuration (not copies of an
        earlier trial's result, nor runs from before `run --force` changed the budget)."""
        frame = current_rows(self.trials(), self.optuna_study())
        done = frame[frame["state"] == "COMPLETE"]
        if "duplicate_of" in done:
            done = done[done["duplicate_of"].isna()]
        return done.reset_index(drop=True)

    def front(self) -> pd.DataFrame:
        """The Pareto front of the configurations' means (over their seeds), by parameters: rows of `stats()`."""
        table = self.stats()
        return table[table["on_front"]].sort_values("params", ignore_index=True) if len(table) else table

    def stats(self) -> pd.DataFrame:
        """Per configuration (explorer.stats.summarize): n, seeds, values, raw, the posterior mean, se, its 95%
        interval lo-hi, front_prob, on_front, tied_with; mean FLOPs and κ over its seeds. Best mean first."""
        table = _with_free_dims(self.study, self.study.reads.summary(self.optuna_study()))
        done = self.measured()
        for col in ("flops", "kappa_init_mean", "kappa_final_mean"):
            if col in done and len(table):
                table[col] = table["arch"].map(done.groupby("arch")[col].mean())
        ascending = not self.study.task.higher_is_better
        return table.sort_values(["mean", "params"], ascending=[ascending, True], ignore_index=True) if len(table) else table

    def budget(self, text: str | int) -> int:
        """A budget as a parameter count: a count, "60M", "250k", or "10%-below-baseline"."""
        from explorer.decisions import parse_budget

        base = self.study.space.baseline
        return text if isinstance(text, int) else parse_budget(text, base.params if base else None)

    def recommend(self, budget: str | int, list_ties: bool = False, epochs: int | None = None) -> Recommendation:
        """The answer within `budget` (a count, "60M", "10%-below-baseline") at the study's target length
        (or `epochs`): the configuration to use, its regret bound, decided or not (the study's `decision:`),
        its verdict against the baseline; past the space, among its splits and those past its ranges, or a
        refusal past the validated reach. `.lines()` says it; `list_ties` lists the ties."""
        from explorer.recommend import for_study

        trials = current_rows(self.trials(), self.optuna_study())
        return for_study(self.study, trials, self.budget(budget), list_ties, epochs)

    def verify_longer(self, rec: Recommendation, epochs: int, seeds: int = 3, on_trial: TrialCallback | None = None,
                      verbose: bool = False) -> list[str]:
        """Train the pick and the configurations not distinguished from it at `epochs` epochs, `seeds` seeds,
        as a study of its own in the same storage, and say whether the short runs' order held (explorer.fidelity)."""
        from explorer.fidelity import verify_longer

        with quiet(verbose):
            return verify_longer(self.study, self.stats(), rec, epochs, seeds, on_trial)

    def verify(self, rec: Recommendation) -> list[str]:
        """Queue the configurations `rec` names for verification in the study; returns those queued
        (a measured one is not queued). Refused when the YAML changed since the study was made."""
        ostudy = self.study.open(create=False)
        return self.study.queue.verification(ostudy, list(rec.verify))

    def verify_outside(self, rec: Recommendation, on_trial: TrialCallback | None = None) -> list[str]:
        """Train `rec.outside`, the pick past the space, in a study of its own (explorer.beyond)."""
        from explorer.beyond import verify_outside
        with quiet():
            return verify_outside(self.study, rec, on_trial)

    def dashboard(self, out: str | Path | None = None) -> Path:
        """Write the self-contained HTML dashboard; returns its path."""
        return dashboard([self.study.source], out)


def _override(study: Study, tracking: Sequence[str] = (), **executor: str | None) -> None:
    """`run`'s executor fields (those not None: name, address, device) and `--tracking` over the spec's, validated as the YAML's would be."""
    from explorer.study import ExecutorSpec

    spec, changes = study.spec, {k: v for k, v in executor.items() if v is not None}
    spec.tracking = spec.tracking.with_flags(tracking)
    study.flags = {k: f"--{k}" for k in changes}
    if changes:
        try:
            spec.executor = ExecutorSpec.model_validate({**spec.executor.model_dump(), **changes})
        except ValidationError as err:
            raise validation_error(err, str(study.source), prefix="executor") from None


def _with_free_dims(study: Study, table: pd.DataFrame) -> pd.DataFrame:
    """Every free dimension as a column of a per-configuration table (kv_heads too, not only layers/heads)."""
    configs = study.configs
    for dim in study.space.free_dims:
        if dim not in table and len(table):
            table[dim] = table["arch"].map(lambda key: configs[key].dims.get(dim) if key in configs else None)
    return table


def _states(frame: pd.DataFrame) -> dict[str, int]:
    """Trials by state, an interrupted trial (Ctrl-C; its configuration is queued again) and a fault (explorer.faults:
    retried, not a measurement) apart from failures."""
    if not len(frame):
        return {}
    failed = frame["state"] == "FAIL"
    interrupted = frame["interrupted"].notna() if "interrupted" in frame else False
    fault = (frame["fault"].notna() & frame["fail_reason"].isna()) if "fault" in frame else False
    return frame["state"].mask(failed & interrupted, "INTERRUPTED").mask(failed & fault, "FAULT").value_counts().to_dict()


@contextmanager
def quiet(verbose: bool = False) -> Iterator[None]:
    """Optuna's per-trial INFO lines and its ExperimentalWarning (heartbeats, since Optuna 2.8) left out,
    as the command line does, unless `verbose`."""
    if verbose:
        yield
        return
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            yield
    finally:
        optuna.logging.set_verbosity(level)


@dataclass(frozen=True)
class Started:
    """What `Experiment.run` did before its first trial: the storage is open."""

    ostudy: optuna.Study
    reclaimed: list[int]  # trials left RUNNING, failed and queued again (`reclaim`)
    retried: list[str]  # failed configurations queued again (`retry_failed`)
    grid_note: str | None  # a grid study that trains only a prefix of its grid says so
    execution: str = ""  # what the trials train on, in one line (explorer.executors.devices.Execution.line)
    tracking: str | None = None  # where the trials are tracked, in one line (explorer.tracking.feed.Feed.line)


@dataclass(frozen=True)
class Status:
    """A study's stored state, as `explorer status` prints it."""

    name: str
    n_trials: int
    outcomes: tuple[int, int]  # configurations with a result, and those whose every trial failed
    runs: int  # measurements, replicates included
    states: dict[str, int]
    duplicates: int  # proposals answered from storage
    seeds: list[int]
    replicates: dict[str, Any]
    replicate_runs: int
    replicate_at_max: int  # runs every measured configuration at every seed would take
    summary: pd.DataFrame  # per configuration (explorer.stats.summarize)
    trials: pd.DataFrame
    free_dims: list[str]
    metric: str
    set_aside: int  # trials of an earlier identity (before `run --force` changed the budget, say): kept, not read
    answers: list[tuple[list[int], Answer]]  # per distinct set of the study's budgets: the answer (explorer.decisions)
    higher_is_better: bool = True
    classes: str | None = None  # trials of more than one execution class (CPU and GPU): which are read, which set aside
    epochs: int | None = None  # the length the answers are for, where the study trains several
    learning: str | None = None  # the runs were still learning when they stopped (explorer.learning), in words
    lengths: tuple[int, ...] = ()  # the lengths (epochs) the study trains, shortest first


def dashboard(studies: list[str | Path], out: str | Path | None = None) -> Path:
    """One self-contained HTML dashboard of one or more studies (several: compared on one front)."""
    from explorer.dashboard import render_studies  # plotly: imported only when asked for

    return render_studies([Path(p) for p in studies], Path(out) if out is not None else None)


def serve(studies: list[str | Path], host: str = "127.0.0.1", port: int = 8050, every: float = 5.0,
          on_ready: Callable[[str], None] | None = None) -> None:
    """The dashboard served live at http://host:port until Ctrl-C, updating in the open page (explorer.dashboard.live)."""
    from explorer.dashboard.live import serve

    serve([Path(p) for p in studies], host, port, every, on_ready)


def executor_names() -> tuple[str, ...]:
    """The names a study's `executor.name` takes (the command line checks `--executor` against them)."""
    from explorer.study import ExecutorSpec

    return typing.get_args(ExecutorSpec.model_fields["name"].annotation)


def params(space: str | Path | None = None, family: str | None = None,
           dims: Mapping[str, Any] | None = None) -> tuple[pd.DataFrame, str]:
    """Exact parameter counts and forward FLOPs: every feasible configuration of a space YAML, or one
    configuration of a family (`dims` over its defaults); returns the table and its title."""
    from explorer.families import get_family
    from explorer.space import load_space
    from explorer.units import format_count
    from explorer.yamlio import first_error

    if space is not None:
        sp = load_space(space)
        base = sp.baseline
        rows = [{**{k: c.dims[k] for k in c.free}, "params": c.params, "M": format_count(c.params),
                 "flops": sp.family.flops(c.dims), "baseline": "*" if base and c.key == base.key else ""}
                for c in sp.configs()]
        return pd.DataFrame(rows), f"{sp.name}: {sp.family.name}, counted {sp.family.counting}"
    if family is None:
        raise ExplorerError("give a space YAML, or --family with its dimensions", field="params")
    fam = get_family(family)
    given = dict(dims or {})
    try:
        full = fam.check({**fam.defaults(), **given}).model_dump()
    except ValidationError as e:
        loc, msg = first_error(e, fam.Dims)
        raise ExplorerError(msg, source=family, field=".".join(map(str, loc)) or None) from None
    n = fam.params(full)
    shown = {k: full[k] for k in ("layers", "heads", "width", "mlp") if full.get(k) is not None}
    defaulted = [f"{k} {v}" for k, v in full.items() if k not in given and v is not None]
    other = [f"{k} {v}" for k, v in given.items() if k not in shown]  # --dim's, named here as the defaults are
    said = (f"; given: {', '.join(other)}" if other else "") + (
        f"; not given, so the family's defaults: {', '.join(defaulted)}" if defaulted else "")
    return (pd.DataFrame([{**shown, **given, "params": n, "M": format_count(n), "flops": fam.flops(full)}]),
            f"{family}, counted {fam.counting}{said}")


def condition(space: str | Path, task: str = "digits", options: Mapping[str, Any] | None = None, seeds: int = 3,
              regimes: tuple[str, ...] = ("fixed-width",), head_dim: int | None = None,
              progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:
    """κ(A) of the attention blocks at initialisation for each configuration of a space (explorer.conditioning);
    `progress(done, total)` after each configuration."""
    from explorer.conditioning import condition_table
    from explorer.space import load_space
    from explorer.tasks import get_task

    return condition_table(load_space(space), get_task(task, dict(options or {})), seeds=tuple(range(seeds)),
                           regimes=regimes, head_dim=head_dim, progress=progress)


def load(path: str | Path) -> Experiment:
    """The study a YAML file describes, with its space and task validated (one-line ExplorerError)."""
    from explorer.study import load_study_spec

    return Experiment(load_study_spec(path))


def create(folder: str | Path, name: str, *, space: SpaceSpec | Mapping[str, Any] | str | Path,
           task: Mapping[str, Any], n_trials: int, **options: Any) -> Experiment:
    """Build a study from Python objects: written to `folder/<name>.yaml` (and the space, unless it is
    a path, to `folder/<name>.space.yaml`), then loaded. `options` are the study YAML's other fields
    (budget, objectives, sampler, pruner, storage, executor, ...), as dicts or explorer's models.
    The storage defaults to `folder/<name>.db`.
    """
    from explorer.study import StudySpec

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
