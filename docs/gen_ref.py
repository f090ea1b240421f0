"""The reference pages, generated from the code at every `mkdocs build` so they cannot drift from it.

`reference/cli.md` is typer's own Markdown of the `explorer` app; `reference/study.md`, `space.md` and
`tasks.md` are tables of the pydantic models a study and a space YAML load into, every field with its
type, default and description (`Field(description=...)`). mkdocs runs this file as a hook (`hooks:` in
mkdocs.yml): `on_files` adds the pages to the build. tests/test_docs.py imports it to check that every
field has a description and every command and option is in the pages. `python docs/gen_ref.py DIR`
writes the pages into DIR to read them without mkdocs.
"""

from __future__ import annotations

import inspect
import json
import sys
import types
import typing
from collections.abc import Callable, Iterator
from enum import Enum
from pathlib import Path
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel

INTRO = "Generated from the code at every `mkdocs build` (docs/gen_ref.py): it cannot drift from what explorer accepts."


# -- the command line -------------------------------------------------------------------------------------
def cli_page() -> str:
    """Every command and option of `explorer`, as typer documents its own apps (`typer ... utils docs`)."""
    import typer
    from typer.cli import get_docs_for_click

    from explorer.cli import app

    command = typer.main.get_command(app)
    text = get_docs_for_click(obj=command, ctx=command.context_class(command), name="explorer", title="Command line")
    head, _, rest = text.partition("\n\n")
    return f"{head}\n\n{INTRO}\n\n{rest}"


# -- the YAML models -----------------------------------------------------------------------------------------
def description(model: type[BaseModel], name: str) -> str | None:
    """A field's description, or that of the field it overrides (a family's Dims re-declare defaults)."""
    for cls in model.__mro__:
        field = getattr(cls, "model_fields", {}).get(name)
        if field is not None and field.description:
            return field.description
    return None


def type_name(annotation: Any, links: dict[type, str]) -> str:
    """An annotation in YAML's words: `integer or null`, `cpu | cuda`, `list of strings`, `mapping: budget`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        anchor = links.get(annotation)
        return f"mapping: [{anchor}](#{slug(anchor)})" if anchor else "mapping"
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        if set(args) == {int, float, str, bool}:
            return "value"  # explorer.space.Scalar
        return " or ".join(type_name(a, links) for a in args)
    if origin in (list, tuple):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return "[" + ", ".join(type_name(a, links) for a in args) + "]"
        inner = type_name(args[0], links) if args else ""
        return f"list of {inner}s" if inner.isalpha() else f"list of {inner}".strip()
    if origin is dict:
        return f"mapping of {type_name(args[0], links)} to {type_name(args[1], links)}" if args else "mapping"
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return " \\| ".join(f"`{m.value}`" for m in annotation)
    return {int: "integer", float: "number", str: "string", bool: "boolean", Path: "path", Any: "any"}.get(
        annotation, getattr(annotation, "__name__", str(annotation)))


BOUNDS = {annotated_types.Ge: "≥", annotated_types.Gt: ">", annotated_types.Le: "≤", annotated_types.Lt: "<"}


def bounds(field: Any) -> str:
    """`≥ 1`, `> 0 and < 1`, `matching ^[A-Za-z0-9]...`: what the field's validation demands beyond its type."""
    said = []
    for item in field.metadata:
        for kind, sign in BOUNDS.items():
            if isinstance(item, kind):
                said.append(f"{sign} {getattr(item, kind.__name__.lower())}")
        if getattr(item, "pattern", None):
            said.append(f"matching `{item.pattern}`")
    return " and ".join(said)


def default(field: Any) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(its defaults)"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, tuple):
        value = list(value)
    return f"`{value}`" if isinstance(value, str) and value else f"`{json.dumps(value)}`"


def nested(annotation: Any, many: bool = False) -> Iterator[tuple[type[BaseModel], bool]]:
    """The models a field's type holds (`Budget`; the `Range` inside `free`'s mapping), each with whether it
    sits in a list or mapping (its YAML path then ends in `.*`)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation, many
    origin = typing.get_origin(annotation)
    for arg in typing.get_args(annotation):
        yield from nested(arg, many or origin in (list, tuple, dict))


def slug(path: str) -> str:
    return path.replace(".*", "").replace(".", "-")


def sections(model: type[BaseModel], path: str = "", out: list | None = None) -> list[tuple[str, type[BaseModel]]]:
    """The model and every model below it, once each, with the YAML path that reaches it (`budget`, `free.*`)."""
    out = [] if out is None else out
    out.append((path, model))
    for name, field in model.model_fields.items():
        for sub, many in nested(field.annotation):
            if sub not in [m for _, m in out]:
                sections(sub, (f"{path}.{name}" if path else name) + (".*" if many else ""), out)
    return out


def field_table(model: type[BaseModel], links: dict[type, str]) -> str:
    rows = ["| field | type | default | description |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        kind = type_name(field.annotation, links)
        limit = bounds(field)
        rows.append(f"| `{name}` | {kind}{', ' + limit if limit else ''} | {default(field)} | "
                    f"{(description(model, name) or '').replace('|', chr(92) + '|')} |")
    return "\n".join(rows)


def doc(obj: Any) -> str:
    """An object's docstring as prose: its paragraphs unwrapped."""
    text = inspect.cleandoc(obj.__doc__ or "")
    return "\n\n".join(" ".join(p.split()) for p in text.split("\n\n") if p.strip())


def models_page(title: str, lead: str, root: type[BaseModel], root_name: str) -> str:
    found = sections(root)
    links = {model: (path or root_name) for path, model in found}
    parts = [f"# {title}", INTRO, lead]
    for path, model in found:
        parts += [f"## {path or root_name} {{#{slug(path or root_name)}}}", doc(model), field_table(model, links)]
    return "\n\n".join(p for p in parts if p) + "\n"


def study_page() -> str:
    from explorer.study.spec import StudySpec

    return models_page("Study YAML", "A study is one YAML file (`studies/*.yaml`); these are its fields, top level first, "
                       "then each mapping. Unknown keys are errors naming the file and the field. The task's options "
                       "are in [Tasks](tasks.md), the space's fields in [Space YAML](space.md).", StudySpec, "study")


def space_page() -> str:
    from explorer.space import SpaceSpec

    text = models_page("Space YAML", "A space is one YAML file (`spaces/*.yaml`); these are its fields. `fixed`, "
                       "`free` and `baseline` name the dimensions of its family, listed below.", SpaceSpec, "space")
    parts = ["## Families", "Each family's dimensions: what `fixed`, `free` and `baseline` may name. A dimension the "
             "space leaves out takes the family's default; the task fixes some (image size, channels, classes, "
             "vocabulary, sequence length)."]
    for name, family in own_families().items():
        parts += [f"### {name} {{#family-{name}}}", doc(type(family)),
                  doc(family.Dims), field_table(family.Dims, {})]
    return text + "\n" + "\n\n".join(p for p in parts if p) + "\n"


def tasks_page() -> str:
    parts = ["# Tasks", INTRO, "A study's `task:` names one of these and sets its options, e.g. `task: {name: text-file, "
             "path: ../data/tinystories.txt, seq_len: 256}`; an unknown option is an error naming the closest real "
             "one. Relative `root` and `path` are relative to the study YAML."]
    for name, task in own_tasks().items():
        module = sys.modules[task.__module__]
        parts += [f"## {name} {{#{name}}}", doc(module).split("\n\n")[0] + f" Metric: `{task.metric}`.",
                  field_table(task.Options, {})]
    return "\n\n".join(parts) + "\n"


PAGES: dict[str, Callable[[], str]] = {
    "reference/cli.md": cli_page,
    "reference/study.md": study_page,
    "reference/space.md": space_page,
    "reference/tasks.md": tasks_page,
}


def own_families() -> dict[str, Any]:
    """explorer's own families by name, whether or not the optional package one needs (transformers) is
    installed: their dimensions are documented either way."""
    import importlib

    from explorer.families import _REGISTRY, MODULES

    for module in sorted(set(MODULES.values())):
        importlib.import_module(f"explorer.families.{module}")
    return {name: _REGISTRY[name] for name in sorted(MODULES)}


def own_tasks() -> dict[str, Any]:
    """explorer's own tasks by name (a plugin's are its own package's to document)."""
    from explorer.tasks import _REGISTRY, task_names

    return {n: _REGISTRY[n] for n in task_names() if n in _REGISTRY and _REGISTRY[n].__module__.startswith("explorer.")}


def models() -> list[type[BaseModel]]:
    """Every model a YAML field loads into: the study's and the space's (with everything below them), each
    task's options and each family's dimensions."""
    from explorer.space import SpaceSpec
    from explorer.study.spec import StudySpec

    found = [m for root in (StudySpec, SpaceSpec) for _, m in sections(root)]
    return found + [t.Options for t in own_tasks().values()] + [f.Dims for f in own_families().values()]


def undescribed() -> list[str]:
    """`Model.field` for each field of `models()` without a description: the test fails on any."""
    return [f"{m.__module__}.{m.__name__}.{name}" for m in models() for name in m.model_fields if not description(m, name)]


def on_files(files: Any, config: Any) -> Any:
    """mkdocs hook: the generated pages join the files of the build."""
    from mkdocs.structure.files import File

    for path, make in PAGES.items():
        files.append(File.generated(config, path, content=make()))
    return files


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python docs/gen_ref.py DIR  (writes the reference pages into DIR)")
    out = Path(sys.argv[1])
    for path, make in PAGES.items():
        (out / path).parent.mkdir(parents=True, exist_ok=True)
        (out / path).write_text(make())
        print(out / path)
