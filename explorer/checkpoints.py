"""Where a trial keeps its epoch checkpoint, whether a checkpoint found there is its own, and the file.

One folder per trial lineage (a trial and its retries), so two workers training the same
configuration never share one, and a retry finds the checkpoint of the trial it continues. The
folder's `owner.json` records the study, trial, configuration and budget it belongs to: a checkpoint
of anything else (e.g. of the old budget after `--force` with new epochs) is not resumed.

The file (`CHECKPOINT`) holds the model, optimizer, LR schedule, the RNG states and the run's progress;
it loads on whatever device the retry has (saved on cuda:1 of a node with 4 GPUs, resumed on cuda:0 of
one with a single GPU, or on a CPU).

Under wsd a run also keeps the same file at its cooldown start (`Carry`), for a longer run of its
(configuration, seed) to continue from (explorer.schedule: until the cooldown every length is one
trajectory): `kept/KEY-seedS/L.pt` beside the trials' folders, and `L.json` (the run's final metrics)
once it ends. A (configuration, seed) holds one such state at rest, two while a longer run of it trains;
a run deletes the shorter runs' states when it ends, and a run of the ladder's longest length keeps none.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna

from explorer.errors import ExplorerError

if TYPE_CHECKING:
    import torch
    from torch import nn

    from explorer.tasks import Loader

OWNER = "owner.json"
CHECKPOINT = "checkpoint.pt"
KEPT = "kept"  # the folder, beside the trials' own, of states kept for longer runs


def lineage(trial: optuna.trial.FrozenTrial) -> int:
    """The number of the first trial of a chain of retries.

    explorer's retries (a dead worker, Ctrl-C, `--reclaim`, a stopped Ray driver) record it as the user
    attr `retry_of`; retries queued by Optuna's `RetryHeartbeatStaleTrialCallback` (studies run before
    explorer queued them itself) as the system attr `failed_trial`, so `retry_of` is looked at first.
    """
    return int(trial.user_attrs.get("retry_of", trial.system_attrs.get("failed_trial", trial.number)))


def folder(root: Path, key: str, lineage: int) -> Path:
    return root / f"trial-{lineage}-{_safe(key)}"


def kept(root: Path, key: str, seed: int) -> Path:
    """Where the runs of (configuration `key`, `seed`) keep their states at their cooldown starts (`Carry`)."""
    return root / KEPT / f"{_safe(key)}-seed{seed}"


def _safe(key: str) -> str:
    return re.sub(r'[^A-Za-z0-9._-]+', '_', key)


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


@dataclass(frozen=True)
class Carry:
    """How a wsd run of `length` epochs meets the other runs of its (configuration, seed) in `folder`: it
    starts from the latest state kept there at a length up to its own, when it has no checkpoint of its
    own (`source`; a shorter run's, or its own from an attempt that died), and keeps its own state at its
    cooldown start (`keep`) unless it is the ladder's longest (`top`), which no longer run continues."""

    folder: Path
    length: int
    top: int

    def states(self) -> dict[int, Path]:
        """The states kept in `folder`, by the length of the run that kept each."""
        return {int(p.stem): p for p in self.folder.glob("*.pt") if p.stem.isdigit()}

    @property
    def source(self) -> tuple[Path, int] | None:
        """The latest state a run of `length` may start from and the length of the run that kept it."""
        usable = {n: p for n, p in self.states().items() if n <= self.length}
        return (usable[max(usable)], max(usable)) if usable else None

    @property
    def keep(self) -> Path | None:
        return self.folder / f"{self.length}.pt" if self.length < self.top else None

    def metrics(self, length: int) -> dict[str, float] | None:
        """The final metrics of the run of `length` whose state is kept, once it ended."""
        try:
            return json.loads((self.folder / f"{length}.json").read_text())
        except (OSError, ValueError):
            return None

    def ended(self, metrics: dict[str, float]) -> None:
        """The run ended with `metrics`: note them beside its kept state, and delete the shorter runs' states
        (no later run continues from them: `Budget.continues` picks the seed's longest run)."""
        if self.keep is not None and self.keep.exists():
            tmp = self.keep.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(metrics))
            os.replace(tmp, self.keep.with_suffix(".json"))
        for length, path in self.states().items():
            if length < self.length:
                path.with_suffix(".json").unlink(missing_ok=True)
                path.unlink(missing_ok=True)
        for empty in (self.folder, self.folder.parent, self.folder.parent.parent):  # KEY-seedS, kept, the study's root
            with contextlib.suppress(OSError):
                empty.rmdir()


# -- the checkpoint file --------------------------------------------------------------------------
@dataclass
class Parts:
    """What a checkpoint saves and restores besides the run's progress."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    loader: Loader


def save(path: Path, owner: dict[str, Any], parts: Parts, progress: dict[str, Any], device: str) -> None:
    """Write the checkpoint atomically: a crash mid-write leaves the previous one intact."""
    import torch  # here: reading a study (which names checkpoint folders) imports no torch

    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "config": owner,
        "model": parts.model.state_dict(),
        "optimizer": parts.optimizer.state_dict(),
        "scheduler": parts.scheduler.state_dict(),
        "rng": _rng_state(parts.loader, device),
        "state": progress,
    }
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def load(path: Path, owner: dict[str, Any], parts: Parts, device: str, seed_lock: threading.Lock) -> dict[str, Any]:
    """Restore `parts` from the checkpoint at `path` (one of `owner`'s) onto `device`; returns the progress.

    torch's global RNG state is set inside `seed_lock`, the lock under which trials in threads seed it
    and draw their models' initialisation: set outside it, it would change another trial's model.
    """
    return restore(read(path, owner), parts, device, seed_lock)


def read(path: Path, owner: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint at `path`, checked to be one of `owner`'s (an ExplorerError if not), on the CPU."""
    import torch

    payload = torch.load(path, map_location="cpu", weights_only=True)  # saved on any device: loaded to ours
    if payload["config"] != owner:
        raise ExplorerError(f"checkpoint is of {payload['config']}, not of this trial's configuration", source=str(path))
    return payload


def restore(payload: dict[str, Any], parts: Parts, device: str, seed_lock: threading.Lock) -> dict[str, Any]:
    """Restore `parts` from a checkpoint `read` onto `device`; returns the progress (see `load`)."""
    import torch

    parts.model.load_state_dict(payload["model"])
    parts.optimizer.load_state_dict(payload["optimizer"])
    parts.scheduler.load_state_dict(payload["scheduler"])
    rng = payload["rng"]
    cuda = rng["cuda"]
    if isinstance(cuda, list):  # saved before per-device states: every visible GPU's, the trial's (cuda:0) first
        cuda = cuda[0] if cuda else None
    with seed_lock:
        torch.set_rng_state(rng["torch"])
        if cuda is not None and device.startswith("cuda"):
            torch.cuda.set_rng_state(cuda, torch.device(device))
    generator = getattr(parts.loader, "generator", None)  # a DataLoader's; in-memory batches draw from (seed, epoch) alone
    if rng["loader"] is not None and generator is not None:
        generator.set_state(rng["loader"])
    return payload["state"]


def _rng_state(loader: Loader, device: str) -> dict[str, Any]:
    """The RNG states a resumed run needs: torch's, the trial's own GPU's (not every visible one: a retry
    may see fewer GPUs, or others), the data order's."""
    import torch

    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(torch.device(device)) if device.startswith("cuda") else None,
        "loader": generator.get_state() if (generator := getattr(loader, "generator", None)) is not None else None,
    }
