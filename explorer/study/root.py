"""The composition root of a study: `Study` is the spec resolved against its files (spec.py) with the jobs
done on it, each built here and handed what it needs: `store` (storage.py), `queue` (queue.py), `reads`
(read.py) and `evaluator` (evaluate.py). The jobs import spec.py and each other downward; none imports this.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import optuna

from explorer.space import SearchSpace
from explorer.study.queue import Queue
from explorer.study.read import Reads
from explorer.study.spec import ResolvedStudy, StudySpec
from explorer.study.storage import Store
from explorer.yamlio import load_model

if TYPE_CHECKING:
    from explorer.study.evaluate import Evaluator


class Study(ResolvedStudy):
    """A resolved study and the jobs done on it: `store` (open, identity, heartbeat repair), `queue` (what
    runs next), `evaluator` (one trial) and `reads` (counts and summaries of the stored trials)."""

    def __init__(self, spec: StudySpec, source: Path, space: SearchSpace | None = None):
        super().__init__(spec, source, space)
        self.reads = Reads(self)
        self.store = Store(self, grid=lambda ostudy: self.queue.grid(ostudy))  # a new study's grid is queued under its lock
        self.queue = Queue(self, self.store, self.reads, lambda: self.evaluator)

    @cached_property
    def evaluator(self) -> Evaluator:
        """evaluate.py's job, made on first use: it imports torch, which reading a study never needs (an
        executor takes it in its main thread, settling the run's class, before any trial thread starts)."""
        from explorer.study.evaluate import Evaluator

        return Evaluator(self, self.reads)

    def open(self, *, create: bool = True, force: bool = False, own_cache: bool = False) -> optuna.Study:
        """The Optuna study, to run it (`Store.open`)."""
        return self.store.open(create=create, force=force, own_cache=own_cache)

    def read(self) -> optuna.Study:
        """The stored Optuna study, to read only (`Store.read`)."""
        return self.store.read()

    def paths(self) -> dict[str, str]:
        """Every place on disk this study reads or writes, resolved: `explorer run` states them."""
        out = {"study": str(self.source.resolve()), "space": str(Path(self.space.source).resolve())}
        for key in ("root", "path"):
            if isinstance(self.spec.task.get(key), str):
                out[f"task.{key}"] = str(self.path(self.spec.task[key], f"task.{key}", must_exist=False).resolve())
        out["storage"] = self.store.shown_location()
        out["checkpoints"] = str(self.checkpoint_root.resolve())
        return out


def load_study_spec(path: str | Path) -> Study:
    """Load a study YAML and everything it names; every error names the file and the field."""
    return Study(load_model(StudySpec, path), Path(path))
