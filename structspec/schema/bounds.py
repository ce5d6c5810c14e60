"""Numeric bounds as regexes over decimal digits (outlines-core ignores ``minimum`` and its kin)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

_CAP = 10**15
_FRACTION = r"(\.[0-9]+)?"


@dataclass(frozen=True)
class Bound:
    """One end of a numeric range: its value, whether the value itself is excluded, and the keyword that set it."""

    value: int | float
    open: bool
    keyword: str


def read_bounds(node: dict[str, Any]) -> tuple[Bound | None, Bound | None]:
    """The lower and upper bound of ``node`` (None: unbounded), the tighter of each pair, narrowed to ±10**15.

    Reads draft 4's boolean ``exclusiveMinimum``/``exclusiveMaximum`` as modifiers of
    ``minimum``/``maximum``.
    """
    low = _bound(node, "minimum", "exclusiveMinimum", lower=True)
    return low, _bound(node, "maximum", "exclusiveMaximum", lower=False)


def _bound(node: dict[str, Any], inclusive: str, exclusive: str, lower: bool) -> Bound | None:
    bound = None if node.get(inclusive) is None else Bound(node[inclusive], False, inclusive)
    other = node.get(exclusive)
    if other is True and bound is not None:  # draft 4: a boolean modifying the inclusive keyword
        bound = Bound(bound.value, True, inclusive)
    elif not isinstance(other, bool) and other is not None and (
        bound is None or (other >= bound.value if lower else other <= bound.value)
    ):
        bound = Bound(other, True, exclusive)
    if bound is None:
        return None
    # Beyond the cap, narrow (never widen) the range: digits of a bound cost automaton states.
    return Bound(max(bound.value, -_CAP) if lower else min(bound.value, _CAP), bound.open, bound.keyword)


def integer_limits(low: Bound | None, high: Bound | None) -> tuple[int | None, int | None]:
    """The least and greatest integer within the bounds (None: unbounded)."""
    lo = None if low is None else (math.floor(low.value) + 1 if low.open else math.ceil(low.value))
    hi = None if high is None else (math.ceil(high.value) - 1 if high.open else math.floor(high.value))
    return lo, hi


def integer_range_regex(lo: int | None, hi: int | None) -> str:
    """Regex of the JSON integers ``lo <= n <= hi`` (None: unbounded), without leading zeros."""
    parts = []
    if hi is None or hi >= 0:
        parts.append(_naturals(max(lo, 0) if lo is not None else 0, hi))
    if lo is None or lo < 0:
        parts.append("-(" + _naturals(-hi if hi is not None and hi < 0 else 1, -lo if lo is not None else None) + ")")
    return "|".join(f"({p})" for p in parts)


def decimal_range_regex(lo: int | None, lo_open: bool, hi: int | None, hi_open: bool) -> str:
    """Regex of the decimals (no exponent) between integer bounds; ``*_open`` excludes the bound itself."""
    parts = []
    if hi is None or hi > 0 or (hi == 0 and not hi_open):
        parts.append(_nonnegative_decimals(*((lo, lo_open) if lo is not None and lo >= 0 else (0, False)), hi, hi_open))
    if lo is None or lo < 0:  # x = -y, y > 0 (or y >= -hi when hi < 0)
        low, low_open = (-hi, hi_open) if hi is not None and hi < 0 else (0, True)
        parts.append("-(" + _nonnegative_decimals(low, low_open, None if lo is None else -lo, lo_open) + ")")
    return "|".join(f"({p})" for p in parts)


def _nonnegative_decimals(lo: int, lo_open: bool, hi: int | None, hi_open: bool) -> str:
    if hi == lo:
        return rf"{lo}(\.0+)?"
    parts = [rf"{lo}\.[0-9]*[1-9][0-9]*" if lo_open else f"{lo}{_FRACTION}"]
    if hi is None or hi - 1 >= lo + 1:
        parts.append(f"({_naturals(lo + 1, None if hi is None else hi - 1)}){_FRACTION}")
    if hi is not None and not hi_open:
        parts.append(rf"{hi}(\.0+)?")
    return "|".join(parts)


def _naturals(lo: int, hi: int | None) -> str:
    """Regex of the integers ``0 <= lo <= n <= hi`` (None: unbounded) in decimal."""
    if hi is None:
        n = len(str(lo))
        return f"{_naturals(lo, 10**n - 1)}|[1-9][0-9]{{{n},}}"
    parts = []
    for n in range(len(str(lo)), len(str(hi)) + 1):
        low, high = max(lo, 10 ** (n - 1) if n > 1 else 0), min(hi, 10**n - 1)
        parts.append(_same_length(str(low), str(high)))
    return "|".join(parts)


def _same_length(a: str, b: str) -> str:
    """Regex of the digit strings from ``a`` to ``b`` (same length, a <= b)."""
    if a == b:
        return a
    if len(a) == 1:
        return f"[{a}-{b}]"
    if a[0] == b[0]:
        return a[0] + "(" + _same_length(a[1:], b[1:]) + ")"
    rest = len(a) - 1
    if a[1:] == "0" * rest and b[1:] == "9" * rest:
        return f"[{a[0]}-{b[0]}][0-9]{{{rest}}}"
    parts = [a[0] + "(" + _same_length(a[1:], "9" * rest) + ")"]
    if int(b[0]) - int(a[0]) > 1:
        parts.append(f"[{int(a[0]) + 1}-{int(b[0]) - 1}][0-9]{{{rest}}}")
    parts.append(b[0] + "(" + _same_length("0" * rest, b[1:]) + ")")
    return "|".join(parts)
