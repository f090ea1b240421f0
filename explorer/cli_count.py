"""The commands that train nothing: `params` (exact parameter counts) and `condition` (κ of the attention
blocks at initialisation, against heads), each a table that fits the terminal, or CSV or JSON."""

from __future__ import annotations

import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from explorer import cli_app
from explorer.cli_app import FORMAT_HELP, Format, app, pairs, print_frame
from explorer.cli_usage import Command
from explorer.errors import ExplorerError
from explorer.formats import plural
from explorer.terminal import say

_DIM = "one configuration's {} (with --family)"
_SHOWN = ("layers", "heads", "width", "mlp")


@app.command(cls=Command, short_help="Count parameters exactly: a space's configurations, or one.")
def params(
    space: Annotated[Optional[Path], typer.Argument(metavar="SPACE", help="a space YAML; omit to count one configuration")] = None,
    family: Annotated[Optional[str], typer.Option(metavar="FAMILY", help="the family of one configuration to count")] = None,
    layers: Annotated[Optional[int], typer.Option(metavar="N", help=_DIM.format("layers"))] = None,
    heads: Annotated[Optional[int], typer.Option(metavar="N", help=_DIM.format("attention heads"))] = None,
    width: Annotated[Optional[int], typer.Option(metavar="N", help=_DIM.format("width (model dimension)"))] = None,
    mlp: Annotated[Optional[int], typer.Option(metavar="N", help=_DIM.format("MLP hidden width"))] = None,
    dim: Annotated[list[str], typer.Option(metavar="NAME=VALUE", help="another dimension (repeatable)")] = [],
    format: Annotated[Format, typer.Option("--format", "-f", metavar="[table|csv|json]", help=FORMAT_HELP)] = Format.table,
) -> None:
    """Count parameters exactly: every feasible configuration of a space, or one configuration of a family
    (dimensions not given take the family's defaults, which the title names)."""
    from explorer import api

    given = {k: v for k, v in dict(layers=layers, heads=heads, width=width, mlp=mlp).items() if v is not None}
    extra = pairs(dim, "--dim")
    if space is not None and (family is not None or given or extra):
        flag = "--family" if family is not None else next((f"--{k}" for k in given), "--dim")
        raise ExplorerError(f"counts one configuration of a family, and {space} lists its own (its family and "
                            "dimensions): give the space or --family with dimensions, not both", field=flag)
    frame, title = api.params(space, family, {**given, **extra})
    if format is Format.table and space is None:  # one configuration: its title names the dimensions --dim gave
        frame = frame.drop(columns=[k for k in extra if k not in _SHOWN])
    print_frame(frame, format, title=title)


class RegimeChoice(str, Enum):
    fixed_width = "fixed-width"
    fixed_head_dim = "fixed-head-dim"
    both = "both"


_REGIME = ("fixed-width: the space's configurations; fixed-head-dim: each at width heads x --head-dim (the theorem's "
           "case, where a Gaussian A's κ falls with heads); or both")


@app.command(cls=Command, short_help="κ of the attention blocks at initialisation, against heads.")
def condition(
    space: Annotated[Path, typer.Argument(metavar="SPACE", help="a space YAML")],
    task: Annotated[str, typer.Option(metavar="NAME", help="task name, e.g. digits")] = "digits",
    option: Annotated[list[str], typer.Option(metavar="NAME=VALUE", help="a task option (repeatable)")] = [],
    seeds: Annotated[int, typer.Option(metavar="N", min=1, help="initialisations to average over")] = 3,
    regime: Annotated[RegimeChoice, typer.Option(metavar="[fixed-width|fixed-head-dim|both]", help=_REGIME)] = RegimeChoice.fixed_width,
    head_dim: Annotated[Optional[int], typer.Option(
        metavar="N", min=1, help="head dimension of the fixed-head-dim sweep (default: the space's largest)")] = None,
    format: Annotated[Format, typer.Option("--format", "-f", metavar="[table|csv|json]", help=FORMAT_HELP)] = Format.table,
) -> None:
    """κ(A) = σ₁/σ_k of the attention blocks' concatenated head outputs at initialisation, against heads.

    At fixed width, a Gaussian model of A predicts κ independent of heads; the fall measured there
    comes from near-uniform attention at initialisation (each head's output close to rank one).
    Only at fixed head dimension does the Gaussian κ fall with heads (Theorem 3.2's setting).
    """
    from explorer import api
    from explorer.conditioning import REGIMES

    regimes = REGIMES if regime is RegimeChoice.both else (regime.value,)
    with Measuring(f"κ at initialisation, {plural(seeds, 'seed')} each") as progress:
        frame = api.condition(space, task, pairs(option, "--option"), seeds=seeds, regimes=regimes, head_dim=head_dim,
                              progress=progress)
    cols = ["regime", "width", "layers", "heads", "head_dim", "params", "kappa", "kappa_first", "kappa_last"]
    cols += [c for c in ("kappa_channel", "kappa_inner") if frame[c].notna().any()]
    if frame["missing"].map(len).any():  # blocks whose hook never fired, by name
        frame, cols = frame.assign(missing=frame["missing"].map(", ".join)), [*cols, "missing"]
    kinds = [words for col, words in (("kappa_channel", "κ channel: channel attention"),
                                      ("kappa_inner", "κ inner: TNT's inner attention")) if col in cols]
    about = (f"on {task}: token-attention blocks, geometric mean over blocks and {plural(seeds, 'seed')}"
             + (f" ({'; '.join(kinds)})" if kinds else ""))
    if format is not Format.table:
        return print_frame(frame[cols], format)
    for i, (which, rows) in enumerate(frame.groupby("regime", sort=False)):  # a table per regime: its name in the title
        print_frame(rows[[c for c in cols if c != "regime"]], format,
                    title=f"κ at initialisation, {which.replace('-', ' ')} {about if i == 0 else ''}".rstrip())


class Measuring:
    """Progress of a long measurement on stderr: a bar on a terminal, a line every half minute elsewhere."""

    EVERY_S = 30.0

    def __init__(self, what: str):
        self.what, self.con = what, cli_app.err
        self.bar = Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=self.con,
                            transient=True) if self.con.is_terminal else None
        self.task: Any = None
        self.said = time.monotonic()

    def __enter__(self) -> "Measuring":
        if self.bar:
            self.bar.start()
        return self

    def __call__(self, done: int, total: int) -> None:
        """`done` of `total` configurations measured."""
        if self.bar:
            if self.task is None:
                self.task = self.bar.add_task(self.what, total=total)
            self.bar.update(self.task, completed=done, total=total)
        elif time.monotonic() - self.said >= self.EVERY_S and done < total:
            self.said = time.monotonic()
            say(self.con, f"{self.what}: {done} of {total} configurations measured")

    def __exit__(self, *exc: object) -> None:
        if self.bar:
            self.bar.stop()
