"""What a tracker is: a narrow interface the feed (feed.py) drives from one thread, one adapter per tracker.

A trial's run is keyed by its lineage (the number of the first trial of a chain of retries,
explorer.checkpoints.lineage): a trial resumed after Ctrl-C, a dead worker or a fault continues the run
its first attempt opened. Steps are epochs counted from 1; step 0 holds what is measured before
training (κ at initialisation).
"""

from __future__ import annotations

import math
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

# Optuna's trial states as a tracker's run status (Ray Tune's MLflow logger ends a stopped trial FINISHED, too)
STATUS = {"COMPLETE": "FINISHED", "PRUNED": "FINISHED", "FAIL": "FAILED", "RUNNING": "RUNNING", "INTERRUPTED": "KILLED"}


class TrackerDown(Exception):
    """A tracker that cannot be reached or written: one warning line, and the study goes on without it."""


@dataclass(frozen=True)
class Run:
    """One trial's run as every tracker opens it."""

    key: int  # the trial's lineage: its run name, as Optuna's MLflowCallback names a run by trial number
    params: dict[str, Any]  # its configuration, seed and training budget
    tags: dict[str, str]  # Optuna's tags (number, state, direction, datetime_start) and explorer's
    metric: str  # the task's metric, logged every epoch
    start_ms: int | None = None


@dataclass(frozen=True)
class End:
    """How a trial's run ends: its state, final tags, and metrics at their steps."""

    key: int
    state: str  # an Optuna state name, or INTERRUPTED (stopped by Ctrl-C; a resume continues it)
    tags: dict[str, str]
    metrics: list[tuple[str, float, int]] = field(default_factory=list)  # (name, value, step): κ, params, FLOPs, time
    values: dict[str, float] = field(default_factory=dict)  # the trial's objective values, the metric's at its last epoch
    end_ms: int | None = None


@dataclass(frozen=True)
class Summary:
    """The study's answers as one run: tags and metrics at `step` (the runs finished), tables as CSV text."""

    tags: dict[str, str]
    metrics: dict[str, float]
    step: int
    tables: dict[str, str]


class Tracker(ABC):
    """One tracking backend. Its methods run on the feed's one thread, never two at once."""

    name: str

    @abstractmethod
    def where(self) -> str:
        """Where it writes (a URI or folder), to say once when the study starts."""

    @abstractmethod
    def known(self) -> dict[int, str | None]:
        """The runs it holds for this study: lineage -> the state of its last end (RUNNING if none; None: not
        known to this tracker, so never written again)."""

    @abstractmethod
    def open(self, run: Run) -> None:
        """Start `run`, or continue the run of its lineage."""

    @abstractmethod
    def log(self, key: int, metrics: dict[str, float], step: int) -> None:
        """One epoch's metrics; a step it already holds for `key` is not logged twice."""

    @abstractmethod
    def end(self, end: End) -> None:
        """End a run (a later retry of its lineage may continue it)."""

    @abstractmethod
    def summary(self, summary: Summary) -> None:
        """Write the study's answers as its summary run (one per study, updated at each run's end)."""

    def close(self) -> None:
        """Flush and release what it holds."""


def finite(metrics: dict[str, Any]) -> dict[str, float]:
    """The metrics a tracker can store: numbers, finite (κ of a rank-deficient block is inf)."""
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def warn(message: str) -> None:
    """One line on stderr: a progress bar above which it appears keeps its place (rich redirects stderr)."""
    sys.stderr.write(f"warning: tracking: {message}\n")
    sys.stderr.flush()
