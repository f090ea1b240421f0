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

import time  # noqa: E402
from enum import Enum  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Annotated, Any, Optional  # noqa: E402

import typer  # noqa: E402
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: E402

from explorer import terminal  # noqa: E402
from explorer.cli_usage import Command, explorer_version, failed  # noqa: E402
from explorer.errors import ExplorerError  # noqa: E402
from explorer.formats import plural, split  # noqa: E402
from explorer.terminal import say  # noqa: E402

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Which (layers, heads) split gives the best accuracy for a parameter budget?")
out = terminal.console()
err = terminal.console(stderr=True)


def _version(shown: bool) -> None:
    if shown:
        say(out, explorer_version())
        raise typer.Exit()


@app.callback()
def _explorer(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                     help="Print explorer's version and exit.")] = False) -> None:
    """Which (layers, heads) split gives the best accuracy for a parameter budget?"""


class Format(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"


def _print_frame(frame, fmt: Format, title: str | None = None) -> None:
    """A pandas frame as a table (explorer.terminal: it fits the terminal where words allow), CSV or JSON on stdout."""
    if fmt is Format.csv:
        sys.stdout.write(frame.to_csv(index=False))
    elif fmt is Format.json:
        sys.stdout.write(frame.to_json(orient="records", indent=1) + "\n")
    else:
        terminal.print_table(out, *terminal.raw_table(frame), title=title)


# -- params -------------------------------------------------------------------------------------------
_DIM = "one configuration's {} (with --family)"


@app.command(cls=Command, short_help="Count parameters exactly: a space's configurations, or one.")
def params(
    space: Annotated[Optional[Path], typer.Argument(metavar="SPACE", help="a space YAML; omit to count one configuration")] = None,
    family: Annotated[Optional[str], typer.Option(metavar="FAMILY", help="the family of one configuration to count")] = None,
    layers: Annotated[Optional[int], typer.Option(metavar="N", help=_DIM.format("layers"))] = None,
    heads: Annotated[Optional[int], typer.Option(metavar="N", help=_DIM.format("attention heads"))] = None,
    width: Annotated[Optional[int], typer.Option(metavar="N", help=_DIM.format("width (model dimension)"))] = None,
    mlp: Annotated[Optional[int], typer.Option(metavar="N", help=_DIM.format("MLP hidden width"))] = None,
    dim: Annotated[list[str], typer.Option(metavar="NAME=VALUE", help="another dimension (repeatable)")] = [],
    format: Annotated[Format, typer.Option("--format", "-f", metavar="[table|csv|json]",
                                           help="a table, or csv or json for other programs")] = Format.table,
) -> None:
    """Count parameters exactly: every feasible configuration of a space, or one configuration of a family
    (dimensions not given take the family's defaults, which the title names)."""
    from explorer import api

    given = {k: v for k, v in dict(layers=layers, heads=heads, width=width, mlp=mlp).items() if v is not None}
    for item in dim:
        name, sep, value = item.partition("=")
        if not sep:
            raise ExplorerError(f"--dim {item!r}: write NAME=VALUE", field="--dim")
        given[name] = _scalar(value)
    if space is not None and (family is not None or given):
        flag = "--family" if family is not None else next((f"--{k}" for k in given if k in ("layers", "heads", "width", "mlp")), "--dim")
        raise ExplorerError(f"counts one configuration of a family, and {space} lists its own (its family and "
                            "dimensions): give the space or --family with dimensions, not both", field=flag)
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
    """Run or resume; what the YAML or the machine make certain to fail (storage, devices, a study never
    run) fails before anything is printed: the paths and the progress bar start once the storage is open."""
    from explorer import api

    exp = api.load(path)
    if options["executor"]:
        _executor_name(options["executor"])
    failed: list[int] = []
    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.fields[front]}"), TimeElapsedColumn(), console=err, transient=False)
    task = bar.add_task(exp.name, total=exp.spec.n_trials, completed=0, front="")

    def on_start(started: api.Started) -> None:
        for key, value in exp.paths().items():  # every place this run reads or writes, stated before any trial
            say(err, f"{key}: {value}")
        if started.reclaimed:
            say(err, f"reclaimed running trials {started.reclaimed}: their configurations are queued again")
        if started.retried:
            say(err, f"queued again {plural(len(started.retried), 'failed configuration')}: {', '.join(map(split, started.retried))}")
        for note in filter(None, (started.execution, started.grid_note, started.tracking)):
            say(err, note)
        done, planned = exp.progress(started.ostudy)
        bar.update(task, completed=done, total=planned)
        bar.start()

    def on_trial(s, t) -> None:
        if t.state.name == "FAIL" and "fail_reason" in t.user_attrs:  # one line each; reasons stay in `status`
            failed.append(t.number)
            say(bar.console, f"trial {t.number} ({split(str(t.params.get('arch')))}) failed: {t.user_attrs['fail_reason']}")
        done, planned = exp.progress(s)
        bar.update(task, completed=done, total=planned, front=f"front: {len(s.best_trials)} | last: #{t.number} {t.state.name.lower()}")

    try:
        exp.run(**options, on_start=on_start, on_trial=on_trial)
    finally:
        bar.stop()
    _status(exp, failures=False)  # this run's failures were said as they happened
    stalled = exp.stalled()
    if stalled:
        say(err, stalled)
    if dashboard:
        say(out, f"dashboard: {api.dashboard([path])}")
    if failed:
        raise ExplorerError(f"{plural(len(failed), 'trial')} failed in this run (reasons above and in `explorer status`)",
                            source=str(path))


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
        say(err, f"note: {path}: {changed.replace('rerun with --force', '`explorer run --force`')}; showing the stored trials")
    return exp, changed


_STUDY = "a study YAML"
_EXECUTOR = "local or ray (overrides the YAML's executor.name)"
_ADDRESS = "the Ray cluster to join: auto, or the head's host:port"
_DEVICE = "auto, cpu or cuda: what trials train on (overrides executor.device)"
_FORCE = "continue a stored study even if its space, task or budget changed"
_RETRY = "queue again the configurations whose trials failed (after fixing the cause)"
_TRACKING = "mlflow, tensorboard, mlflow=URI, tensorboard=DIR or none (repeatable; over the YAML's tracking:)"
_DASHBOARD = "write the dashboard when done (default: write it)"


@app.command(cls=Command, short_help="Run a study until it has n_trials finished trials.")
def run(
    study: Annotated[Path, typer.Argument(metavar="STUDY", help=f"{_STUDY} (see studies/)")],
    executor: Annotated[Optional[str], typer.Option(metavar="NAME", help=_EXECUTOR)] = None,
    address: Annotated[Optional[str], typer.Option(metavar="ADDRESS", help=_ADDRESS)] = None,
    device: Annotated[Optional[str], typer.Option(metavar="DEVICE", help=_DEVICE)] = None,
    force: Annotated[bool, typer.Option("--force", help=_FORCE)] = False,
    retry_failed: Annotated[bool, typer.Option("--retry-failed", help=_RETRY)] = False,
    dashboard: Annotated[bool, typer.Option(help=_DASHBOARD, show_default=False)] = True,
    tracking: Annotated[list[str], typer.Option(metavar="NAME[=WHERE]", help=_TRACKING)] = [],
) -> None:
    """Run a study (create it, or continue the stored one) until it has n_trials finished trials."""
    _run(study, resume=False, force=force, executor=executor, address=address, device=device, reclaim=False, retry_failed=retry_failed, dashboard=dashboard, tracking=tracking)


@app.command(cls=Command, short_help="Continue a stored study after a crash or an interrupt.")
def resume(
    study: Annotated[Path, typer.Argument(metavar="STUDY", help=f"{_STUDY} whose study was started with `explorer run`")],
    executor: Annotated[Optional[str], typer.Option(metavar="NAME", help=_EXECUTOR)] = None,
    address: Annotated[Optional[str], typer.Option(metavar="ADDRESS", help=_ADDRESS)] = None,
    device: Annotated[Optional[str], typer.Option(metavar="DEVICE", help=_DEVICE)] = None,
    reclaim: Annotated[bool, typer.Option("--reclaim", help="fail and queue again RUNNING trials now (no other worker alive)")] = False,
    force: Annotated[bool, typer.Option("--force", help=_FORCE)] = False,
    retry_failed: Annotated[bool, typer.Option("--retry-failed", help=_RETRY)] = False,
    dashboard: Annotated[bool, typer.Option(help=_DASHBOARD, show_default=False)] = True,
    tracking: Annotated[list[str], typer.Option(metavar="NAME[=WHERE]", help=_TRACKING)] = [],
) -> None:
    """Continue a stored study; trials a dead worker left running are run again, finished ones kept."""
    _run(study, resume=True, force=force, executor=executor, address=address, device=device, reclaim=reclaim, retry_failed=retry_failed,
         dashboard=dashboard, tracking=tracking)


# -- status / export ------------------------------------------------------------------------------------------
def _status(exp, failures: bool = True, list_ties: bool = False) -> None:
    from explorer import reports

    st = exp.status()
    _say(reports.answers(st))  # the study's answer at each of its budgets first
    measured, failed = st.outcomes
    say(out, f"{st.name}: {measured}/{st.n_trials} configurations measured" + (f" ({failed} more failed)" if failed else "")
        + f", {plural(st.runs, 'run')}; " + ", ".join(f"{k.lower()} {v}" for k, v in sorted(st.states.items()))
        + (f"; {plural(st.duplicates, 'proposal')} of measured configurations answered from storage" if st.duplicates else ""))
    if st.set_aside:
        say(out, f"{plural(st.set_aside, 'trial')} of an earlier version of this study (another space, task, budget or "
                 "objectives: before `run --force`) kept in the storage and set aside")
    if st.classes:
        say(out, st.classes)
    if len(st.seeds) > 1 and st.replicate_at_max:
        policy = st.replicates
        how = f"adaptive, confidence {policy['confidence']:g}" if policy["policy"] == "adaptive" else policy["policy"]
        say(out, f"replicates ({how}), seeds {st.seeds}: {plural(st.replicate_runs, 'run')} of the {st.replicate_at_max} that "
                 f"every measured configuration at {len(st.seeds)} seeds would take ({st.replicate_runs / max(st.replicate_at_max, 1):.0%})")
    if len(st.summary):
        _say(reports.front(st, list_ties))
    frame = st.trials
    failed = frame[frame["state"] == "FAIL"] if failures else frame.iloc[0:0]
    for row in failed.itertuples():
        if isinstance(row.fail_reason, str):
            say(out, f"trial {row.number} ({split(str(row.arch))}) failed: {row.fail_reason}")


def _say(said) -> None:
    """A table of explorer.reports (the answers at the study's budgets, the front) with its title and notes."""
    if said is not None:
        terminal.print_table(out, said.frame, said.layout, said.title, said.notes)


@app.command(cls=Command, short_help="The answers, trials by state and the Pareto front.")
def status(
    study: Annotated[Path, typer.Argument(metavar="STUDY", help=_STUDY)],
    list_ties: Annotated[bool, typer.Option("--list-ties", help="list the configurations tied with a front member, one a "
                                                                "line (default: their count)")] = False,
) -> None:
    """The answer at each of the study's budgets, its trials by state and its Pareto front (reads the
    storage, never writes it)."""
    exp, _ = _read(study)
    _status(exp, list_ties=list_ties)


class ExportFormat(str, Enum):
    csv = "csv"
    parquet = "parquet"


@app.command(cls=Command, short_help="Write the trials and configurations tables (CSV or parquet).")
def export(
    study: Annotated[Path, typer.Argument(metavar="STUDY", help=_STUDY)],
    format: Annotated[Optional[ExportFormat], typer.Option("--format", "-f", metavar="[csv|parquet]",
                                                           help="csv or parquet (types kept); default: --out's extension, "
                                                                "else csv")] = None,
    out_path: Annotated[Optional[Path], typer.Option("--out", "-o", metavar="PATH", help="default: beside the study YAML")] = None,
) -> None:
    """Write the trials table and, beside it, the per-configuration table, with pandas.

    The trials table has one row per measurement (duplicates answered from storage left out). The
    configurations table (`--out t.csv` also writes `t.configs.csv`; parquet likewise) has one row per
    configuration from its seeds: arch, its dimensions, params, n (seeds measured), mean, std, se, lo and
    hi (the 95% posterior interval of the mean; raw: the mean of its seeds), front_prob (probability of
    being on the Pareto front of the study's objectives), on_front (on the front of means), tied_with
    (for one off the front, the front member it is statistically tied with), seeds and values (the
    metric by seed; JSON lists in CSV). The format follows --out's extension (.csv, .parquet).
    """
    exp, _ = _read(study)
    target, beside, trials, configs = exp.export(out_path or study.with_suffix(f".{format.value if format else 'csv'}"),
                                                 format.value if format else None)
    say(out, f"{plural(trials, 'trial')} -> {target}")
    say(out, f"{plural(configs, 'configuration')} -> {beside}")


# -- dashboard / recommend / condition ---------------------------------------------------------------------------
@app.command(cls=Command, short_help="Write one self-contained HTML dashboard of studies.")
def dashboard(
    studies: Annotated[list[Path], typer.Argument(metavar="STUDY", help="one or more study YAMLs (several: compared on one front)")],
    out_path: Annotated[Optional[Path], typer.Option("--out", "-o", metavar="PATH", help="default: dashboards/NAME.html beside "
                                                     "the studies/ folder, or beside the study YAML")] = None,
    watch: Annotated[bool, typer.Option("--watch", help="render again every few seconds while a study runs")] = False,
    every: Annotated[float, typer.Option(metavar="SECONDS", min=0.1, help="seconds between renders with --watch, between the live page's updates with --serve")] = 5.0,
    serve: Annotated[bool, typer.Option("--serve", help="serve the report on http://HOST:PORT instead: the open page follows the studies live")] = False,
    host: Annotated[str, typer.Option(metavar="HOST", help="with --serve: the address to listen on (0.0.0.0: every interface)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(metavar="PORT", help="with --serve: the port to listen on (0: a free one)")] = 8050,
) -> None:
    """Write one self-contained HTML dashboard (plotly, opens offline), or serve it live; reads the storages, never writes them."""
    from explorer import api

    for path in studies:
        _read(path)  # says if a YAML changed since its study was made
    if serve:  # until Ctrl-C
        return api.serve(studies, host, port, every, lambda url: say(out, f"dashboard: {url} (live; Ctrl-C stops it)"))
    say(out, f"dashboard: {api.dashboard(studies, out_path)}")
    while watch:
        time.sleep(every)
        api.dashboard(studies, out_path)


@app.command(cls=Command, short_help="The split to use within a parameter budget, and how sure.")
def recommend(
    study: Annotated[Path, typer.Argument(metavar="STUDY", help=_STUDY)],
    budget: Annotated[str, typer.Option(metavar="BUDGET", help="60M, 250k, 1.5e6, or 10%-below-baseline")],
    verify: Annotated[bool, typer.Option("--verify", help="queue the recommended configuration's unmeasured neighbours in "
                                                          "the study (with --epochs: train the pick and its rivals longer now)")] = False,
    epochs: Annotated[Optional[int], typer.Option(metavar="N", min=1, help="answer at N epochs (default: the study's target "
                                                  "length, decision.epochs); with --verify: train the pick and the splits it "
                                                  "does not beat at N epochs (3 seeds, a study of its own) and say whether "
                                                  "the order held")] = None,
    list_ties: Annotated[bool, typer.Option("--list-ties", help="list the configurations not told apart from the pick, one "
                                                                "a line (default: their count)")] = False,
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
        say(out, line)
    if verify and epochs is not None:
        for line in exp.verify_longer(rec, epochs):
            say(out, line)
        return
    if verify and rec.outside is not None:  # past the space: it cannot be queued in the study, it is trained now
        for line in exp.verify_outside(rec):
            say(out, line)
        return
    if verify:
        if changed:
            raise ExplorerError(f"not queued: {changed.removesuffix('; rerun with --force to continue it anyway')}", source=str(study))
        queued = exp.verify(rec)
        say(out, f"queued {plural(len(queued), 'unmeasured configuration')} ({', '.join(map(split, queued)) or 'none'}); "
                 f"run them with: explorer resume {study}")


class RegimeChoice(str, Enum):
    fixed_width = "fixed-width"
    fixed_head_dim = "fixed-head-dim"
    both = "both"


@app.command(cls=Command, short_help="κ of the attention blocks at initialisation, against heads.")
def condition(
    space: Annotated[Path, typer.Argument(metavar="SPACE", help="a space YAML")],
    task: Annotated[str, typer.Option(metavar="NAME", help="task name, e.g. digits")] = "digits",
    option: Annotated[list[str], typer.Option(metavar="NAME=VALUE", help="a task option (repeatable)")] = [],
    seeds: Annotated[int, typer.Option(metavar="N", min=1, help="initialisations to average over")] = 3,
    regime: Annotated[RegimeChoice, typer.Option(metavar="[fixed-width|fixed-head-dim|both]",
        help="fixed-width: the space's configurations; fixed-head-dim: each at width heads x --head-dim "
             "(the theorem's case, where a Gaussian A's κ falls with heads); or both")] = RegimeChoice.fixed_width,
    head_dim: Annotated[Optional[int], typer.Option(
        metavar="N", min=1, help="head dimension of the fixed-head-dim sweep (default: the space's largest)")] = None,
    format: Annotated[Format, typer.Option("--format", "-f", metavar="[table|csv|json]",
                                           help="a table, or csv or json for other programs")] = Format.table,
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
             " (κ channel: channel attention, κ inner: TNT's inner attention)")
    _print_frame(frame[cols], format, title=title)


def main() -> None:
    """Entry point: user errors are one line on stderr (exit 1), a command-line mistake a usage line and one
    error line (exit 2); an interrupt exits 130 with the way on."""
    signal.signal(signal.SIGINT, _interrupted_while_starting)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID`: every thread's stack on stderr (why a worker waits)
    from explorer.api import quiet  # torch, optuna, pandas: an interrupt inside some of their C code makes the
    # interpreter die by SIGINT at exit whatever we catch, so while they load it leaves at once (nothing is open yet)

    signal.signal(signal.SIGINT, signal.default_int_handler)  # from here on an interrupt unwinds: stored results stay
    try:
        with quiet():  # the progress bar, one line per failed trial and the tables say it
            code = app(standalone_mode=False, prog_name="explorer")  # typer answers Ctrl-C with 130, returned here
    except KeyboardInterrupt:  # before typer took over
        code = 130
    except (typer.Exit, SystemExit) as e:
        code = getattr(e, "exit_code", getattr(e, "code", 0))
    except Exception as e:
        code = failed(e, err, app, sys.argv[1:])
    if code == 130:
        say(err, _interrupted(sys.argv[1:]))
        # CPython remembers an interrupt that ended a string `exec` (dataclasses, typing and torch generate code
        # so) even once caught, and under `python -m` dies by SIGINT at exit instead of exiting 130; an empty
        # string exec clears that flag
        exec("")
    raise SystemExit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
