"""The `explorer` command: parse, call the library, print. Errors are one line and exit 1."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys


def _interrupted(args: list[str]) -> str:
    """What an interrupt leaves: for `run` and `resume`, how to go on."""
    words = [a for a in args if not a.startswith("-")]
    if len(words) >= 2 and words[0] in ("run", "resume"):
        return f"interrupted: every finished trial is stored; continue with: explorer resume {words[1]}"
    return "interrupted"


def _interrupted_while_starting(signum: int, frame: object) -> None:
    """Ctrl-C while the modules below load: nothing is open or written yet, so leave at once (main() restores
    Python's own handler before any command runs)."""
    sys.stderr.write(_interrupted(sys.argv[1:]) + "\n")
    os._exit(130)


if __name__ == "__main__" or "explorer" in os.path.basename(sys.argv[0]):  # the command, not an import by a library
    signal.signal(signal.SIGINT, _interrupted_while_starting)

import math  # noqa: E402
import numbers  # noqa: E402
import time  # noqa: E402
from enum import Enum  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Annotated, Any, Optional  # noqa: E402

import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: E402
from rich.table import Table  # noqa: E402

from explorer.errors import ExplorerError  # noqa: E402

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
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
    import numpy as np
    import pandas as pd

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
    format: Annotated[Format, typer.Option("--format", "-f", help="a table, or csv or json for other programs")] = Format.table,
) -> None:
    """Count parameters exactly: every feasible configuration of a space, or one configuration."""
    from explorer import api

    given = {k: v for k, v in dict(layers=layers, heads=heads, width=width, mlp=mlp).items() if v is not None}
    for item in dim:
        name, sep, value = item.partition("=")
        if not sep:
            raise ExplorerError(f"--dim {item!r}: write NAME=VALUE", field="--dim")
        given[name] = _scalar(value)
    frame, title = api.params(space, family, given)
    _print_frame(frame, format, title=title)


def _scalar(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


# -- run / resume -----------------------------------------------------------------------------------------
def _run(path: Path, *, dashboard: bool, **options: Any) -> None:  # options: Experiment.run's
    from explorer import api

    exp = api.load(path)
    if options["executor"]:
        _executor_name(options["executor"])
    for key, value in exp.paths().items():  # every place this run reads or writes, stated up front
        err.print(f"{key}: {value}", markup=False, highlight=False)
    failed: list[int] = []
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[front]}"), TimeElapsedColumn(), console=err, transient=False) as bar:
        task = bar.add_task(exp.name, total=exp.spec.n_trials, completed=0, front="")

        def on_start(started: api.Started) -> None:
            if started.reclaimed:
                bar.console.print(f"reclaimed running trials {started.reclaimed}: their configurations are queued again")
            if started.retried:
                bar.console.print(f"queued again {len(started.retried)} failed configurations: {', '.join(started.retried)}",
                                  markup=False, highlight=False)
            for note in filter(None, (started.execution, started.grid_note, started.tracking)):
                bar.console.print(note, markup=False, highlight=False)
            done, planned = exp.progress(started.ostudy)
            bar.update(task, completed=done, total=planned)

        def on_trial(s, t) -> None:
            if t.state.name == "FAIL" and "fail_reason" in t.user_attrs:  # one line each; reasons stay in `status`
                failed.append(t.number)
                bar.console.print(f"trial {t.number} ({t.params.get('arch')}) failed: {t.user_attrs['fail_reason']}",
                                  markup=False, highlight=False)
            done, planned = exp.progress(s)
            bar.update(task, completed=done, total=planned, front=f"front: {len(s.best_trials)} | last: #{t.number} {t.state.name.lower()}")

        exp.run(**options, on_start=on_start, on_trial=on_trial)
    _status(exp, failures=False)  # this run's failures were said as they happened
    stalled = exp.stalled()
    if stalled:
        err.print(stalled, markup=False, highlight=False)
    if dashboard:
        out.print(f"dashboard: {api.dashboard([path])}")
    if failed:
        raise ExplorerError(f"{len(failed)} trials failed in this run (reasons above and in `explorer status`)", source=str(path))


def _executor_name(name: str) -> str:
    """`--executor`, validated like the YAML's `executor.name`."""
    from explorer import api

    choices = api.executor_names()
    if name not in choices:
        raise ExplorerError(f"{name!r} is not an executor; choose {' or '.join(choices)}", field="--executor")
    return name


def _read(path: Path):
    """A study for a read-only command; a changed YAML is said in one line."""
    from explorer import api

    exp = api.load(path)
    changed = exp.changed()
    if changed:
        err.print(f"note: {path}: {changed.replace('rerun with --force', '`explorer run --force`')}; showing the stored trials",
                  markup=False, highlight=False)
    return exp, changed


@app.command()
def run(
    study: Annotated[Path, typer.Argument(help="a study YAML (see studies/)")],
    executor: Annotated[Optional[str], typer.Option(help="local | ray (overrides the spec)")] = None,
    address: Annotated[Optional[str], typer.Option(help="Ray cluster to join: auto, or the head's host:port")] = None,
    device: Annotated[Optional[str], typer.Option(help="auto | cpu | cuda: what trials train on (overrides the spec)")] = None,
    force: Annotated[bool, typer.Option(help="continue a stored study even if its space/task/budget changed")] = False,
    retry_failed: Annotated[bool, typer.Option(help="queue again the configurations whose trials failed (after fixing the cause)")] = False,
    dashboard: Annotated[bool, typer.Option(help="write the dashboard when done")] = True,
    tracking: Annotated[list[str], typer.Option(metavar="NAME[=WHERE]", help="mlflow, tensorboard, mlflow=URI, tensorboard=DIR or none (repeatable; over the YAML's tracking:)")] = [],
) -> None:
    """Run a study (create it, or continue the stored one) until it has n_trials finished trials."""
    _run(study, resume=False, force=force, executor=executor, address=address, device=device, reclaim=False, retry_failed=retry_failed, dashboard=dashboard, tracking=tracking)


@app.command()
def resume(
    study: Annotated[Path, typer.Argument(help="a study YAML whose study was started with `explorer run`")],
    executor: Annotated[Optional[str], typer.Option(help="local | ray (overrides the spec)")] = None,
    address: Annotated[Optional[str], typer.Option(help="Ray cluster to join: auto, or the head's host:port")] = None,
    device: Annotated[Optional[str], typer.Option(help="auto | cpu | cuda: what trials train on (overrides the spec)")] = None,
    reclaim: Annotated[bool, typer.Option(help="fail and re-queue RUNNING trials now (no other worker alive)")] = False,
    force: Annotated[bool, typer.Option(help="continue a stored study even if its space/task/budget changed")] = False,
    retry_failed: Annotated[bool, typer.Option(help="queue again the configurations whose trials failed (after fixing the cause)")] = False,
    dashboard: Annotated[bool, typer.Option(help="write the dashboard when done")] = True,
    tracking: Annotated[list[str], typer.Option(metavar="NAME[=WHERE]", help="mlflow, tensorboard, mlflow=URI, tensorboard=DIR or none (repeatable; over the YAML's tracking:)")] = [],
) -> None:
    """Continue a stored study; trials a dead worker left running are re-run, finished ones kept."""
    _run(study, resume=True, force=force, executor=executor, address=address, device=device, reclaim=reclaim, retry_failed=retry_failed, dashboard=dashboard, tracking=tracking)


# -- status / export ------------------------------------------------------------------------------------------
def _status(exp, failures: bool = True, list_ties: bool = False) -> None:
    from explorer import reports

    st = exp.status()
    _say(reports.answers(st))  # the study's answer at each of its budgets first
    measured, failed = st.outcomes
    out.print(f"[bold]{st.name}[/]: {measured}/{st.n_trials} configurations measured"
              + (f" ({failed} more failed)" if failed else "") + f", {st.runs} runs; " + ", ".join(f"{k.lower()} {v}" for k, v in sorted(st.states.items()))
              + (f"; {st.duplicates} proposals of measured configurations answered from storage" if st.duplicates else ""))
    if st.set_aside:
        out.print(f"{st.set_aside} trials of an earlier version of this study (another space, task, budget or objectives: "
                  "before `run --force`) are kept in the storage and set aside", markup=False)
    if st.classes:
        out.print(st.classes, markup=False)
    if len(st.seeds) > 1 and st.replicate_at_max:
        policy = st.replicates
        how = f"adaptive, confidence {policy['confidence']:g}" if policy["policy"] == "adaptive" else policy["policy"]
        out.print(f"replicates ({how}), seeds {st.seeds}: {st.replicate_runs} runs of the {st.replicate_at_max} that every measured "
                  f"configuration at {len(st.seeds)} seeds would take ({st.replicate_runs / max(st.replicate_at_max, 1):.0%})", markup=False)
    if len(st.summary):
        _say(reports.front(st, list_ties))
    frame = st.trials
    failed = frame[frame["state"] == "FAIL"] if failures else frame.iloc[0:0]
    for row in failed.itertuples():
        if isinstance(row.fail_reason, str):
            out.print(f"trial {row.number} ({row.arch}) failed: {row.fail_reason}", markup=False)


def _say(said) -> None:
    """A table of explorer.reports (the answers at the study's budgets, the front) with its notes below."""
    if said is not None:
        _print_frame(said.frame, Format.table, title=said.title)
        for line in said.notes:
            out.print(line, markup=False)


@app.command()
def status(
    study: Annotated[Path, typer.Argument(help="a study YAML")],
    list_ties: Annotated[bool, typer.Option(help="list the configurations tied with a front member (default: their count)")] = False,
) -> None:
    """Counts of trials by state and the current Pareto front (reads the storage, never writes it)."""
    exp, _ = _read(study)
    _status(exp, list_ties=list_ties)


class ExportFormat(str, Enum):
    csv = "csv"
    parquet = "parquet"


@app.command()
def export(
    study: Annotated[Path, typer.Argument(help="a study YAML")],
    format: Annotated[ExportFormat, typer.Option("--format", "-f", help="csv, or parquet (types kept)")] = ExportFormat.csv,
    out_path: Annotated[Optional[Path], typer.Option("--out", "-o", help="default: beside the study YAML")] = None,
) -> None:
    """Write the trials table and, beside it, the per-configuration table, with pandas.

    The trials table has one row per measurement (duplicates answered from storage left out). The
    configurations table (`--out t.csv` also writes `t.configs.csv`; parquet likewise) has one row per
    configuration from its seeds: arch, its dimensions, params, n (seeds measured), mean, std, se, lo and
    hi (the 95% posterior interval of the mean; raw: the mean of its seeds), front_prob (probability of
    being on the Pareto front of the study's objectives), on_front (on the front of means), tied_with
    (for one off the front, the front member it is statistically tied with), seeds and values (the
    metric by seed; JSON lists in CSV).
    """
    exp, _ = _read(study)
    target, beside, trials, configs = exp.export(out_path or study.with_suffix(f".{format.value}"), format.value)
    out.print(f"{trials} trials -> {target}", markup=False, highlight=False)
    out.print(f"{configs} configurations -> {beside}", markup=False, highlight=False)


# -- dashboard / recommend / condition ---------------------------------------------------------------------------
@app.command()
def dashboard(
    studies: Annotated[list[Path], typer.Argument(help="one or more study YAMLs (several: compared on one front)")],
    out_path: Annotated[Optional[Path], typer.Option("--out", "-o", help="default: dashboards/<name>.html beside the studies/ folder, or beside the study YAML")] = None,
    watch: Annotated[bool, typer.Option(help="re-render every few seconds while a study runs")] = False,
    every: Annotated[float, typer.Option(help="seconds between renders with --watch, between the live page's updates with --serve")] = 5.0,
    serve: Annotated[bool, typer.Option(help="serve the report on http://HOST:PORT instead: the open page follows the studies live")] = False,
    host: Annotated[str, typer.Option(help="with --serve: the address to listen on (0.0.0.0: every interface)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="with --serve: the port to listen on (0: a free one)")] = 8050,
) -> None:
    """Write one self-contained HTML dashboard (plotly, opens offline), or serve it live; reads the storages, never writes them."""
    from explorer import api

    for path in studies:
        _read(path)  # says if a YAML changed since its study was made
    if serve:  # until Ctrl-C
        return api.serve(studies, host, port, every, lambda url: out.print(f"dashboard: {url} (live; Ctrl-C stops it)", markup=False))
    out.print(f"dashboard: {api.dashboard(studies, out_path)}")
    while watch:
        time.sleep(every)
        api.dashboard(studies, out_path)


@app.command()
def recommend(
    study: Annotated[Path, typer.Argument(help="a study YAML")],
    budget: Annotated[str, typer.Option(help="60M, 250k, 1.5e6, or 10%-below-baseline")],
    verify: Annotated[bool, typer.Option(help="queue the recommended configuration's unmeasured neighbours in the study "
                                              "(with --epochs: train the pick and its rivals longer now)")] = False,
    epochs: Annotated[Optional[int], typer.Option(min=1, help="answer at N epochs (default: the study's target length, "
                                                  "decision.epochs); with --verify: train the pick and the splits it does not "
                                                  "beat at N epochs (3 seeds, a study of its own) and say whether the order held")] = None,
    list_ties: Annotated[bool, typer.Option(help="list the configurations not distinguished from the pick (default: their count)")] = False,
) -> None:
    """The best (layers, heads) split within a parameter budget at the length you will train, with the
    decision the seeds support; past the space, one answer from the same posterior (a split past it is
    marked predicted)."""
    from explorer import api

    exp = api.load(study)
    limit = exp.budget(budget)  # a bad budget is said before the storage is opened
    exp, changed = _read(study)
    rec = exp.recommend(limit, list_ties=list_ties, epochs=None if verify else epochs)
    for line in rec.lines():
        out.print(line, markup=False)
    if verify and epochs is not None:
        for line in exp.verify_longer(rec, epochs):
            out.print(line, markup=False)
        return
    if verify and rec.outside is not None:  # past the space: it cannot be queued in the study, it is trained now
        for line in exp.verify_outside(rec):
            out.print(line, markup=False)
        return
    if verify:
        if changed:
            raise ExplorerError(f"not queued: {changed.removesuffix('; rerun with --force to continue it anyway')}", source=str(study))
        queued = exp.verify(rec)
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
    format: Annotated[Format, typer.Option("--format", "-f", help="a table, or csv or json for other programs")] = Format.table,
) -> None:
    """κ(A) = σ₁/σ_k of the attention blocks' concatenated head outputs at initialisation, against heads.

    At fixed width, a Gaussian model of A predicts κ independent of heads; the fall measured there
    comes from near-uniform attention at initialisation (each head's output close to rank one).
    Only at fixed head dimension does the Gaussian κ fall with heads (Theorem 3.2's setting).
    """
    from explorer import api
    from explorer.conditioning import REGIMES

    options = {}
    for item in option:
        name, sep, value = item.partition("=")
        if not sep:
            raise ExplorerError(f"--option {item!r}: write NAME=VALUE", field="--option")
        options[name] = _scalar(value)
    regimes = REGIMES if regime is RegimeChoice.both else (regime.value,)
    frame = api.condition(space, task, options, seeds=seeds, regimes=regimes, head_dim=head_dim)
    cols = ["regime", "width", "layers", "heads", "head_dim", "params", "kappa", "kappa_first", "kappa_last"]
    cols += [c for c in ("kappa_channel", "kappa_inner") if frame[c].notna().any()]
    if frame["missing"].map(len).any():  # blocks whose hook never fired, by name
        frame, cols = frame.assign(missing=frame["missing"].map(", ".join)), [*cols, "missing"]
    title = (f"κ at initialisation on {task}: token-attention blocks, geometric mean over blocks and {seeds} seeds"
             " (kappa_channel: channel attention, kappa_inner: TNT's inner attention)")
    _print_frame(frame[cols], format, title=title)


def main() -> None:
    """Entry point: user errors are one line on stderr and exit 1; an interrupt exits 130 with the way on."""
    signal.signal(signal.SIGINT, _interrupted_while_starting)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID`: every thread's stack on stderr (why a worker waits)
    from explorer.api import quiet  # torch, optuna, pandas: an interrupt inside some of their C code makes the
    # interpreter die by SIGINT at exit whatever we catch, so while they load it leaves at once (nothing is open yet)

    signal.signal(signal.SIGINT, signal.default_int_handler)  # from here on an interrupt unwinds: stored results stay
    try:
        with quiet():  # the progress bar, one line per failed trial and the tables say it
            code = app(standalone_mode=False)  # typer answers Ctrl-C with 130, returned here
    except KeyboardInterrupt:  # before typer took over
        code = 130
    except ExplorerError as e:
        err.print(f"error: {e}", markup=False, highlight=False)
        raise SystemExit(1) from None
    except (typer.Exit, SystemExit) as e:
        code = getattr(e, "exit_code", getattr(e, "code", 0))
    except Exception as e:
        import click

        if isinstance(e, click.exceptions.ClickException):
            e.show()
            raise SystemExit(e.exit_code) from None
        if isinstance(e, click.exceptions.Abort):
            code = 130
        else:
            raise
    if code == 130:
        err.print(_interrupted(sys.argv[1:]), markup=False, highlight=False)
        # CPython remembers an interrupt that ended a string `exec` (dataclasses, typing and torch generate code
        # so) even once caught, and under `python -m` dies by SIGINT at exit instead of exiting 130; an empty
        # string exec clears that flag
        exec("")
    raise SystemExit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
