"""`explorer export`: a study's trials table and, beside it, its per-configuration table (a row per
configuration and length), as CSV or parquet with pandas. The format follows the file's extension; a name
that says another, or neither, is refused before anything is written, and a folder that cannot be written
to is one line. Queued trials that never started are no trials of the table; counts stay integers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from explorer.errors import ExplorerError
from explorer.formats import epochs_words, plural
from explorer.frame import nullable_ints

FORMATS = ("csv", "parquet")
CONFIG_COLUMNS = ["arch", "layers", "heads", "width", "mlp", "params", "epochs", "n", "raw", "mean", "std", "se", "lo", "hi",
                  "front_prob", "on_front", "tied_with", "seeds", "values"]
COUNTS = ("seed", "epochs", "steps", "seed_batch")  # whole numbers a trial records; NaN in one row made them floats


@dataclass(frozen=True)
class Exported:
    """What `write` wrote: both files, the trials in the first (and the queued ones left out), the
    configurations in the second at each length."""

    target: Path
    beside: Path
    trials: int
    queued: int
    configs: int
    lengths: tuple[int, ...]

    def lines(self) -> list[str]:
        left = f" ({self.queued} queued, never started, left out)" if self.queued else ""
        at = (f" at {' and '.join(map(str, self.lengths[:-1]))} and {epochs_words(self.lengths[-1])} "
              f"({len(self.lengths) * self.configs} rows)" if len(self.lengths) > 1 else
              f" at {epochs_words(self.lengths[0])}" if self.lengths else "")
        return [f"{plural(self.trials, 'trial')}{left} -> {self.target}",
                f"{plural(self.configs, 'configuration')}{at} -> {self.beside}"]


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


def write(trials: pd.DataFrame, configs: Mapping[int, pd.DataFrame], target: Path, format: str) -> Exported:
    """Write the trials that ran (queued ones left out) to `target` and the configurations at each length
    (`configs`: the per-configuration summary by epochs) beside it. An unwritable place is one ExplorerError."""
    other = beside(target, format)
    if not target.parent.is_dir():
        raise ExplorerError(f"{target.parent} is not a folder (create it first)", source=str(target))
    queued = trials["state"].eq("WAITING")
    ran = nullable_ints(trials[~queued], [c for c in COUNTS if c in trials])
    table = pd.concat([summary.assign(epochs=epochs).reindex(columns=CONFIG_COLUMNS) for epochs, summary in configs.items()],
                      ignore_index=True) if configs else pd.DataFrame(columns=CONFIG_COLUMNS)
    table = nullable_ints(table, ["layers", "heads", "width", "mlp", "params", "epochs", "n"])
    table.attrs.clear()  # the pooled variance it carries is no column, and parquet cannot store it
    try:
        if format == "csv":
            ran.to_csv(target, index=False)
            table.to_csv(other, index=False)
        else:
            ran.assign(curve=ran["curve"].map(list), config=ran["config"].map(str),
                       rungs=ran["rungs"].map(str)).to_parquet(target, index=False)  # dicts: parquet has no empty struct
            table.to_parquet(other, index=False)
    except OSError as err:
        raise ExplorerError(f"cannot write: {err.strerror or err}", source=str(err.filename or target)) from None
    counts = {len(summary) for summary in configs.values()}
    return Exported(target, other, len(ran), int(queued.sum()), max(counts, default=0), tuple(configs))
