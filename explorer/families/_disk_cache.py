"""Counts that are slow to compute (timm models built on the meta device) kept on disk between runs.

One JSON file of `key -> int` per timm and torch version, in `$EXPLORER_CACHE_DIR`, else
`$XDG_CACHE_HOME/explorer`, else `~/.cache/explorer`: a new timm or torch gets a fresh file, since
either may change a count.
Writes are atomic (a temporary file renamed over the old one) and merge what other processes
wrote meanwhile; a corrupt or unreadable file is ignored and rewritten, and a cache directory that
cannot be written only costs the recomputation.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch


def cache_file() -> Path:
    """Where the counts live now (read from the environment on every call, so tests can move it)."""
    import timm  # only a timm count gets here; `explorer` starts without timm

    folder = os.environ.get("EXPLORER_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "explorer"
    return Path(folder) / f"timm-counts-{timm.__version__}-torch-{torch.__version__}.json"


def _read(path: Path) -> dict[str, int]:
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(entries, dict):
        return {}
    return {k: v for k, v in entries.items() if isinstance(v, int) and not isinstance(v, bool)}


def _write(path: Path, entries: dict[str, int]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        merged = {**_read(path), **entries}
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=path.name, suffix=".tmp", delete=False) as f:
            json.dump(merged, f, sort_keys=True)
        os.replace(f.name, path)
    except OSError:
        pass  # a read-only or full cache directory: the count is still right, only not kept


class DiskCounts:
    """`get(key, compute)`: the count stored under `key`, computed and stored on a miss."""

    def __init__(self) -> None:
        self._memory: dict[Path, dict[str, int]] = {}

    def get(self, key: str, compute: Callable[[], int]) -> int:
        path = cache_file()
        entries = self._memory.get(path)
        if entries is None:
            entries = self._memory[path] = _read(path)
        if key not in entries:
            entries[key] = int(compute())
            _write(path, entries)
        return entries[key]
