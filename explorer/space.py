"""Search spaces over depth, heads, MLP width and width, loaded from YAML and validated.

A space is data: the family, the dimensions every configuration shares (`fixed`), the ones that move
(`free`), and the constraints. It enumerates its feasible configurations in a stable order, with
parameters counted exactly by the family before any model is built, and explains why any
configuration is infeasible.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from explorer.errors import ExplorerError
from explorer.families import Family, get_family
from explorer.units import parse_count
from explorer.yamlio import clean_message, first_error, load_model

Scalar = int | float | str | bool
CANONICAL = ("layers", "heads", "width", "mlp")
MAX_CANDIDATES = 100_000  # combinations of free values a space may enumerate (each is counted exactly)


class Range(BaseModel):
    """`{min: 2, max: 12, step: 2}`: integers from min to max inclusive."""

    model_config = ConfigDict(extra="forbid")
    min: int = Field(description="the smallest value")
    max: int = Field(description="the largest value (included when the steps reach it)")
    step: int = Field(1, gt=0, description="between values")

    @model_validator(mode="after")
    def _ordered(self) -> "Range":
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) is below min ({self.min})")
        return self

    def values(self) -> list[int]:
        return list(range(self.min, self.max + 1, self.step))


class Constraints(BaseModel):
    """`heads_divide_width` may only be true: every family splits the width evenly among the heads,
    so false could not admit a single extra configuration (it is kept so that YAML stating it, and
    the fingerprints of stored studies, stay valid)."""

    model_config = ConfigDict(extra="forbid")
    fixed_mlp: bool = Field(True, description="the MLP width stays fixed while depth and heads move (mlp may not be free)")
    heads_divide_width: bool = Field(True, description="may only be true: every family splits the width evenly among the heads")
    min_head_dim: int = Field(1, ge=1, description="the smallest width / heads a configuration may have")
    param_budget: tuple[int | None, int | None] = Field(
        (None, None), description="`[lo, hi]` parameters (`400k`, `60M`; either null): configurations outside are infeasible")

    @field_validator("heads_divide_width")
    @classmethod
    def _always(cls, value: bool) -> bool:
        if not value:
            raise ValueError("every family needs heads to divide the width; remove the line or set it true")
        return value

    @field_validator("param_budget", mode="before")
    @classmethod
    def _counts(cls, value: Any) -> Any:
        if not isinstance(value, (list, tuple)) or len(value) != 2:
            raise ValueError("expected [lo, hi]; either may be null")
        return tuple(None if v is None else parse_count(v) for v in value)


class SpaceSpec(BaseModel):
    """The YAML of a space, field for field."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="the space's name")
    family: str = Field(description="the model family: one of explorer's (below), an entry point's name, or `module:Class`")
    description: str = Field("", description="free text for the reader")
    fixed: dict[str, Scalar] = Field({}, description="the dimensions every configuration shares, e.g. `{width: 64, mlp: 128}`")
    free: dict[str, list[Scalar] | Range | Literal["divisors"]] = Field(
        description="the dimensions that move: each a list of values, `{min, max, step}`, or `divisors` (heads only: "
                    "the width's divisors)")
    constraints: Constraints = Field(Constraints(), description="what makes a configuration feasible")
    baseline: dict[str, Scalar] | None = Field(None, description="the configuration answers are compared with, by its "
                                                                 "free dimensions; null: none")

    @model_validator(mode="before")
    @classmethod
    def _a_space(cls, data: Any) -> Any:
        """A study YAML where a space is expected is said to be one, not a space with unknown fields."""
        if isinstance(data, dict) and "family" not in data and {"task", "n_trials"} & set(data):
            its = f"; its space: {data['space']}" if isinstance(data.get("space"), str) else ""
            raise ValueError("this is a study YAML (it names a space and a task), where a space YAML is expected (a "
                             f"family and its free dimensions, as in spaces/){its}")
        return data

    @field_validator("free", mode="before")
    @classmethod
    def _free(cls, free: Any) -> dict:
        """Each free dimension: a list of values, `{min, max, step}`, or `divisors` (heads only)."""
        if not isinstance(free, dict) or not free:
            raise ValueError("expected a mapping of at least one dimension to its values")
        out: dict[str, Any] = {}
        for key, values in free.items():
            if values == "divisors":
                if key != "heads":
                    raise ValueError(f"{key}: 'divisors' is only for heads")
                out[key] = values
            elif isinstance(values, dict):
                try:
                    out[key] = Range.model_validate(values)
                except ValidationError as err:
                    loc, msg = first_error(err, Range)
                    raise ValueError(".".join(map(str, (key, *loc))) + f": {msg}") from None
            elif isinstance(values, list) and values and all(isinstance(v, (int, float, str, bool)) for v in values):
                out[key] = values
            elif isinstance(values, list):
                raise ValueError(f"{key}: {'empty list of values' if not values else 'values must be numbers or strings'}")
            else:
                raise ValueError(f"{key}: expected a list of values, {{min, max, step}} or 'divisors'")
        return out


@dataclass(frozen=True)
class Config:
    """One architecture: the family, its complete dimensions, and its exact parameter count."""

    family: str
    items: tuple[tuple[str, Scalar], ...]
    free: tuple[str, ...]
    params: int

    @property
    def dims(self) -> dict[str, Scalar]:
        return dict(self.items)

    @cached_property
    def key(self) -> str:
        """The free dimensions, e.g. `layers=4,heads=2`: the name Optuna samples (made once: queues read it per trial)."""
        dims = self.dims
        return ",".join(f"{k}={dims[k]}" for k in self.free)

    def __getitem__(self, name: str) -> Scalar:
        return self.dims[name]


class SearchSpace:
    """A validated space; `configs()` are its feasible configurations."""

    def __init__(self, spec: SpaceSpec, source: str = "<space>"):
        self.spec = spec
        self.source = source
        self.family: Family = self._family()
        self._check_dims()

    @property
    def name(self) -> str:
        return self.spec.name

    def _error(self, msg: str, field: str | None = None) -> ExplorerError:
        return ExplorerError(msg, source=self.source, field=field or None)

    def _family(self) -> Family:
        try:
            return get_family(self.spec.family)
        except ExplorerError as err:
            raise self._error(str(err), "family") from None

    def _check_dims(self) -> None:
        known = set(self.family.Dims.model_fields)
        spec = self.spec
        for section in ("fixed", "free"):
            for key in getattr(spec, section):
                if key not in known:
                    raise self._error(f"{spec.family} has no dimension {key!r}; it has {', '.join(sorted(known))}", f"{section}.{key}")
        if spec.constraints.fixed_mlp and "mlp" in spec.free:
            raise self._error("fixed_mlp is true, so mlp must be fixed, not free", "free.mlp")
        for key in sorted(set(spec.fixed) & set(spec.free)):
            raise self._error("is both fixed and free", f"free.{key}")
        fields = self.family.Dims.model_fields
        for key, value in spec.fixed.items():
            try:
                TypeAdapter(fields[key].annotation).validate_python(value, strict=True)
            except ValidationError as err:
                raise self._error(first_error(err)[1], f"fixed.{key}") from None
        self._check_fixed_values()
        if spec.free.get("heads") == "divisors" and "width" not in spec.fixed and "width" not in spec.free:
            if "width" not in self.family.defaults():
                raise self._error("'divisors' needs a width", "free.heads")
        if spec.baseline is not None:
            unknown = set(spec.baseline) - set(spec.free)
            if unknown:
                raise self._error(f"{sorted(unknown)[0]!r} is not a free dimension", "baseline")

    def _check_fixed_values(self) -> None:
        """Name a fixed value the family rejects whatever the free ones are (a timm `model` of another
        family, a typo, a width of 0), instead of reporting only that every configuration is infeasible.

        The family validates one probe configuration (each free dimension at its first value); an
        error located at a fixed field is that field's alone, since families check the combination of
        fields in model validators, which report no field.
        """
        first = {k: 1 if v == "divisors" else v.min if isinstance(v, Range) else v[0] for k, v in self.spec.free.items()}
        try:
            self.family.check({**self.family.defaults(), **self.spec.fixed, **first})
        except ValidationError as err:
            for e in err.errors():
                if len(e["loc"]) == 1 and e["loc"][0] in self.spec.fixed:
                    raise self._error(clean_message(e["msg"]), f"fixed.{e['loc'][0]}") from None

    @property
    def free_dims(self) -> tuple[str, ...]:
        """The free dimensions in a canonical order (depth first), whatever the YAML's order."""
        rank = {k: i for i, k in enumerate(CANONICAL)}
        return tuple(sorted(self.spec.free, key=lambda k: (rank.get(k, len(rank)), k)))

    def _values(self, key: str, width: Any) -> list[Scalar]:
        values = self.spec.free[key]
        if values == "divisors":
            if not isinstance(width, int) or isinstance(width, bool) or width < 1:
                raise self._error(f"'divisors' needs a positive integer width, got width={width!r}", "free.heads")
            return _divisors(width)
        if isinstance(values, Range):
            return values.values()
        return list(values)

    def _candidates(self) -> list[dict[str, Scalar]]:
        """Every combination of free values, fixed and default dims filled in, in a stable order."""
        base = {**self.family.defaults(), **self.spec.fixed}
        order = [k for k in self.free_dims if k != "heads"]  # heads may depend on width
        self._guard(math.prod(_count(self.spec.free[k]) for k in order))  # before listing anything
        if "heads" in self.spec.free:  # then every free dimension's product, heads included
            widths = self._values("width", None) if "width" in self.spec.free else [base.get("width")]
            per_width = sum(len(self._values("heads", w)) for w in widths)
            self._guard(math.prod(_count(self.spec.free[k]) for k in order if k != "width") * per_width)
        out = []
        for combo in itertools.product(*(self._values(k, None) for k in order)):
            dims = {**base, **dict(zip(order, combo))}
            if "heads" in self.spec.free:
                for h in self._values("heads", dims.get("width")):
                    out.append({**dims, "heads": h})
            else:
                out.append(dims)
        return out

    def _guard(self, count: int) -> None:
        """Refuse more than MAX_CANDIDATES combinations before enumerating them: a typo like
        `max: 100000000` must be an error, not a hang."""
        if count > MAX_CANDIDATES:
            raise self._error(f"{count:,} combinations of free values; at most {MAX_CANDIDATES:,} (narrow a range or raise its step)", "free")

    def _violations(self, dims: dict[str, Scalar]) -> tuple[list[tuple[str, str]], int | None]:
        """(constraint, message) for each broken constraint, and the parameter count when it was needed."""
        c = self.spec.constraints
        found = [("fixed", f"{k}={dims.get(k)} but the space fixes {k}={v}") for k, v in self.spec.fixed.items() if dims.get(k) != v]
        width, heads = dims.get("width"), dims.get("heads")
        if isinstance(width, int) and isinstance(heads, int) and heads > 0:
            if width % heads:
                found.append(("heads_divide_width", f"heads={heads} does not divide width={width}"))
            elif width // heads < c.min_head_dim:
                found.append(("min_head_dim", f"head dim {width // heads} < min_head_dim {c.min_head_dim}"))
        if not found:
            try:
                self.family.check(dims)
            except ValidationError as err:
                loc, msg = first_error(err, self.family.Dims)
                found.append(("dims", f"{'.'.join(map(str, loc)) or 'dims'}: {msg}"))
        if found:
            return found, None
        params = self.family.params(dims)
        lo, hi = c.param_budget
        if lo is not None and params < lo:
            found.append(("param_budget", f"{params:,} parameters < budget low {lo:,}"))
        if hi is not None and params > hi:
            found.append(("param_budget", f"{params:,} parameters > budget high {hi:,}"))
        return found, params

    def explain(self, dims: dict[str, Scalar]) -> list[str]:
        """Why `dims` is not a feasible configuration of this space (empty when it is)."""
        return [msg for _, msg in self._violations(dims)[0]]

    @cached_property
    def _enumerated(self) -> tuple[list[Config], Counter, dict[str, str], dict[tuple[str, Scalar], str]]:
        """Feasible configurations, rejections counted by constraint, one example message each, and for each
        listed free value the first reason other than the parameter budget that rejected it."""
        feasible, rejected, example, dropped = [], Counter(), {}, {}
        free = self.free_dims
        listed = [k for k in free if isinstance(self.spec.free[k], list)]
        for dims in self._candidates():
            violations, params = self._violations(dims)
            if violations:
                reason, message = violations[0]
                rejected[reason] += 1
                example.setdefault(reason, f"{','.join(f'{k}={dims[k]}' for k in free)}: {message}")
                for k in listed if reason != "param_budget" else ():
                    dropped.setdefault((k, dims[k]), message)
            else:
                feasible.append(Config(self.spec.family, tuple(dims.items()), free, params))
        return feasible, rejected, example, dropped

    def configs(self) -> list[Config]:
        """The feasible configurations; an ExplorerError saying why when there are none, or naming a listed
        value no configuration can take (`heads: [1, 3]` at width 16), which would otherwise vanish unsaid."""
        feasible, rejected, example, dropped = self._enumerated
        if not feasible:
            why = ", ".join(f"{n} rejected by {r}" for r, n in rejected.most_common()) or "nothing to enumerate"
            first = f"; e.g. {example[rejected.most_common(1)[0][0]]}" if rejected else ""
            raise self._error(f"no feasible configuration ({why}){first}", "free")
        taken = {(k, v) for c in feasible for k, v in c.items if k in c.free}
        for key in self.free_dims:
            lost = [v for v in self.spec.free[key] if (key, v) not in taken and (key, v) in dropped] \
                if isinstance(self.spec.free[key], list) else []
            if lost:
                raise self._error(f"{', '.join(map(str, lost))} fit{'s' if len(lost) == 1 else ''} no configuration "
                                  f"(e.g. {dropped[(key, lost[0])]}); remove {'it' if len(lost) == 1 else 'them'}",
                                  f"free.{key}")
        return feasible

    def config(self, key: str) -> Config:
        """The feasible configuration called `key` (e.g. `layers=4,heads=2`)."""
        for cfg in self.configs():
            if cfg.key == key:
                return cfg
        raise self._error(f"no feasible configuration {key!r}")

    @property
    def baseline(self) -> Config | None:
        """The space's reference configuration, when it declares one (it must be feasible)."""
        if self.spec.baseline is None:
            return None
        wanted = self.spec.baseline
        for cfg in self.configs():
            if all(cfg.dims.get(k) == v for k, v in wanted.items()):
                return cfg
        dims = {**self.family.defaults(), **self.spec.fixed, **wanted}
        why = "; ".join(self.explain(dims)) or "it is not in the free ranges"
        raise self._error(f"baseline is infeasible: {why}", "baseline")

    def to_dict(self) -> dict[str, Any]:
        return self.spec.model_dump(mode="json")

    @property
    def fingerprint(self) -> str:
        """A hash of what defines the space, to refuse silently changing a running study's space."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def _count(values: Any) -> int:
    """How many values a free dimension takes, without listing a range (heads' divisors: counted later)."""
    if isinstance(values, Range):
        return len(range(values.min, values.max + 1, values.step))
    return 1 if values == "divisors" else len(values)


def _divisors(n: int) -> list[int]:
    """The positive divisors of `n` in increasing order, in O(sqrt n) steps (none when n < 1)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0] if n >= 1 else []
    return sorted({*small, *(n // d for d in small)})


def widened(space: SearchSpace, budget: int, steps: int = 64) -> list[Config]:
    """Feasible configurations past `space`'s declared ranges with at most `budget` parameters, not in the
    space (those of `wider`): where the posterior answers past the space (explorer.recommend)."""
    known = {c.key for c in space.configs()}
    return [c for c in wider(space, budget, steps)._enumerated[0] if c.params <= budget and c.key not in known]


def wider(space: SearchSpace, budget: int, steps: int = 64) -> SearchSpace:
    """`space` with each `{min, max, step}` range continued upwards while its smallest configuration fits
    `budget` (at most `steps` more values); the fixed dimensions, value lists and constraints kept."""
    free = dict(space.spec.free)
    base = {**space.family.defaults(), **space.spec.fixed,
            **{k: 1 if v == "divisors" else v.min if isinstance(v, Range) else min(v) for k, v in free.items()}}
    for key, values in free.items():
        if isinstance(values, Range):
            top = values.max
            while top < values.max + steps * values.step and space.family.params({**base, key: top + values.step}) <= budget:
                top += values.step
            free[key] = Range(min=values.min, max=top, step=values.step)
    return SearchSpace(space.spec.model_copy(update={"free": free}), space.source)


def load_space(path: str | Path) -> SearchSpace:
    """Load and validate a space YAML; every error names the file and the field."""
    space = SearchSpace(load_model(SpaceSpec, path), str(path))
    space.configs()  # an empty space is an error at load time
    space.baseline
    return space
