"""The `explorer` command: parse, call the library, print. Errors are one line and exit 1."""

from __future__ import annotations

import math
import numbers
import sys
import time
import typing
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import numpy as np
import pandas as pd
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from explorer.errors import ExplorerError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Which (layers, heads) split gives the best accuracy for a parameter budget?")
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


class Format(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"


def _print_frame(frame, fmt: Format, title: str | None = None) -> None:
    """A pandas frame as a rich table, CSV or JSON on stdout.

    In a table no number is ever cut short: a numeric column is at least as wide as its longest value
    and never wraps; long text folds onto more lines. A table that still does not fit the terminal
    is printed wider than it (the terminal wraps it, or a pager scrolls it): never with `5.995e+…`.
    """
    if fmt is Format.csv:
        sys.stdout.write(frame.to_csv(index=False))
    elif fmt is Format.json:
        sys.stdout.write(frame.to_json(orient="records", indent=1) + "\n")
    else:
        table = Table(title=title)
        cells = [[_cell(v) for v in row] for row in frame.itertuples(index=False)]
        for i, col in enumerate(frame.columns):
            if frame[col].dtype.kind in "iuf":
                longest = max((len(row[i]) for row in cells), default=1)
                table.add_column(str(col), justify="right", no_wrap=True, min_width=longest)
            else:
                table.add_column(str(col), overflow="fold")
        for row in cells:
            table.add_row(*row)
        needed = Console(width=UNLIMITED).measure(table).minimum
        (out if needed <= out.width else Console(width=needed)).print(table)


UNLIMITED = 100_000  # columns: a console this wide measures a table's own minimum width


def _cell(value) -> str:
    """A value as a table shows it: 4 significant digits, thousands separated, blank where missing."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, (bool, np.bool_)):
        return str(value)
    if isinstance(value, numbers.Integral):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, numbers.Real):
        return f"{value:.4g}"
    return str(value)


# -- params -------------------------------------------------------------------------------------------
@app.command()
def params(
    space: Annotated[Optional[Path], typer.Argument(help="a space YAML; omit to count one configuration")] = None,
    family: Annotated[Optional[str], typer.Option(help="family to count one configuration of")] = None,
    layers: Annotated[Optional[int], typer.Option()] = None,
    heads: Annotated[Optional[int], typer.Option()] = None,
    width: Annotated[Optional[int], typer.Option()] = None,
    mlp: Annotated[Optional[int], typer.Option()] = None,
    dim: Annotated[list[str], typer.Option(help="another dimension, NAME=VALUE (repeatable)")] = [],
    format: Annotated[Format, typer.Option("--format", "-f")] = Format.table,
) -> None:
    """Count parameters exactly: every feasible configuration of a space, or one configuration."""
    import pandas as pd
    from pydantic import ValidationError

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
        _print_frame(pd.DataFrame(rows), format, title=f"{sp.name}: {sp.family.name}, counted {sp.family.counting}")
        return
    if family is None:
        raise ExplorerError("give a space YAML, or --family with its dimensions", field="params")
    fam = get_family(family)
    given = {k: v for k, v in dict(layers=layers, heads=heads, width=width, mlp=mlp).items() if v is not None}
    for item in dim:
        name, sep, value = item.partition("=")
        if not sep:
            raise ExplorerError(f"--dim {item!r}: write NAME=VALUE", field="--dim")
        given[name] = _scalar(value)
    try:
        dims = fam.check({**fam.defaults(), **given}).model_dump()
    except ValidationError as e:
        loc, msg = first_error(e, fam.Dims)
        raise ExplorerError(msg, source=family, field=".".join(map(str, loc)) or None) from None
    n = fam.params(dims)
    _print_frame(pd.DataFrame([{**given, "params": n, "M": format_count(n), "flops": fam.flops(dims)}]), format,
                 title=f"{family}, counted {fam.counting}")


def _scalar(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


# -- run / resume -----------------------------------------------------------------------------------------
def _run(path: Path, *, create: bool, force: bool, executor: str | None, address: str | None,
         reclaim: bool, dashboard: bool) -> None:
    from explorer.executors import get_executor
    from explorer.study import MAX_DUPLICATE_RUN, load_study_spec

    study = load_study_spec(path)
    if executor:
        study.spec.executor.name = _executor_name(executor)
    if address:
        study.spec.executor.address = address
    for key, value in study.paths().items():  # every place this run reads or writes, stated up front
        err.print(f"{key}: {value}", markup=False, highlight=False)
    ostudy = study.open(create=create, force=force)
    if reclaim:
        numbers = study.reclaim_running(ostudy)
        if numbers:
            err.print(f"reclaimed running trials {numbers}: their configurations are queued again")
    if study.spec.sampler.name == "grid" and study.spec.n_trials < len(study.keys):
        err.print(f"grid of {len(study.keys)} configurations, n_trials {study.spec.n_trials}: trains {study.spec.n_trials} "
                  "spread over the grid (its queue is in farthest-point order); raise n_trials to run the rest",
                  markup=False, highlight=False)
    failed: list[int] = []
    try:
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("{task.fields[front]}"), TimeElapsedColumn(), console=err, transient=False) as bar:
            task = bar.add_task(study.spec.name, total=_planned(study, ostudy), completed=study.finished(ostudy), front="")

            def on_trial(s, t) -> None:
                if t.state.name == "FAIL" and "fail_reason" in t.user_attrs:  # one line each; reasons stay in `status`
                    failed.append(t.number)
                    bar.console.print(f"trial {t.number} ({t.params.get('arch')}) failed: {t.user_attrs['fail_reason']}",
                                      markup=False, highlight=False)
                bar.update(task, completed=study.finished(s), total=_planned(study, s), front=f"front: {len(s.best_trials)} | last: #{t.number} {t.state.name.lower()}")

            get_executor(study.spec.executor.name).run(study, ostudy, on_trial)
    except KeyboardInterrupt:
        err.print(f"interrupted: every finished trial is stored; continue with: explorer resume {path}", markup=False, highlight=False)
        raise SystemExit(130) from None
    _status(study, ostudy, failures=False)  # this run's failures were said as they happened
    if study.stalled(ostudy):
        err.print(f"stopped: the sampler proposed only measured configurations {MAX_DUPLICATE_RUN} times in a row",
                  markup=False, highlight=False)
    if dashboard:
        target = _render([path])
        out.print(f"dashboard: {target}")
    if failed:
        raise ExplorerError(f"{len(failed)} trials failed in this run (reasons above and in `explorer status`)", source=str(path))


def _planned(study, ostudy) -> int:
    """Runs this study is known to take so far: those finished, running and not yet started (replicates
    queued by an adaptive policy raise it as they are queued)."""
    running = sum(t.state.name == "RUNNING" for t in ostudy.get_trials(deepcopy=False))
    return max(study.spec.n_trials, study.finished(ostudy) + running + study.unstarted(ostudy))


def _executor_name(name: str) -> str:
    """`--executor`, validated like the YAML's `executor.name`."""
    from explorer.study import ExecutorSpec

    choices = typing.get_args(ExecutorSpec.model_fields["name"].annotation)
    if name not in choices:
        raise ExplorerError(f"{name!r} is not an executor; choose {' or '.join(choices)}", field="--executor")
    return name


def _read(path: Path):
    """A study and its stored trials for a read-only command; a changed YAML is said in one line."""
    from explorer.study import load_study_spec

    study = load_study_spec(path)
    ostudy = study.read()
    changed = study.changed(ostudy)
    if changed:
        err.print(f"note: {path}: {changed.replace('rerun with --force', '`explorer run --force`')}; showing the stored trials",
                  markup=False, highlight=False)
    return study, ostudy, changed


@app.command()
def run(
    study: Annotated[Path, typer.Argument(help="a study YAML (see studies/)")],
    executor: Annotated[Optional[str], typer.Option(help="local | ray (overrides the spec)")] = None,
    address: Annotated[Optional[str], typer.Option(help="Ray cluster to join: auto, ray://host:port")] = None,
    force: Annotated[bool, typer.Option(help="continue a stored study even if its space/task/budget changed")] = False,
    dashboard: Annotated[bool, typer.Option(help="write the dashboard when done")] = True,
) -> None:
    """Run a study (create it, or continue the stored one) until it has n_trials finished trials."""
    _run(study, create=True, force=force, executor=executor, address=address, reclaim=False, dashboard=dashboard)


@app.command()
def resume(
    study: Annotated[Path, typer.Argument()],
    executor: Annotated[Optional[str], typer.Option(help="local | ray (overrides the spec)")] = None,
    address: Annotated[Optional[str], typer.Option()] = None,
    reclaim: Annotated[bool, typer.Option(help="fail and re-queue RUNNING trials now (no other worker alive)")] = False,
    force: Annotated[bool, typer.Option()] = False,
    dashboard: Annotated[bool, typer.Option()] = True,
) -> None:
    """Continue a stored study; trials a dead worker left running are re-run, finished ones kept."""
    _run(study, create=False, force=force, executor=executor, address=address, reclaim=reclaim, dashboard=dashboard)


# -- status / export ------------------------------------------------------------------------------------------
def _status(study, ostudy, failures: bool = True) -> None:
    from explorer.frame import trials_frame

    frame = trials_frame(ostudy)
    counts = frame["state"].value_counts().to_dict() if len(frame) else {}
    duplicates = len(trials_frame(ostudy, duplicates=True)) - len(frame)
    summary = study.summary(ostudy)
    out.print(f"[bold]{study.spec.name}[/]: {study.configurations(ostudy)}/{study.spec.n_trials} configurations measured, "
              f"{study.finished(ostudy)} runs; " + ", ".join(f"{k.lower()} {v}" for k, v in sorted(counts.items()))
              + (f"; {duplicates} proposals of measured configurations answered from storage" if duplicates else ""))
    if len(study.seeds) > 1:
        runs, at_max = study.replicate_cost(ostudy)
        policy = study.spec.replicates
        how = f"adaptive, confidence {policy.confidence:g}" if policy.policy == "adaptive" else "fixed"
        out.print(f"replicates ({how}), seeds {study.seeds}: {runs} runs of the {at_max} that every measured "
                  f"configuration at {len(study.seeds)} seeds would take ({runs / max(at_max, 1):.0%})", markup=False)
    if len(summary):
        _print_front(study, summary, frame)
    failed = frame[frame["state"] == "FAIL"] if failures else frame.iloc[0:0]
    for row in failed.itertuples():
        if isinstance(row.fail_reason, str):
            out.print(f"trial {row.number} ({row.arch}) failed: {row.fail_reason}", markup=False)


def _print_front(study, summary: pd.DataFrame, frame: pd.DataFrame) -> None:
    """The front of per-configuration means with n, the 95% interval and front probability; then the
    configurations tied with a front member (not separable from it), so they are not hidden."""
    metric = study.task.metric
    front = summary[summary["on_front"]].copy()
    front["±"] = front["hi"] - front["mean"]
    kappa = frame.groupby("arch")["kappa_init_mean"].mean() if "kappa_init_mean" in frame else None
    if kappa is not None:
        front["kappa_init_mean"] = front["arch"].map(kappa)
    cols = [c for c in (*study.space.free_dims, "params", "n", metric, "±", "front_prob", "kappa_init_mean") if c in front]
    intervals = summary["n"].gt(1).any()
    title = ("Pareto front of means (± 95% t interval, front_prob: share of draws from the intervals on the front)"
             if intervals else "Pareto front (one seed per configuration: no intervals)")
    _print_frame(front[cols if intervals else [c for c in cols if c not in ("±", "front_prob")]], Format.table, title=title)
    tied = summary[summary["tied_with"].notna()]
    if len(tied):
        out.print("tied with a front member (no evidence either is better): "
                  + "; ".join(f"{r.arch} with {r.tied_with}" for r in tied.itertuples()), markup=False)


@app.command()
def status(study: Annotated[Path, typer.Argument()]) -> None:
    """Counts of trials by state and the current Pareto front (reads the storage, never writes it)."""
    s, ostudy, _ = _read(study)
    _status(s, ostudy)


class ExportFormat(str, Enum):
    csv = "csv"
    parquet = "parquet"


CONFIG_COLUMNS = ["arch", "layers", "heads", "width", "mlp", "params", "n", "mean", "std", "se", "lo", "hi",
                  "front_prob", "on_front", "tied_with", "seeds", "values"]


def configs_path(target: Path, format: ExportFormat) -> Path:
    """Where `export` writes the per-configuration table beside the trials table: t.csv -> t.configs.csv."""
    suffix = target.suffix or f".{format.value}"
    return target.with_name(target.name.removesuffix(target.suffix) + ".configs" + suffix)


@app.command()
def export(
    study: Annotated[Path, typer.Argument()],
    format: Annotated[ExportFormat, typer.Option("--format", "-f")] = ExportFormat.csv,
    out_path: Annotated[Optional[Path], typer.Option("--out", "-o", help="default: beside the study YAML")] = None,
) -> None:
    """Write the trials table and, beside it, the per-configuration table, with pandas.

    The trials table has one row per measurement (duplicates answered from storage left out). The
    configurations table (`--out t.csv` also writes `t.configs.csv`; parquet likewise) has one row per
    configuration from its seeds: arch, its dimensions, params, n (seeds measured), mean, std, se, lo and
    hi (the 95% t interval of the mean, empty with one seed per configuration), front_prob (probability of
    being on the Pareto front of the study's objectives), on_front (on the front of means), tied_with
    (for one off the front, the front member it is statistically tied with), seeds and values (the
    metric by seed; JSON lists in CSV).
    """
    from explorer.frame import trials_frame
    from explorer.stats import summarize

    s, ostudy, _ = _read(study)
    frame = trials_frame(ostudy)
    objectives = [(o.name, o.direction) for o in s.objectives]
    configs = summarize(frame, s.task.metric, objectives).reindex(columns=CONFIG_COLUMNS)
    configs.attrs.clear()  # the pooled variance it carries is no column, and parquet cannot store it
    target = out_path or study.with_suffix(f".{format.value}")
    beside = configs_path(target, format)
    if format is ExportFormat.csv:
        frame.to_csv(target, index=False)
        configs.to_csv(beside, index=False)
    else:
        frame.assign(curve=frame["curve"].map(list), config=frame["config"].map(str)).to_parquet(target, index=False)
        configs.to_parquet(beside, index=False)
    out.print(f"{len(frame)} trials -> {target}", markup=False, highlight=False)
    out.print(f"{len(configs)} configurations -> {beside}", markup=False, highlight=False)


# -- dashboard / recommend / condition ---------------------------------------------------------------------------
def _render(paths: list[Path], target: Path | None = None) -> Path:
    from explorer.dashboard import render_studies

    return render_studies(paths, target)


@app.command()
def dashboard(
    studies: Annotated[list[Path], typer.Argument(help="one or more study YAMLs (several: compared on one front)")],
    out_path: Annotated[Optional[Path], typer.Option("--out", "-o", help="default: dashboards/<name>.html beside the studies/ folder, or beside the study YAML")] = None,
    watch: Annotated[bool, typer.Option(help="re-render every few seconds while a study runs")] = False,
    every: Annotated[float, typer.Option(help="seconds between renders with --watch")] = 5.0,
) -> None:
    """Write one self-contained HTML dashboard (plotly, opens offline); reads the storages, never writes them."""
    for path in studies:
        _read(path)  # says if a YAML changed since its study was made
    target = _render(studies, out_path)
    out.print(f"dashboard: {target}")
    while watch:
        time.sleep(every)
        _render(studies, out_path)


@app.command()
def recommend(
    study: Annotated[Path, typer.Argument()],
    budget: Annotated[str, typer.Option(help="60M, 250k, 1.5e6, or 10%-below-baseline")],
    verify: Annotated[bool, typer.Option(help="queue the recommended configuration and its neighbours in the study")] = False,
) -> None:
    """The best (layers, heads) split within a parameter budget, measured or (marked) predicted."""
    from explorer.frame import trials_frame
    from explorer.recommend import parse_budget
    from explorer.recommend import recommend as best
    from explorer.study import load_study_spec

    base = load_study_spec(study).space.baseline
    limit = parse_budget(budget, base.params if base else None)  # a bad budget is said before the storage is opened
    s, ostudy, changed = _read(study)
    rec = best(trials_frame(ostudy), limit, base.key if base else None, s.task.metric,
               [(c.key, c.dims, c.params) for c in s.space.configs()], s.task.higher_is_better)
    for line in rec.lines():
        out.print(line, markup=False)
    if verify:
        if changed:
            raise ExplorerError(f"not queued: {changed.removesuffix('; rerun with --force to continue it anyway')}", source=str(study))
        queued = s.queue_verification(ostudy, list(rec.verify))
        out.print(f"queued {len(queued)} unmeasured configurations ({'; '.join(queued) or 'none'}); "
                  f"run them with: explorer resume {study}", markup=False)


class RegimeChoice(str, Enum):
    fixed_width = "fixed-width"
    fixed_head_dim = "fixed-head-dim"
    both = "both"


@app.command()
def condition(
    space: Annotated[Path, typer.Argument(help="a space YAML")],
    task: Annotated[str, typer.Option(help="task name, e.g. digits")] = "digits",
    option: Annotated[list[str], typer.Option(help="task option NAME=VALUE (repeatable)")] = [],
    seeds: Annotated[int, typer.Option(help="initialisations to average over")] = 3,
    regime: Annotated[RegimeChoice, typer.Option(
        help="fixed-width: the space's configurations; fixed-head-dim: each at width heads x --head-dim "
             "(the theorem's case, where a Gaussian A's κ falls with heads); or both")] = RegimeChoice.fixed_width,
    head_dim: Annotated[Optional[int], typer.Option(
        min=1, help="head dimension of the fixed-head-dim sweep (default: the space's largest)")] = None,
    format: Annotated[Format, typer.Option("--format", "-f")] = Format.table,
) -> None:
    """κ(A) = σ₁/σ_k of the attention blocks' concatenated head outputs at initialisation, against heads.

    At fixed width, a Gaussian model of A predicts κ independent of heads; the fall measured there
    comes from near-uniform attention at initialisation (each head's output close to rank one).
    Only at fixed head dimension does the Gaussian κ fall with heads (Theorem 3.2's setting).
    """
    from explorer.conditioning import REGIMES, condition_table
    from explorer.space import load_space
    from explorer.tasks import get_task

    options = {}
    for item in option:
        name, sep, value = item.partition("=")
        if not sep:
            raise ExplorerError(f"--option {item!r}: write NAME=VALUE", field="--option")
        options[name] = _scalar(value)
    sp = load_space(space)
    regimes = REGIMES if regime is RegimeChoice.both else (regime.value,)
    frame = condition_table(sp, get_task(task, options), seeds=tuple(range(seeds)), regimes=regimes, head_dim=head_dim)
    cols = ["regime", "width", "layers", "heads", "head_dim", "params", "kappa", "kappa_first", "kappa_last"]
    cols += [c for c in ("kappa_channel", "kappa_inner") if frame[c].notna().any()]
    if frame["missing"].map(len).any():  # blocks whose hook never fired, by name
        frame, cols = frame.assign(missing=frame["missing"].map(", ".join)), [*cols, "missing"]
    title = (f"κ at initialisation on {task}: token-attention blocks, geometric mean over blocks and {seeds} seeds"
             " (kappa_channel: channel attention, kappa_inner: TNT's inner attention)")
    _print_frame(frame[cols], format, title=title)


def main() -> None:
    """Entry point: user errors are one line on stderr and exit 1."""
    import warnings

    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # the progress bar, one line per failed trial and the tables say it
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeats, since Optuna 2.8
    try:
        app(standalone_mode=False)
    except ExplorerError as e:
        err.print(f"error: {e}", markup=False, highlight=False)
        raise SystemExit(1) from None
    except (typer.Exit, SystemExit) as e:
        raise SystemExit(getattr(e, "exit_code", getattr(e, "code", 0))) from None
    except Exception as e:
        import click

        if isinstance(e, click.exceptions.ClickException):
            e.show()
            raise SystemExit(e.exit_code) from None
        if isinstance(e, click.exceptions.Abort):
            raise SystemExit(130) from None
        raise


if __name__ == "__main__":
    main()
