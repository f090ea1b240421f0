"""Trackers: a study's trials as runs in the tracker a team already watches (MLflow, TensorBoard), opt-in.

Adapters at the edge, one module each, behind one narrow interface; each imports its tracker's library
only when a study tracks to it (`pip install 'explorer[mlflow]'`, `'explorer[tensorboard]'`):

    spec.py         the study YAML's `tracking:` block and `--tracking`
    base.py         the interface (`Tracker`) and what it receives: a trial's `Run`, its `End`, the `Summary`
    feed.py         the executors' per-epoch and per-trial callbacks, queued to the trackers on one thread
    summary.py      the study's answers as a summary run
    mlflow.py       MLflow (Optuna's MLflowCallback's names: experiment = study, run = trial number)
    tensorboard.py  TensorBoard event files, one folder per trial (as Ray Tune writes them)
"""

from explorer.tracking.spec import MLflowSpec, TensorBoardSpec, TrackingSpec

__all__ = ["MLflowSpec", "TensorBoardSpec", "TrackingSpec"]
