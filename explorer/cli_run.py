"""`explorer run` and `explorer resume`: the study trained until it has n_trials finished trials, its progress
shown as it goes (a bar on a terminal, a line per finished run in a pipe, a log or CI), then its status."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from explorer import cli_app
from explorer.cli_app import STUDY, app
from explorer.cli_read import show_status
from explorer.cli_usage import Command
from explorer.errors import ExplorerError
from explorer.formats import epochs_words, plural, split, value
from explorer.terminal import say


class Shown:
    """What `run` shows while it trains, on stderr: a progress bar on a terminal; elsewhere (a pipe, a log
    file, CI, nohup) a line per finished run, since a bar there shows nothing until the end."""

    def __init__(self, name: str, total: int, metric: str, higher_is_better: bool, ladder: list[int]):
        self.con = cli_app.err
        self.metric, self.higher_is_better = metric, higher_is_better
        self.length = ladder[0] if len(ladder) == 1 else None  # a run of a ladder records its own
        self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[front]}"), TimeElapsedColumn(), console=self.con, transient=False) \
            if self.con.is_terminal else None
        self.task = self.bar.add_task(name, total=total, completed=0, front="") if self.bar else None
        self.started = False

    def say(self, text: str) -> None:
        say(self.bar.console if self.bar else self.con, text)

    def start(self, done: int, planned: int) -> None:
        if self.bar:
            self.bar.update(self.task, completed=done, total=planned)
            self.bar.start()
        elif done < planned:
            say(self.con, f"{done} of {plural(planned, 'run')} planned so far done; a line as each ends")
        self.started = True

    def trial(self, ostudy: Any, t: Any, done: int, planned: int) -> None:
        if self.bar:
            self.bar.update(self.task, completed=done, total=planned,
                            front=f"front: {len(ostudy.best_trials)} | last: #{t.number} {t.state.name.lower()}")
            return
        attrs = t.user_attrs
        length = attrs.get("epochs", self.length)
        what = ", ".join(filter(None, (split(str(t.params.get("arch"))), f"seed {attrs['seed']}" if "seed" in attrs else "",
                                      epochs_words(length) if length else "")))
        result = t.state.name.lower()
        if t.state.name == "COMPLETE" and isinstance(attrs.get(self.metric), (int, float)):
            result = f"{self.metric} {value(attrs[self.metric], self.higher_is_better)}"
        seconds = attrs.get("trial_time_s")
        took = f" in {seconds:.0f} s" if isinstance(seconds, (int, float)) and seconds >= 1 else ""
        say(self.con, f"{done}/{planned} runs: trial {t.number} ({what}): {result}{took}")

    def stop(self) -> None:
        if self.bar and self.started:
            self.bar.stop()


def _run(path: Path, *, dashboard: bool, **options: Any) -> None:  # options: Experiment.run's
    """Run or resume; what the YAML or the machine make certain to fail (storage, devices, a study never
    run) fails before anything is printed: the paths and the progress start once the storage is open."""
    from explorer import api

    exp = api.load(path)
    if options["executor"]:
        _executor_name(options["executor"])
    failed: list[int] = []
    shown = Shown(exp.name, exp.spec.n_trials, exp.metric, exp.study.task.higher_is_better, exp.spec.budget.ladder)

    def on_start(started: api.Started) -> None:
        for key, where in exp.paths().items():  # every place this run reads or writes, stated before any trial
            say(cli_app.err, f"{key}: {where}")
        if started.reclaimed:
            say(cli_app.err, f"reclaimed running trials {started.reclaimed}: their configurations are queued again")
        if started.retried:
            say(cli_app.err, f"queued again {plural(len(started.retried), 'failed configuration')}: "
                             f"{', '.join(map(split, started.retried))}")
        for note in filter(None, (started.execution, started.grid_note, started.tracking)):
            say(cli_app.err, note)
        shown.start(*exp.progress(started.ostudy))

    def on_trial(s: Any, t: Any) -> None:
        if t.state.name == "FAIL" and "fail_reason" in t.user_attrs:  # one line each; reasons stay in `status`
            failed.append(t.number)
            shown.say(f"trial {t.number} ({split(str(t.params.get('arch')))}) failed: {t.user_attrs['fail_reason']}")
        shown.trial(s, t, *exp.progress(s))

    try:
        exp.run(**options, on_start=on_start, on_trial=on_trial)
    finally:
        shown.stop()
    show_status(exp, path, failures=False)  # this run's failures were said as they happened
    stalled = exp.stalled()
    if stalled:
        say(cli_app.err, stalled)
    if dashboard:
        say(cli_app.out, f"dashboard: {api.dashboard([path])}")
    if failed:
        raise ExplorerError(f"{plural(len(failed), 'trial')} failed in this run (reasons above and in `explorer status`); "
                            f"once the cause is fixed, `explorer run {path} --retry-failed` runs them again", source=str(path))


def _executor_name(name: str) -> str:
    """`--executor`, validated like the YAML's `executor.name`."""
    from explorer import api

    choices = api.executor_names()
    if name not in choices:
        raise ExplorerError(f"{name!r} is not an executor; choose {' or '.join(choices)}", field="--executor")
    return name


_EXECUTOR = "local or ray (overrides the YAML's executor.name)"
_ADDRESS = "the Ray cluster to join: auto, or the head's host:port"
_DEVICE = "auto, cpu or cuda: what trials train on (overrides executor.device)"
_FORCE = "continue a stored study even if its space, task or budget changed"
_RETRY = "queue again the configurations whose trials failed (after fixing the cause)"
_TRACKING = "mlflow, tensorboard, mlflow=URI, tensorboard=DIR or none (repeatable; over the YAML's tracking:)"
_DASHBOARD = "write the dashboard when done (default: write it)"


@app.command(cls=Command, short_help="Run a study until it has n_trials finished trials.")
def run(
    study: Annotated[Path, typer.Argument(metavar="STUDY", help=f"{STUDY} (see studies/)")],
    executor: Annotated[Optional[str], typer.Option(metavar="NAME", help=_EXECUTOR)] = None,
    address: Annotated[Optional[str], typer.Option(metavar="ADDRESS", help=_ADDRESS)] = None,
    device: Annotated[Optional[str], typer.Option(metavar="DEVICE", help=_DEVICE)] = None,
    force: Annotated[bool, typer.Option("--force", help=_FORCE)] = False,
    retry_failed: Annotated[bool, typer.Option("--retry-failed", help=_RETRY)] = False,
    dashboard: Annotated[bool, typer.Option(help=_DASHBOARD, show_default=False)] = True,
    tracking: Annotated[list[str], typer.Option(metavar="NAME[=WHERE]", help=_TRACKING)] = [],
) -> None:
    """Run a study (create it, or continue the stored one) until it has n_trials finished trials."""
    _run(study, resume=False, force=force, executor=executor, address=address, device=device, reclaim=False,
         retry_failed=retry_failed, dashboard=dashboard, tracking=tracking)


@app.command(cls=Command, short_help="Continue a stored study after a crash or an interrupt.")
def resume(
    study: Annotated[Path, typer.Argument(metavar="STUDY", help=f"{STUDY} whose study was started with `explorer run`")],
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
    _run(study, resume=True, force=force, executor=executor, address=address, device=device, reclaim=reclaim,
         retry_failed=retry_failed, dashboard=dashboard, tracking=tracking)
