"""What a trial stores about κ, and the regime a space compares heads in: free of torch, so that a trial
that does not train with torch (bench/standin.py's stand-in) and everything that reads κ never import it.
The measuring is explorer.conditioning's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypedDict

if TYPE_CHECKING:
    from explorer.families import Family
    from explorer.space import SearchSpace

Kind = Literal["token", "channel", "inner"]
Regime = Literal["fixed-width", "fixed-head-dim", "varying"]
REGIMES: tuple[Regime, ...] = ("fixed-width", "fixed-head-dim")


class BlockKappa(TypedDict):
    """κ of one attention block: its module name, its attention kind, κ (None: its hook never fired)."""

    name: str
    kind: Kind
    kappa: float | None


def geometric_mean(values: Iterable[float]) -> float | None:
    """κ spans orders of magnitude, so its typical value is a mean of logs.

    inf when any value is inf (a rank-deficient block is never dropped); None when there are none.
    """
    values = list(values)
    if not values:
        return None
    if any(math.isinf(v) for v in values):
        return math.inf
    return math.exp(sum(map(math.log, values)) / len(values))


def summary(blocks: Sequence[BlockKappa], kind: Kind = "token") -> float | None:
    """Geometric mean κ over the measured blocks of one kind (token attention by default)."""
    return geometric_mean(b["kappa"] for b in blocks if b["kind"] == kind and b["kappa"] is not None)


def resolved_width(family: Family, dims: Mapping[str, Any]) -> int:
    """The width a configuration builds with (timm: the named model's embed dim when unset)."""
    d = family.check(dims)
    return d.resolved_width() if hasattr(d, "resolved_width") else d.width


def space_regime(space: SearchSpace) -> Regime:
    """How a space compares heads: at one width ("fixed-width"), at one head dimension
    ("fixed-head-dim"), or neither ("varying")."""
    family = space.family
    shapes = {(resolved_width(family, c.dims), c.dims["heads"]) for c in space.configs()}
    if len({w for w, _ in shapes}) == 1:
        return "fixed-width"
    if len({w // h for w, h in shapes}) == 1:
        return "fixed-head-dim"
    return "varying"


def kappa_attrs(init: Sequence[BlockKappa], final: Sequence[BlockKappa], regime: Regime) -> dict[str, Any]:
    """What a trial stores about κ (Optuna user attrs).

    `kappa_init` / `kappa_final`: κ per attention block in the model's order (None: not measured);
    `kappa_blocks` / `kappa_kinds`: those blocks' module names and attention kinds;
    `kappa_init_mean` / `kappa_final_mean`: geometric mean over the token-attention blocks (inf if
    one is rank-deficient, None if the model has none, e.g. XCiT); `kappa_regime`: the space's regime.
    """
    return {
        "kappa_init": [b["kappa"] for b in init],
        "kappa_final": [b["kappa"] for b in final],
        "kappa_blocks": [b["name"] for b in init],
        "kappa_kinds": [b["kind"] for b in init],
        "kappa_init_mean": summary(init),
        "kappa_final_mean": summary(final),
        "kappa_regime": regime,
    }
