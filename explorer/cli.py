"""The `explorer` command's entry point: the commands (cli_run.py, cli_read.py, cli_count.py) on one typer app
(cli_app.py); user errors are one line and exit 1, an interrupt exits 130 saying how to go on."""

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

import typer  # noqa: E402

from explorer import cli_count, cli_read, cli_run  # noqa: E402,F401  (each registers its commands on the app)
from explorer.cli_app import app, err  # noqa: E402
from explorer.cli_usage import failed  # noqa: E402
from explorer.terminal import say  # noqa: E402

__all__ = ["app", "main"]
ORDER = ("params", "run", "resume", "status", "export", "dashboard", "recommend", "condition")  # as `--help` lists them
app.registered_commands.sort(key=lambda command: ORDER.index(command.callback.__name__))


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
        say(err, _interrupted(sys.argv[1:]), wrap=False)  # one line, as an error is
        # CPython remembers an interrupt that ended a string `exec` (dataclasses, typing and torch generate code
        # so) even once caught, and under `python -m` dies by SIGINT at exit instead of exiting 130; an empty
        # string exec clears that flag
        exec("")
    raise SystemExit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
