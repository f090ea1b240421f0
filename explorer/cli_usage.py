"""How the `explorer` command speaks about itself: its help in one style of labels, and a mistake on the
command line as a usage line and one error line, exit 2, as click's own commands do.

typer (0.29) writes a required argument `{study}` in a usage line, `study <path>` under Arguments and a
list `<list[Path]>`; `Command` writes them all as click does (`STUDY`, `[SPACE]`, `STUDY...`). Click's
errors reach `main` as exceptions (the command runs with `standalone_mode=False`, so that explorer's own
errors and Ctrl-C are handled there too); `usage_error` turns them into the lines to print, and
EXPLORER_DEBUG=1 keeps the traceback instead.
"""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import typer
import typer.core
import typer.main
from rich.console import Console

from explorer.errors import ExplorerError, one_line
from explorer.terminal import say

DEBUG = "EXPLORER_DEBUG"


def debugging() -> bool:
    """Whether EXPLORER_DEBUG asks for tracebacks instead of one-line errors."""
    return os.environ.get(DEBUG, "") not in ("", "0")


def explorer_version() -> str:
    """`explorer 0.1.0`, from the installed package's metadata."""
    try:
        return f"explorer {version('explorer')}"
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "explorer (not installed: no package metadata)"


def _label(param: Any) -> str:
    """An argument as click names it: its metavar, or its name in capitals; `...` when it takes several."""
    name = param.metavar or (param.name or "").upper()
    return f"{name}..." if param.nargs == -1 else name


class Command(typer.core.TyperCommand):
    """A typer command whose usage line and help label arguments as click does: `STUDY`, `[SPACE]`, `STUDY...`."""

    def collect_usage_pieces(self, ctx: typer.Context) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                pieces.append(_label(param) if param.required else f"[{_label(param)}]")
        return pieces

    def format_options(self, ctx: typer.Context, formatter: Any) -> None:
        args = [(_label(p), getattr(p, "help", None) or "") for p in self.get_params(ctx) if p.param_type_name == "argument"]
        opts = [rv for p in self.get_params(ctx) if p.param_type_name == "option" and (rv := p.get_help_record(ctx))]
        for title, rows in (("Arguments", args), ("Options", opts)):
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


def _click_class(name: str) -> type[Exception]:
    """One of click's exception classes (`ClickException`, `UsageError`) as the installed typer raises it:
    typer 0.29 carries its own copy of click, whose classes only its public BadParameter leads to."""
    return next(c for c in typer.BadParameter.__mro__ if c.__name__ == name)


def _context(app: typer.Typer, argv: list[str]) -> Any:
    """The context of the command `argv` names (the group's when it names none): the parser raises some
    usage errors (an option's missing or extra value) before it has one."""
    group = typer.main.get_command(app)
    root = typer.Context(group, info_name="explorer")
    name = next((a for a in argv if not a.startswith("-")), None)
    command = group.commands.get(name) if name else None
    return typer.Context(command, parent=root, info_name=name) if command is not None else root


def usage_error(err: BaseException, app: typer.Typer, argv: list[str]) -> tuple[list[str], int] | None:
    """The lines to print on stderr and the exit code for a click exception, or None for any other.

    No command: the help, exit 2 (what click does for a group run without one). A usage error: the
    command's usage line (with where to read more) and one error line, exit 2. Another click error: one
    line. `app` is the `explorer` typer app, `argv` its arguments.
    """
    if not isinstance(err, _click_class("ClickException")):
        return None
    ctx = getattr(err, "ctx", None)
    if type(err).__name__ == "NoArgsIsHelpError" and ctx is not None:
        return [ctx.get_help()], 2
    message = one_line(" ".join(err.format_message().split())).replace("Value error, ", "")
    if not isinstance(err, _click_class("UsageError")):
        return [f"error: {message}"], getattr(err, "exit_code", 1)
    ctx = ctx or _context(app, argv)
    usage = " ".join(ctx.get_usage().split())
    return [f"{usage} (more: {ctx.command_path} --help)", f"error: {message}"], getattr(err, "exit_code", 2)


def failed(e: Exception, err: Console, app: typer.Typer, argv: list[str]) -> int:
    """Say on `err` why a command failed and return its exit code: one line for explorer's errors (1), a
    usage line and one error line for a mistake on the command line (2, as click), one line for an
    OSError (1). A bug, or anything under EXPLORER_DEBUG=1, is raised again with its traceback. `app` and
    `argv`: the `explorer` typer app and its arguments, for a usage line the parser gave no context for."""
    if debugging():
        raise e
    if isinstance(e, ExplorerError):
        say(err, f"error: {e}", wrap=False)
        return 1
    said = usage_error(e, app, argv)
    if said is not None:
        for line in said[0]:
            err.print(line, markup=False, highlight=False, soft_wrap=True)
        return said[1]
    if type(e).__name__ == "Abort":  # click's answer to Ctrl-C in a prompt
        return 130
    if isinstance(e, OSError):
        say(err, f"error: {e.filename}: {e.strerror}" if e.filename and e.strerror else f"error: {e}", wrap=False)
        return 1
    raise e
