"""Human counts: 60M, 1.5e6, 250k."""

from __future__ import annotations

import math
import re

_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9}
_COUNT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmbg]?)\s*$", re.IGNORECASE)


def parse_count(text: str | int | float) -> int:
    """`"60M"` -> 60_000_000; numbers pass through. ValueError on anything else."""
    if isinstance(text, bool):
        raise ValueError(f"not a count: {text!r}")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        match = _COUNT.match(text)
        if not match:
            raise ValueError(f"not a count: {text!r} (try 60M, 250k or 1.5e6)")
        value = float(match.group(1)) * _SUFFIX[match.group(2).lower()]
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"not a count: {text!r}")
    return round(value)


def format_count(n: float) -> str:
    """60_000_000 -> '60.0M' (what the paper's tables print)."""
    for div, suffix in ((10**9, "B"), (10**6, "M"), (10**3, "k")):
        if abs(n) >= div:
            return f"{n / div:.1f}{suffix}"
    return str(int(n))
