"""Row keys: a configuration at a length (`KEY@EPOCHS`), the posterior's rows where a study trains a ladder.
Plain strings, so that the queue and a Ray worker can use them without the posterior's scipy and pandas."""

from __future__ import annotations

AT = "@"  # a row key: a configuration's key, AT, the length in epochs


def row_key(key: str, epochs: int) -> str:
    return f"{key}{AT}{int(epochs)}"


def split_row(row: str) -> tuple[str, int | None]:
    """(configuration key, epochs) of a row key; (key, None) for a study of one length."""
    key, at, epochs = row.rpartition(AT)
    return (key, int(epochs)) if at else (row, None)
