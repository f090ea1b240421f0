"""Load YAML into validated pydantic models, with one-line errors that name the file and the field."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from explorer.errors import ExplorerError

M = TypeVar("M", bound=BaseModel)


def read_yaml(path: str | Path) -> dict:
    """Parse a YAML mapping safely (`yaml.safe_load`: tags never construct objects)."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ExplorerError("file not found", source=str(path)) from None
    except (OSError, UnicodeDecodeError) as err:
        raise ExplorerError(f"cannot read: {err}", source=str(path)) from None
    try:
        data = yaml.safe_load(text)
    except RecursionError:
        raise ExplorerError("invalid YAML: nested too deeply", source=str(path)) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else None
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ExplorerError(f"invalid YAML: {problem}", source=str(path), field=where) from None
    if not isinstance(data, dict):
        raise ExplorerError(f"expected a mapping at the top level, got {type(data).__name__}", source=str(path))
    if _exceeds(data, MAX_VALUES):
        raise ExplorerError(f"more than {MAX_VALUES:,} values once aliases are expanded", source=str(path))
    return data


MAX_VALUES = 100_000  # a study or space is a few dozen values; YAML aliases can expand to billions


def _exceeds(data: object, limit: int) -> bool:
    """Whether `data` holds more than `limit` values counting shared (aliased) parts each time they occur."""
    stack, seen = [data], 0
    while stack:
        item = stack.pop()
        seen += 1
        if seen > limit:
            return True
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def validation_error(err: ValidationError, source: str, prefix: str = "") -> ExplorerError:
    """The first pydantic error as one ExplorerError line: `file: field.path: message`."""
    first = err.errors()[0]
    field = ".".join(str(p) for p in (*([prefix] if prefix else []), *first["loc"]))
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown field"
    return ExplorerError(msg, source=source, field=field or None)


def load_model(model: type[M], path: str | Path) -> M:
    """Read `path` and validate it as `model`."""
    data = read_yaml(path)
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise validation_error(err, str(path)) from None
