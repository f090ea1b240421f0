"""Where a trial keeps its epoch checkpoint, and whether a checkpoint found there is its own.

One folder per trial lineage (a trial and its retries), so two workers training the same
configuration never share one, and a retry finds the checkpoint of the trial it continues. The
folder's `owner.json` records the study, trial, configuration and budget it belongs to: a checkpoint
of anything else (e.g. of the old budget after `--force` with new epochs) is not resumed.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
from pathlib import Path
from typing import Any

import optuna

OWNER = "owner.json"


def lineage(trial: optuna.trial.FrozenTrial) -> int:
    """The number of the first trial of a chain of retries.

    explorer's retries (a dead worker, Ctrl-C, `--reclaim`, a stopped Ray driver) record it as the user
    attr `retry_of`; retries queued by Optuna's `RetryHeartbeatStaleTrialCallback` (studies run before
    explorer queued them itself) as the system attr `failed_trial`, so `retry_of` is looked at first.
    """
    return int(trial.user_attrs.get("retry_of", trial.system_attrs.get("failed_trial", trial.number)))


def folder(root: Path, key: str, lineage: int) -> Path:
    return root / f"trial-{lineage}-{re.sub(r'[^A-Za-z0-9._-]+', '_', key)}"


def claim(path: Path, owner: dict[str, Any]) -> Path:
    """`path`, emptied and stamped with `owner` unless it already holds that owner's checkpoint."""
    try:
        recorded = json.loads((path / OWNER).read_text())
    except (OSError, ValueError):
        recorded = None
    if recorded != owner:
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        (path / OWNER).write_text(json.dumps(owner))
    return path


def remove(path: Path) -> None:
    """A finished trial's checkpoint is spent; the study's checkpoint root goes too once it is empty."""
    shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(OSError):
        path.parent.rmdir()
