"""`explorer export`: a study's trials table and, beside it, its per-configuration table, as CSV or parquet
with pandas. The format follows the file's extension; a name that says another, or neither, is refused
before anything is written, and a folder that cannot be written to is one line.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from explorer.errors import ExplorerError

FORMATS = ("csv", "parquet")
CONFIG_COLUMNS = ["arch", "layers", "heads", "width", "mlp", "params", "n", "raw", "mean", "std", "se", "lo", "hi",
                  "front_prob", "on_front", "tied_with", "seeds", "values"]


def export_format(target: Path, format: str | None) -> str:
    """The format `target`'s extension names (.csv, .parquet), which `format` may repeat but not contradict;
    without an extension, `format` (default csv)."""
    if format is not None and format not in FORMATS:
        raise ExplorerError(f"format {format!r}: export writes csv or parquet")
    if not target.suffix:
        return format or "csv"
    named = target.suffix.lower().removeprefix(".")
    if named not in FORMATS:
        raise ExplorerError(f"{target.name}: export writes .csv or .parquet files (the format follows the extension)")
    if format is not None and format != named:
        raise ExplorerError(f"{target.name} names a {named} file and the format asked is {format}: give one of them")
    return named


def beside(target: Path, format: str) -> Path:
    """Where the configurations table goes: t.csv -> t.configs.csv (t -> t.configs.csv)."""
    return target.with_name(target.name.removesuffix(target.suffix) + ".configs" + (target.suffix or f".{format}"))


def write(trials: pd.DataFrame, configs: pd.DataFrame, target: Path, format: str) -> Path:
    """Write both tables; returns the configurations table's path. An unwritable place is one ExplorerError."""
    other = beside(target, format)
    if not target.parent.is_dir():
        raise ExplorerError(f"{target.parent} is not a folder (create it first)", source=str(target))
    configs = configs.reindex(columns=CONFIG_COLUMNS)
    configs.attrs.clear()  # the pooled variance it carries is no column, and parquet cannot store it
    try:
        if format == "csv":
            trials.to_csv(target, index=False)
            configs.to_csv(other, index=False)
        else:
            trials.assign(curve=trials["curve"].map(list), config=trials["config"].map(str),
                          rungs=trials["rungs"].map(str)).to_parquet(target, index=False)  # dicts: parquet has no empty struct
            configs.to_parquet(other, index=False)
    except OSError as err:
        raise ExplorerError(f"cannot write: {err.strerror or err}", source=str(err.filename or target)) from None
    return other
