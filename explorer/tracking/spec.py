"""The study YAML's `tracking:` block and `--tracking`: which trackers receive the study's trials, and where.

    tracking:
      mlflow: {tracking_uri: http://127.0.0.1:5000}   # or `mlflow: true`: $MLFLOW_TRACKING_URI, else a store beside the study
      tensorboard: true                               # event files in <name>.tensorboard/ beside the study

or `tracking: [mlflow, tensorboard]`. Plain data: nothing here imports a tracker.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from explorer.errors import ExplorerError

NAMES = ("mlflow", "tensorboard")


class MLflowSpec(BaseModel):
    """MLflow: the experiment is the study's name (as Optuna's MLflowCallback names it) unless `experiment`."""

    model_config = ConfigDict(extra="forbid")
    tracking_uri: str | None = Field(None, description="the MLflow tracking URI (a server, or a store); null: "
                                                       "$MLFLOW_TRACKING_URI, else sqlite:///NAME.mlflow.db beside the study")
    experiment: str | None = Field(None, description="the MLflow experiment; null: the study's name")

    def uri(self, folder: Path, name: str) -> str:
        return self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{local_store(folder, name)}"

    def artifacts(self, folder: Path, name: str) -> str | None:
        """Where a new experiment in the default local store keeps artifacts (beside it, not in the cwd's mlruns/)."""
        default = not self.tracking_uri and not os.environ.get("MLFLOW_TRACKING_URI")
        return (folder.resolve() / f"{name}.mlflow-artifacts").as_uri() if default else None


class TensorBoardSpec(BaseModel):
    """TensorBoard: one folder of event files per trial under `log_dir` (relative to the study's folder)."""

    model_config = ConfigDict(extra="forbid")
    log_dir: str | None = Field(None, description="the folder of event files, one folder per trial, relative to "
                                                  "the study's YAML; null: NAME.tensorboard beside it")

    def folder(self, folder: Path, name: str) -> Path:
        path = Path(self.log_dir).expanduser() if self.log_dir else Path(f"{name}.tensorboard")
        return (path if path.is_absolute() else folder / path).resolve()


class TrackingSpec(BaseModel):
    """Trackers are opt-in: none by default."""

    model_config = ConfigDict(extra="forbid")
    mlflow: MLflowSpec | None = Field(None, description="each trial a run in MLflow (`true`: the defaults)")
    tensorboard: TensorBoardSpec | None = Field(None, description="each trial a folder of TensorBoard event files "
                                                                 "(`true`: the defaults)")

    @model_validator(mode="before")
    @classmethod
    def _listed(cls, value: Any) -> Any:
        """`tracking: [mlflow, tensorboard]`: each with its defaults."""
        if isinstance(value, list):
            unknown = [v for v in value if v not in NAMES]
            if unknown:
                raise ValueError(f"{unknown[0]!r} is not a tracker; choose from {', '.join(NAMES)}")
            return {name: {} for name in value}
        return value

    @field_validator("mlflow", "tensorboard", mode="before")
    @classmethod
    def _switch(cls, value: Any) -> Any:
        """`mlflow: true` takes the defaults, `mlflow: false` turns it off."""
        return {} if value is True else None if value is False else value

    @property
    def names(self) -> list[str]:
        return [name for name in NAMES if getattr(self, name) is not None]

    def with_flags(self, flags: Sequence[str]) -> TrackingSpec:
        """`--tracking` over this block: NAME (its YAML settings, else the defaults), NAME=URI for mlflow,
        NAME=DIR for tensorboard; `none` turns off the YAML's trackers."""
        out = TrackingSpec() if "none" in flags else self.model_copy()
        for flag in (f for f in flags if f != "none"):
            name, sep, where = flag.partition("=")
            if name not in NAMES:
                raise ExplorerError(f"{flag!r}: write {' or '.join(NAMES)}, NAME=URI (mlflow) or NAME=DIR (tensorboard), "
                                    "or none", field="--tracking")
            current = getattr(out, name) or (MLflowSpec() if name == "mlflow" else TensorBoardSpec())
            setattr(out, name, current.model_copy(update={"tracking_uri" if name == "mlflow" else "log_dir": where}) if sep else current)
        return out


def local_store(folder: Path, name: str) -> Path:
    """The default MLflow store: an SQLite file beside the study, like its Optuna storage."""
    return folder.resolve() / f"{name}.mlflow.db"
