"""Families and tasks from the user's own packages, without editing explorer.

Two ways in, for both kinds: a Python entry point in the group `explorer.families` or `explorer.tasks`
(the entry point's name is the name a YAML uses), or a `module:Class` reference written in the YAML
itself (the module must be importable). Either way the object must be a subclass of explorer's
`Family` or `Task`. Anything that goes wrong while loading one is a single-line ExplorerError naming
the plugin and the error it raised.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any

from explorer.errors import ExplorerError

GROUPS = {"family": "explorer.families", "task": "explorer.tasks"}


def is_reference(name: str) -> bool:
    """Whether `name` is a `module:Class` reference rather than a registered name."""
    module, sep, attr = name.partition(":")
    return bool(sep and module and attr)


def entry_point_names(kind: str) -> list[str]:
    """Names offered by installed packages' entry points for `kind` ("family" or "task")."""
    return sorted({ep.name for ep in entry_points(group=GROUPS[kind])})


def load(kind: str, name: str, base: type) -> type | None:
    """The plugin class called `name`: a `module:Class` reference, else an entry point; None if neither.

    Raises ExplorerError (one line) when the plugin exists but cannot be imported, or is not a `base`.
    """
    if is_reference(name):
        module, _, attr = name.partition(":")
        where = f"{kind} plugin {name!r}"
        obj = guarded(where, lambda: _attribute(importlib.import_module(module), attr))
    else:
        found = [ep for ep in entry_points(group=GROUPS[kind]) if ep.name == name]
        if not found:
            return None
        where = f"{kind} plugin {name!r} (entry point {found[0].value} in {GROUPS[kind]})"
        obj = guarded(where, found[0].load)
    if not (isinstance(obj, type) and issubclass(obj, base)):
        raise ExplorerError(f"{where} is {obj!r}, not a subclass of explorer's {base.__name__}")
    return obj


def _attribute(module: Any, path: str) -> Any:
    for part in path.split("."):
        module = getattr(module, part)
    return module


def guarded(where: str, call: Any) -> Any:
    """Run `call`; any error (import, attribute, the plugin's own) becomes one line naming the plugin."""
    try:
        return call()
    except Exception as err:  # a broken plugin may raise anything while it is imported
        text = str(err).strip().splitlines()
        raise ExplorerError(f"{where} cannot be loaded: {type(err).__name__}: {text[0] if text else ''}".rstrip(": ")) from None
