"""explorer: which (layers, heads) split gives the best accuracy for a parameter budget.

The Python API (`explorer.load`, `explorer.create`, `explorer.Experiment`) lives in `explorer.api`;
it is imported on first use, so `import explorer` (and the command line) stay fast.

The map, in the order a study flows:

    space.py, families/, tasks/      what is searched (configurations, exact counts) and on what data
    study/spec.py, budget.py         a study's YAML resolved against its files, its identity, how a trial trains
    schedule.py                      learning-rate schedules; a ladder's shorter lengths branched off one run
    study/storage.py, lock.py        its Optuna storage, and the lock under which workers decide what runs
    optuna_compat.py                 the one module using Optuna's private names (bottom floor)
    study/queue.py                   what runs next: grid, replicates, verification, retries
    study/evaluate.py -> train.py    one trial: configuration, training run, record, pruning
    executors/                       where trials run: local threads or Ray Tune
    tracking/                        the trials as runs in MLflow and TensorBoard, fed by the executors (opt-in)
    identity.py                      which stored trials answer the study's current question
    study/read.py, frame.py, stats.py  the read side: measurements, counts, per-configuration statistics
    pareto.py, decisions.py          fronts; non-inferior / beats / equivalent / undecided at a budget
    noise.py, gp.py, posterior.py    the one posterior over configurations and lengths
    recommend.py, transfer.py        the answer for a budget at a length, inside and past the space; how far it carries
    learning.py                      whether the runs were still learning when they stopped
    dashboard/                       the offline HTML report (reading, text, plots, extrapolation, page) and its live server
    api.py <- cli.py                 the Python API, and the `explorer` command over it
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["Experiment", "create", "load"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from explorer import api

        return getattr(api, name)
    raise AttributeError(f"module 'explorer' has no attribute {name!r}")
