"""TensorBoard: one folder of event files per trial under the study's log dir, as Ray Tune writes one per
trial: `trial-<lineage>-<configuration>/` with the per-epoch metrics and κ as scalars at step = epoch,
the configuration, seed and budget as hparams (TensorBoard's HParams tab compares the trials), and the
trial's tags as text; `summary/` holds the study's answers. Written with torch's SummaryWriter (which needs
the `tensorboard` package), on the feed's one thread.

A retry continues its lineage's folder: its first epoch is written with `purge_step`, so TensorBoard drops
what the earlier attempt wrote from that epoch on (the epochs after its checkpoint, trained again).
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Any

from explorer.tracking.base import End, Run, Summary, Tracker

_TRIAL = re.compile(r"trial-(\d+)-")


class TensorBoardTracker(Tracker):
    name = "tensorboard"

    def __init__(self, folder: Path):
        from torch.utils.tensorboard import SummaryWriter  # ImportError without the tensorboard package

        self._writer = SummaryWriter
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.dirs: dict[int, Path] = {}
        self.writers: dict[int, Any] = {}
        self.last: dict[int, int] = {}
        self.params: dict[int, dict[str, Any]] = {}

    def where(self) -> str:
        return str(self.folder)

    def known(self) -> dict[int, str | None]:
        """Trials with a folder already (their state is in their event files, not read back here: None)."""
        return {int(m.group(1)): None for p in self.folder.iterdir() if (m := _TRIAL.match(p.name))}

    def open(self, run: Run) -> None:
        slug = re.sub(r"[^A-Za-z0-9._=,-]+", "_", str(run.params.get("arch", "")))
        self.dirs[run.key] = self.folder / f"trial-{run.key}-{slug}"
        self.params[run.key] = run.params

    def _open_writer(self, key: int, purge: int | None) -> Any:
        if key not in self.writers:
            self.writers[key] = self._writer(str(self.dirs[key]), purge_step=purge)
        return self.writers[key]

    def log(self, key: int, metrics: dict[str, float], step: int) -> None:
        if key not in self.dirs or step <= self.last.get(key, 0):
            return
        writer = self._open_writer(key, purge=step)  # the first epoch this process writes: later ones of an earlier attempt go
        for name, value in metrics.items():
            writer.add_scalar(name, value, step)
        writer.flush()  # a TensorBoard reading the folder now sees the epoch
        self.last[key] = step

    def end(self, end: End) -> None:
        from torch.utils.tensorboard.summary import hparams

        if end.key not in self.dirs:
            return
        writer = self._open_writer(end.key, purge=None)
        for name, value, step in end.metrics:
            writer.add_scalar(name, value, step)
        shown = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in self.params.get(end.key, {}).items()}
        finals = {**{name: value for name, value, _ in end.metrics}, **end.values}  # the HParams tab's columns
        for summary in hparams({**shown, "state": end.state}, finals):
            writer.file_writer.add_summary(summary)
        writer.add_text("tags", _markdown({**end.tags, "state": end.state}))
        writer.close()
        del self.writers[end.key]

    def summary(self, summary: Summary) -> None:
        writer = self._writer(str(self.folder / "summary"))
        for name, value in summary.metrics.items():
            writer.add_scalar(name, value, summary.step)
        writer.add_text("answers", _markdown(summary.tags), summary.step)
        for name, text in summary.tables.items():
            rows = [[cell.replace("|", "/") for cell in row] for row in csv.reader(io.StringIO(text))]
            lines = rows[:1] + [["---"] * len(rows[0])] + rows[1:] if rows else []
            writer.add_text(name, "\n".join("| " + " | ".join(row) + " |" for row in lines), summary.step)
        writer.close()

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()
        self.writers.clear()


def _markdown(tags: dict[str, str]) -> str:
    return "\n".join(f"- **{k}**: {v}" for k, v in tags.items())
