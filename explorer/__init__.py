"""explorer: which (layers, heads) split gives the best accuracy for a parameter budget.

The Python API (`explorer.load`, `explorer.create`, `explorer.Experiment`) lives in `explorer.api`;
it is imported on first use, so `import explorer` (and the command line) stay fast.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["Experiment", "create", "load"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from explorer import api

        return getattr(api, name)
    raise AttributeError(f"module 'explorer' has no attribute {name!r}")
