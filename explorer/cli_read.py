"""The commands that read a study's storage and never write it: `status`, `export`, `dashboard` and
`recommend` (whose `--verify` queues or trains on purpose). Each count says the length it is at where the
study trains several."""

from __future__ import annotations

import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from explorer import cli_app
from explorer.cli_app import STUDY, app, read_study, say_table
from explorer.cli_usage import Command
from explorer.errors import ExplorerError
from explorer.formats import plural, split
from explorer.terminal import say


def show_status(exp: Any, path: Path, failures: bool = True, list_ties: bool = False) -> None:
    """The answers at the study's budgets first, then its runs by state and length, replicate compute, the
    front, and (with `failures`) why each failed trial failed, with the way to run them again."""
    from explorer import reports

    st = exp.status()
    say_table(reports.answers(st))
    for line in reports.counts(st):
        say(cli_app.out, line)
    if len(st.summary):
        say_table(reports.front(st, list_ties))
    frame = st.trials
    failed = frame[frame["state"] == "FAIL"] if failures else frame.iloc[0:0]
    for row in failed.itertuples():
        if isinstance(row.fail_reason, str):
            say(cli_app.out, f"trial {row.number} ({split(str(row.arch))}) failed: {row.fail_reason}")
    left = st.outcomes[1]
    if left:
        say(cli_app.out, f"{plural(left, 'configuration')} failed in every trial: once the cause is fixed, "
                         f"`explorer run {path} --retry-failed` runs {'it' if left == 1 else 'them'} again")


@app.command(cls=Command, short_help="The answers, trials by state and the Pareto front.")
def status(
    study: Annotated[Path, typer.Argument(metavar="STUDY", help=STUDY)],
    list_ties: Annotated[bool, typer.Option("--list-ties", help="list the configurations tied with a front member, one a "
                                                                "line (default: their count)")] = False,
) -> None:
    """The answer at each of the study's budgets, its trials by state and its Pareto front (reads the
    storage, never writes it)."""
    exp, _ = read_study(study)
    show_status(exp, study, list_ties=list_ties)


class ExportFormat(str, Enum):
    csv = "csv"
    parquet = "parquet"


@app.command(cls=Command, short_help="Write the trials and configurations tables (CSV or parquet).")
def export(
    study: Annotated[Path, typer.Argument(metavar="STUDY", help=STUDY)],
    format: Annotated[Optional[ExportFormat], typer.Option("--format", "-f", metavar="[csv|parquet]",
                                                           help="csv or parquet (types kept); default: --out's extension, "
                                                                "else csv")] = None,
    out_path: Annotated[Optional[Path], typer.Option("--out", "-o", metavar="PATH", help="default: beside the study YAML")] = None,
) -> None:
    """Write the trials table and, beside it, the per-configuration table, with pandas.

    The trials table has one row per trial that ran (duplicates answered from storage and queued trials
    never started left out). The configurations table (`--out t.csv` also writes `t.configs.csv`; parquet
    likewise) has one row per configuration and length from its seeds: arch, its dimensions, params, epochs
    (the length the row is at), n (seeds measured at that length), mean, std, se, lo and hi (the 95%
    posterior interval of the mean; raw: the mean of its seeds), front_prob (probability of being on the
    Pareto front of the study's objectives), on_front (on the front of means), tied_with (for one off the
    front, the front member it is statistically tied with), seeds and values (the metric by seed; JSON lists
    in CSV). The format follows --out's extension (.csv, .parquet).
    """
    exp, _ = read_study(study)
    written = exp.export(out_path or study.with_suffix(f".{format.value if format else 'csv'}"),
                         format.value if format else None)
    for line in written.lines():
        say(cli_app.out, line)


@app.command(cls=Command, short_help="Write one self-contained HTML dashboard of studies.")
def dashboard(
    studies: Annotated[list[Path], typer.Argument(metavar="STUDY", help="one or more study YAMLs (several: compared on one front)")],
    out_path: Annotated[Optional[Path], typer.Option("--out", "-o", metavar="PATH", help="default: dashboards/NAME.html beside "
                                                     "the studies/ folder, or beside the study YAML")] = None,
    watch: Annotated[bool, typer.Option("--watch", help="render again every few seconds while a study runs")] = False,
    every: Annotated[float, typer.Option(metavar="SECONDS", min=0.1, help="seconds between renders with --watch, between the "
                                                                          "live page's updates with --serve")] = 5.0,
    serve: Annotated[bool, typer.Option("--serve", help="serve the report on http://HOST:PORT instead: the open page follows "
                                                        "the studies live")] = False,
    host: Annotated[str, typer.Option(metavar="HOST", help="with --serve: the address to listen on (0.0.0.0: every "
                                                           "interface)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(metavar="PORT", help="with --serve: the port to listen on (0: a free one)")] = 8050,
) -> None:
    """Write one self-contained HTML dashboard (plotly, opens offline), or serve it live; reads the storages, never writes them."""
    from explorer import api

    for path in studies:
        read_study(path)  # says if a YAML changed since its study was made
    if serve:  # until Ctrl-C
        return api.serve(studies, host, port, every, lambda url: say(cli_app.out, f"dashboard: {url} (live; Ctrl-C stops it)"))
    say(cli_app.out, f"dashboard: {api.dashboard(studies, out_path)}")
    if watch:
        say(cli_app.out, f"rendered again every {every:g} s while the studies run; Ctrl-C stops it")
    while watch:
        time.sleep(every)
        api.dashboard(studies, out_path)


_EXPLAIN = "say more: the posterior's model, the ties, neighbours to check, runs still learning"


@app.command(cls=Command, short_help="The split to use within a parameter budget, and how sure.")
def recommend(
    study: Annotated[Path, typer.Argument(metavar="STUDY", help=STUDY)],
    budget: Annotated[str, typer.Option(metavar="BUDGET", help="60M, 250k, 1.5e6, or 10%-below-baseline")],
    verify: Annotated[bool, typer.Option("--verify", help="queue the recommended configuration's unmeasured neighbours in "
                                                          "the study (with --epochs: train the pick and its rivals longer now)")] = False,
    epochs: Annotated[Optional[int], typer.Option(metavar="N", min=1, help="answer at N epochs (default: the study's target "
                                                  "length, decision.epochs); with --verify: train the pick and the splits it "
                                                  "does not beat at N epochs (3 seeds, a study of its own) and say whether "
                                                  "the order held")] = None,
    list_ties: Annotated[bool, typer.Option("--list-ties", help="list the configurations not told apart from the pick, one "
                                                                "a line (default: their count, with --explain)")] = False,
    explain: Annotated[bool, typer.Option("--explain", "-v", help=_EXPLAIN)] = False,
) -> None:
    """The best (layers, heads) split within a parameter budget at the length you will train, with the
    decision the seeds support, in a few lines (--explain says more); past the space, one answer from the
    same posterior (a split past it is marked predicted)."""
    from explorer import api

    exp = api.load(study)
    limit = exp.budget(budget)  # a bad budget is said before the storage is opened
    exp, changed = read_study(study)
    rec = exp.recommend(limit, list_ties=list_ties, epochs=None if verify else epochs)
    for line in rec.lines(explain=explain):
        say(cli_app.out, line)
    if verify and epochs is not None:
        for line in exp.verify_longer(rec, epochs):
            say(cli_app.out, line)
        return
    if verify and rec.outside is not None:  # past the space: it cannot be queued in the study, it is trained now
        for line in exp.verify_outside(rec):
            say(cli_app.out, line)
        return
    if verify:
        if changed:
            raise ExplorerError(f"not queued: {changed.removesuffix('; rerun with --force to continue it anyway')}", source=str(study))
        queued = exp.verify(rec)
        say(cli_app.out, f"queued {plural(len(queued), 'unmeasured configuration')} ({', '.join(map(split, queued)) or 'none'}); "
                         f"run them with: explorer resume {study}")
