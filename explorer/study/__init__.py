"""A study: one YAML (space, task, budget, sampler, objectives, executor) and one Optuna storage.

The Optuna storage is the single source of truth: every trial's configuration, metrics, κ values and
learning curve live there, so a study resumes, exports and renders from it at any time. One job a
module, in the order a study flows:

- `spec.py`: what a study is: the YAML models, the spec resolved against its files (`ResolvedStudy`), its identity.
- `storage.py`: the storage: open, heartbeat repair, one-line errors.
- `stamp.py`: what the stored study was made with: recorded by its first worker, checked by the others.
- `sqlite.py`: SQLite for several workers (the write lock taken at BEGIN, for writes only).
- `lock.py`: the study's lock across threads, processes and hosts, under which the queue decides.
- `liveness.py`: which RUNNING trials still have a live worker (heartbeats on the storage's clock).
- `queue.py`: what runs next: claiming a trial, grid order, replicates, verification, retries, what is left.
- `evaluate.py`: one trial: its configuration, training run, stored attributes, pruning, duplicates.
- `read.py`: the read side: which trials are measurements, counts, the per-configuration summary.
- `root.py`: the composition root: `Study`, the resolved spec with its jobs built and handed what they need.

Imports run one way: spec.py imports no job; each job takes a `ResolvedStudy` (spec.py) and the jobs below it
(read <- storage, evaluate <- queue); root.py imports them all. `Study` is reached as `study.store`, `study.queue`, `study.evaluator` and `study.reads`.
"""

from explorer.study.root import Study, load_study_spec
from explorer.study.spec import (
    OBJECTIVE_NAMES,
    ExecutorSpec,
    Objective,
    PrunerSpec,
    ResolvedStudy,
    SamplerSpec,
    StudySpec,
)
from explorer.study.storage import STORAGE_ERRORS

__all__ = ["OBJECTIVE_NAMES", "STORAGE_ERRORS", "ExecutorSpec", "Objective", "PrunerSpec", "ResolvedStudy", "SamplerSpec",
           "Study", "StudySpec", "load_study_spec"]
