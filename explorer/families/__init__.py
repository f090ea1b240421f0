"""Model families by name, like timm's `register_model` / `create_model`.

A family knows how to count a configuration's parameters (and forward FLOPs) without building it,
and how to build it. Adding a family is one new module in this package that calls `register`, and
its name in `MODULES`; a family in the user's own package arrives as a plugin (`explorer.plugins`:
an `explorer.families` entry point, or `module:Class` named in the space's YAML).

The registry knows which module registers each name without importing it, and imports a module the
first time one of its names is asked for: counting a space of an own family imports neither torch
(its models are built in `_transformer.py`) nor timm nor transformers.
"""

from __future__ import annotations

import importlib
import importlib.util
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel

from explorer import plugins
from explorer.errors import ExplorerError

if TYPE_CHECKING:
    from torch import nn

Dims = Mapping[str, Any]
Modality = Literal["image", "sequence", "lm"]

_REGISTRY: dict[str, "Family"] = {}
# name -> the module of this package that registers it, imported on the name's first use
MODULES = {
    "image-encoder": "image",
    "sequence-classifier": "sequence",
    "crammed-bert": "sequence",
    "causal-lm": "lm",
    **{name: "timm_adapters" for name in ("timm-vit", "timm-deit", "timm-xcit", "timm-tnt", "timm-davit")},
    **{name: "hf" for name in ("hf-gpt2", "hf-bert", "hf-llama")},
}


class Family(ABC):
    """A model family: typed dimensions, an exact parameter count, FLOPs, and a builder.

    Every family takes the dimensions `layers`, `heads`, `width`, `mlp` (the MLP hidden width) plus
    its own (e.g. `img_size`, `patch`, `num_classes`, `vocab`, `seq_len`). `Dims` is a pydantic model
    with `extra="forbid"` and defaults; `check(dims)` validates a mapping against it.
    """

    name: ClassVar[str]
    modality: ClassVar[Modality]
    counting: ClassVar[str]  # "closed-form" or "meta-device (cached)": how `params` counts
    Dims: ClassVar[type[BaseModel]]
    requires: ClassVar[tuple[str, str] | None] = None  # (module, pip extra) of an optional package it needs

    def check(self, dims: Dims) -> BaseModel:
        """Validate `dims` against the family's dimensions model (raises pydantic.ValidationError)."""
        return self.Dims.model_validate(dict(dims))

    def defaults(self) -> dict[str, Any]:
        """The dimensions the family fills in when a space leaves them out."""
        return {k: f.default for k, f in self.Dims.model_fields.items() if not f.is_required()}

    @abstractmethod
    def params(self, dims: Dims) -> int:
        """Exact number of parameters of `build(dims)`, computed without building it."""

    @abstractmethod
    def flops(self, dims: Dims) -> int:
        """Forward FLOPs for one sample (2 per multiply-add of the matmuls, attention included)."""

    @abstractmethod
    def build(self, dims: Dims) -> nn.Module:
        """The model. Image: (B, C, H, W) -> (B, classes); sequence: (B, T) -> (B, classes); lm: (B, T) -> (B, T, vocab)."""


def register(family_cls: type[Family]) -> type[Family]:
    """Class decorator: make a family available by its `name`."""
    if family_cls.name in _REGISTRY:
        raise ValueError(f"family {family_cls.name!r} registered twice")
    _REGISTRY[family_cls.name] = family_cls()
    return family_cls


def get_family(name: str) -> Family:
    """The family called `name`: registered here, an entry point, or a `module:Class` plugin.

    An ExplorerError (one line) lists the known names for an unknown one, says what a broken plugin
    raised, and says how to install the optional package a family needs when it is missing.
    """
    if name not in _REGISTRY and name in MODULES:
        importlib.import_module(f"{__name__}.{MODULES[name]}")
    if name not in _REGISTRY:
        family_cls = plugins.load("family", name, Family)
        if family_cls is None:
            raise ExplorerError(f"unknown family {name!r}; known: {', '.join(family_names())} (or a plugin's module:Class)")
        _REGISTRY[name] = plugins.guarded(f"family plugin {name!r}", family_cls)
    family = _REGISTRY[name]
    _check_installed(name, family)
    return family


def _check_installed(name: str, family: Family) -> None:
    if family.requires is None:
        return
    module, extra = family.requires
    try:
        found = importlib.util.find_spec(module) is not None
    except ValueError:  # sys.modules[module] is None: imports of it are blocked
        found = False
    if not found:
        raise ExplorerError(f"family {name!r} needs {module}, which is not installed: pip install 'explorer[{extra}]'")


def family_names() -> list[str]:
    """explorer's families, those registered since, and those installed packages offer through entry
    points, without importing any of them."""
    return sorted({*MODULES, *(n for n in _REGISTRY if not plugins.is_reference(n)), *plugins.entry_point_names("family")})
