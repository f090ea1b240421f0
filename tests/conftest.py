"""Tiny spaces and studies on temp files: real code paths, seconds each on a CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

torch.set_num_threads(1)  # tiny models: one thread is fastest and immune to a busy neighbour core

TINY_SPACE = {
    "name": "tiny",
    "family": "image-encoder",
    "fixed": {"width": 16, "mlp": 32, "img_size": 8, "patch": 4, "in_chans": 1, "num_classes": 10},
    "free": {"layers": [1, 2], "heads": "divisors"},
    "constraints": {"fixed_mlp": True, "min_head_dim": 4},
    "baseline": {"layers": 2, "heads": 1},
}


def tiny_study_doc(**overrides) -> dict:
    doc = {
        "name": "tiny",
        "space": "space.yaml",
        "task": {"name": "digits"},
        "budget": {"epochs": 2, "batch_size": 128, "lr": 0.003, "seed": 0},
        "sampler": {"name": "grid", "seed": 0},
        "n_trials": 6,
        "heartbeat_s": 1,
    }
    doc.update(overrides)
    return doc


def write_study(folder: Path, space_doc: dict | None = None, **overrides) -> Path:
    """A space and a study YAML in `folder`; the study's SQLite file lands beside them."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "space.yaml").write_text(yaml.safe_dump(space_doc or TINY_SPACE, sort_keys=False))
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(tiny_study_doc(**overrides), sort_keys=False))
    return path


@pytest.fixture
def tiny_study(tmp_path: Path) -> Path:
    return write_study(tmp_path)
