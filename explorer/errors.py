"""One error type whose message is one line naming where the bad input is."""

from __future__ import annotations


def one_line(text: str) -> str:
    """`text` with line breaks and other control characters escaped, as `repr` would write them.

    File names, field names and values come from the user, and a YAML key may hold a newline: the
    error that names it must still be one line.
    """
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


class ExplorerError(Exception):
    """A user-facing error: the CLI prints `str(err)` as one line and exits non-zero."""

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None):
        self.source = source
        self.field = field
        where = ": ".join(part for part in (source, field) if part)
        super().__init__(one_line(f"{where}: {message}" if where else message))


class TrialFailed(Exception):
    """A trial that cannot produce a result (NaN loss, out of memory, timeout); the study goes on."""
