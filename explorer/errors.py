"""One error type whose message is one line naming where the bad input is."""

from __future__ import annotations

import re

# what pydantic appends to each error in `str(ValidationError)`: for a developer, not for the user
_PYDANTIC_TAIL = re.compile(r"\s*\[type=\w+(?:, input_value=.*?, input_type=\w+)?\]|\s*For further information visit https://errors\.pydantic\.dev\S*")


def one_line(text: str) -> str:
    """`text` with line breaks and other control characters escaped, as `repr` would write them.

    File names, field names and values come from the user, and a YAML key may hold a newline: the
    error that names it must still be one line.
    """
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def without_pydantic_tail(text: str) -> str:
    """`text` without pydantic's `[type=..., input_value=..., input_type=...]` and documentation link."""
    return _PYDANTIC_TAIL.sub("", text)


class ExplorerError(Exception):
    """A user-facing error: the CLI prints `str(err)` as one line and exits non-zero."""

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None):
        self.source = source
        self.field = field
        where = ": ".join(part for part in (source, field) if part)
        message = without_pydantic_tail(message)
        super().__init__(one_line(f"{where}: {message}" if where else message))


class TrialFailed(Exception):
    """A trial that cannot produce a result (NaN loss, out of memory, timeout); the study goes on."""


class TrialReclaimed(BaseException):
    """A trial another worker failed as dead while this one still trained it (its heartbeat went stale):
    its retry owns the (configuration, seed) now, so this worker stops without recording anything and
    leaves the checkpoint to the retry. A BaseException, like KeyboardInterrupt: no handler of trial
    faults turns it into a failure."""
