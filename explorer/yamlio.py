"""Load YAML into validated pydantic models, with one-line errors that name the file and the field."""

from __future__ import annotations

import difflib
import typing
from pathlib import Path
from typing import Any, TypeVar

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


def first_error(err: ValidationError, model: type[BaseModel] | None = None) -> tuple[tuple, str]:
    """The error a user should read first, as (location, message) without pydantic's decoration.

    An unknown key comes first, with the closest known field: `n_trails` is why `n_trials` is
    missing. `model` (the validated class) supplies the known fields.
    """
    errors = err.errors()
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = tuple(first["loc"])
    if first["type"] != "extra_forbidden":
        return loc, clean_message(first["msg"])
    known = _fields_at(model, loc[:-1]) if model is not None else []
    close = difflib.get_close_matches(str(loc[-1]), known, n=1) if loc else []
    hint = f" (did you mean {close[0]}?)" if close else f" (known: {', '.join(known)})" if known else ""
    return loc, f"unknown field{hint}"


def clean_message(msg: str) -> str:
    """pydantic's message without the "Value error, " or "Assertion failed, " its validators' errors get."""
    return msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")


def _fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """The field names of the (nested) model at `loc`, following model-typed fields, lists and optionals."""
    types: list[Any] = [model]
    for part in loc:
        if isinstance(part, int):
            continue  # an index into a list: the list's item type is already among `types`
        nxt: list[Any] = []
        for t in _models(types):
            field = t.model_fields.get(str(part))
            if field is not None:
                nxt.append(field.annotation)
        types = nxt
    names = [name for t in _models(types) for name in t.model_fields]
    return list(dict.fromkeys(names))


def _models(types: list[Any]) -> list[type[BaseModel]]:
    """The pydantic models in `types`, looking inside `X | None`, `list[X]` and the like."""
    out, stack = [], list(types)
    while stack:
        t = stack.pop()
        if isinstance(t, type) and issubclass(t, BaseModel):
            out.append(t)
        else:
            stack.extend(typing.get_args(t))
    return out


def validation_error(err: ValidationError, source: str, prefix: str = "", model: type[BaseModel] | None = None) -> ExplorerError:
    """The error to read first (see `first_error`) as one ExplorerError line: `file: field.path: message`."""
    loc, msg = first_error(err, model)
    field = ".".join(str(p) for p in (*([prefix] if prefix else []), *loc))
    return ExplorerError(msg, source=source, field=field or None)


def load_model(model: type[M], path: str | Path) -> M:
    """Read `path` and validate it as `model`."""
    data = read_yaml(path)
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise validation_error(err, str(path), model=model) from None
