"""How explorer writes a split and a number for people: one form in the terminal, the dashboard and the README.

A split is `3 / 8` (layers / heads), with the other free dimensions after it where a space frees them:
`3 / 8 / w96` (width), `3 / 8 / w96 / mlp256`, `3 / 8 / kv2` (key-value heads). An accuracy-like metric
(higher is better) is written to 3 decimals and its differences in points to 1; any other metric to 4
significant digits. Strings only: nothing here imports more than the standard library.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

LEVEL_WORDS = "95% interval"
_TAGS = {"width": "w", "mlp": "mlp", "kv_heads": "kv"}  # after layers / heads, in this order; others as name=value


def dims_of(key: str) -> dict[str, str]:
    """`layers=3,heads=8` -> {'layers': '3', 'heads': '8'} (a configuration's key, as `Config.key` writes it)."""
    out = {}
    for part in key.split(","):
        name, sep, value = part.partition("=")
        if not sep or not name:
            return {}
        out[name.strip()] = value.strip()
    return out


def split(config: str | Mapping[str, Any]) -> str:
    """A configuration as people read it: `3 / 8`, `3 / 8 / w96`; a key without layers and heads as it is.

    `config` is a configuration's key (`layers=3,heads=8,width=96`) or its free dimensions as a mapping.
    """
    dims = dims_of(config) if isinstance(config, str) else {k: str(v) for k, v in config.items() if v is not None}
    if "layers" not in dims or "heads" not in dims:
        return config if isinstance(config, str) else ",".join(f"{k}={v}" for k, v in dims.items())
    parts = [dims["layers"], dims["heads"]]
    parts += [f"{tag}{dims[name]}" for name, tag in _TAGS.items() if name in dims]
    parts += [f"{name}={value}" for name, value in dims.items() if name not in ("layers", "heads", *_TAGS)]
    return " / ".join(parts)


def split_header(free: Iterable[str]) -> str:
    """The words over a column of splits: `layers / heads`, `layers / heads / width`."""
    free = list(free)
    named = [d for d in ("layers", "heads") if d in free] + [d for d in _TAGS if d in free]
    return " / ".join(named + [d for d in free if d not in named]) or "configuration"


def plural(n: int, word: str, many: str | None = None) -> str:
    """`1 run`, `2 runs`, `0 configurations`."""
    return f"{n} {word if n == 1 else many or word + 's'}"


def epochs_words(n: int) -> str:
    """A length: `1 epoch`, `20 epochs`."""
    return plural(int(n), "epoch")


def value(x: float, accuracy_like: bool) -> str:
    """A metric's value: 3 decimals for an accuracy-like metric, else 4 significant digits; empty if missing."""
    if x is None or not math.isfinite(x):
        return ""
    return f"{x:.3f}" if accuracy_like else f"{x:.4g}"


def same_precision(x: float, like: str) -> str:
    """`x` with as many decimals as the number written `like` (a ± beside its mean); empty if missing."""
    if x is None or not math.isfinite(x):
        return ""
    mantissa = like.split("e")[0]
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    return f"{x:.{decimals}f}"


def interval(lo: float, hi: float, accuracy_like: bool, what: str = LEVEL_WORDS) -> str:
    """`95% interval 0.921 to 0.945`, the one form for measured and predicted values alike."""
    return f"{what} {value(lo, accuracy_like)} to {value(hi, accuracy_like)}"


def points(x: float, signed: bool = False) -> str:
    """A difference of an accuracy-like metric in points (x 100), to 1 decimal."""
    return f"{100 * x:+.1f}" if signed else f"{100 * x:.1f}"


def bound(x: float) -> str:
    """An upper bound of an accuracy-like metric in points, to 1 decimal rounded up: a bound of 1.04 points
    reads 1.1, never the 1.0 that a margin of 1 would call decided."""
    return f"{math.ceil(round(1000 * x, 6)) / 10:.1f}"


def margin(x: float, unit: float, what: str, exact: bool = False) -> str:
    """A bound or margin with its unit, singular at 1: a bound in points to 1 decimal, rounded up (`0.7
    points`), a margin the user chose (`exact`) and any other metric's units to 2 significant digits."""
    shown = bound(unit * x / 100).removesuffix(".0") if what == "points" and not exact else f"{unit * x:.2g}"
    return f"{shown} {'point' if what == 'points' and shown == '1' else what}"
