"""Numeric bounds as regexes over decimal digits (outlines-core ignores ``minimum`` and its kin), and the
default digit bounds that make every JSON number end."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

MAX_INTEGER_DIGITS = 18
"""Default bound on the integer digits of a number the schema leaves unbounded (``max_integer_digits``)."""

MAX_FRACTION_DIGITS = 15
"""Default bound on the fraction digits of a number (``max_fraction_digits``)."""

EXPONENT_DIGITS = 3
"""Exponent digits of an unbounded number while integer digits are bounded (a float64's exponent has 3)."""

CAP = 10**15
"""A bound farther than CAP from the other end of its range (from 0 where it has none) is narrowed to that
distance: each digit of a range costs automaton states. Never past the other end: a narrow range of large
numbers (10**16 to 10**16 + 5) is kept exactly."""


@dataclass(frozen=True)
class Digits:
    """How many digits a number the schema leaves unbounded may have (None: any number, the model may
    write digits until the budget runs out)."""

    integer: int | None = MAX_INTEGER_DIGITS
    fraction: int | None = MAX_FRACTION_DIGITS

    @property
    def bounded(self) -> bool:
        """Whether either bound is on."""
        return self.integer is not None or self.fraction is not None

    def integer_regex(self) -> str:
        """Regex of the JSON integers of at most ``integer`` digits."""
        return rf"-?(0|[1-9][0-9]{_times(0, None if self.integer is None else self.integer - 1)})"

    def number_regex(self) -> str:
        """Regex of the JSON numbers (exponent included) within the digit bounds: outlines-core's ``NUMBER``
        without them, but for the exponent's sign, which JSON leaves optional (``1e5``)."""
        exponent = None if self.integer is None else EXPONENT_DIGITS
        return rf"{self.integer_regex()}{fraction_regex(self.fraction)}([eE][+-]?[0-9]{_times(1, exponent)})?"

    def describe(self, kind: str) -> str:
        """What the bounds narrow a ``kind`` ("integer" or "number") to, in words."""
        parts = [] if self.integer is None else [f"{self.integer} integer digits (max_integer_digits)"]
        if kind == "number" and self.fraction is not None:
            parts.append(f"{self.fraction} fraction digits (max_fraction_digits)")
        if kind == "number" and self.integer is not None:
            parts.append(f"{EXPONENT_DIGITS} exponent digits")
        return f"{kind} of at most " + ", ".join(parts)


def fraction_regex(digits: int | None) -> str:
    """Regex of an optional fraction of at most ``digits`` digits (None: any number)."""
    return rf"(\.[0-9]{_times(1, digits)})?"


def _times(low: int, high: int | None) -> str:
    """A repeat count from ``low`` to ``high`` (None: no limit)."""
    if high is None:
        return "*" if low == 0 else "+" if low == 1 else f"{{{low},}}"
    return f"{{{low},{high}}}"


@dataclass(frozen=True)
class Bound:
    """One end of a numeric range: its value, whether the value itself is excluded, and the keyword that set it."""

    value: int | float
    open: bool
    keyword: str


def read_bounds(node: dict[str, Any]) -> tuple[Bound | None, Bound | None]:
    """The lower and upper bound of ``node`` (None: unbounded), the tighter of each pair, each at most `CAP` from
    the other end (from 0 where there is none).

    Reads draft 4's boolean ``exclusiveMinimum``/``exclusiveMaximum`` as modifiers of
    ``minimum``/``maximum``. Values stay as the schema states them (a Python int is exact).
    """
    low = _bound(node, "minimum", "exclusiveMinimum", lower=True)
    high = _bound(node, "maximum", "exclusiveMaximum", lower=False)
    # Narrow (never widen) a far end toward the other one: digits of a bound cost automaton states.
    lowest = min(-CAP, high.value - CAP) if high is not None else -CAP
    highest = max(CAP, low.value + CAP) if low is not None else CAP
    if low is not None and low.value < lowest:
        low = Bound(lowest, low.open, low.keyword)
    if high is not None and high.value > highest:
        high = Bound(highest, high.open, high.keyword)
    return low, high


def _bound(node: dict[str, Any], inclusive: str, exclusive: str, lower: bool) -> Bound | None:
    bound = None if node.get(inclusive) is None else Bound(node[inclusive], False, inclusive)
    other = node.get(exclusive)
    if other is True and bound is not None:  # draft 4: a boolean modifying the inclusive keyword
        bound = Bound(bound.value, True, inclusive)
    elif not isinstance(other, bool) and other is not None and (
        bound is None or (other >= bound.value if lower else other <= bound.value)
    ):
        bound = Bound(other, True, exclusive)
    return bound


def integer_limits(low: Bound | None, high: Bound | None) -> tuple[int | None, int | None]:
    """The least and greatest integer within the bounds (None: unbounded)."""
    lo = None if low is None else (math.floor(low.value) + 1 if low.open else math.ceil(low.value))
    hi = None if high is None else (math.ceil(high.value) - 1 if high.open else math.floor(high.value))
    return lo, hi


def integer_range_regex(lo: int | None, hi: int | None) -> str:
    """Regex of the JSON integers ``lo <= n <= hi`` (None: unbounded), without leading zeros; zero also as ``-0``
    (JSON's grammar, Python and Pydantic read it as 0)."""
    parts = []
    if hi is None or hi >= 0:
        parts.append(_naturals(max(lo, 0) if lo is not None else 0, hi))
    if lo is None or lo < 0:
        parts.append("-(" + _naturals(-hi if hi is not None and hi < 0 else 1, -lo if lo is not None else None) + ")")
    if (lo is None or lo <= 0) and (hi is None or hi >= 0):
        parts.append("-0")
    return "|".join(f"({p})" for p in parts)


def decimal_range_regex(lo: int | None, lo_open: bool, hi: int | None, hi_open: bool,
                        fraction: int | None = None, exponent: int | None = EXPONENT_DIGITS) -> str:
    """Regex of the numbers between integer bounds, with at most ``fraction`` fraction digits (None: any
    number); ``*_open`` excludes the bound itself. Decimals, and the numbers below 1 in magnitude written as
    Python and Pydantic write small floats (``1.5e-07``: one nonzero integer digit, a negative exponent of at
    most ``exponent`` digits, None: any) where the range holds all of them on their side of 0; no other
    exponent (a decade the range holds only in part would take a regex of its digits)."""
    small = rf"[1-9]{fraction_regex(fraction)}[eE]-{_positive_fraction(exponent)}"  # 0 < x < 1
    parts = []
    if hi is None or hi > 0 or (hi == 0 and not hi_open):
        low = (lo, lo_open) if lo is not None and lo >= 0 else (0, False)
        parts.append(_nonnegative_decimals(*low, hi, hi_open, fraction))
    if lo is None or lo < 0:  # x = -y, y > 0 (or y >= -hi when hi < 0)
        low, low_open = (-hi, hi_open) if hi is not None and hi < 0 else (0, True)
        parts.append("-(" + _nonnegative_decimals(low, low_open, None if lo is None else -lo, lo_open, fraction) + ")")
    if (lo is None or lo < 0 or (lo == 0 and not lo_open)) and (hi is None or hi > 0 or (hi == 0 and not hi_open)):
        parts.append(rf"-0(\.0{_times(1, fraction)})?")  # -0.0, as Python and Pydantic write negative zero
    if (lo is None or lo <= 0) and (hi is None or hi >= 1):
        parts.append(small)
    if (hi is None or hi >= 0) and (lo is None or lo <= -1):
        parts.append(f"-{small}")
    return "|".join(f"({p})" for p in parts)


def _nonnegative_decimals(lo: int, lo_open: bool, hi: int | None, hi_open: bool, fraction: int | None) -> str:
    zeros = rf"(\.0{_times(1, fraction)})?"
    if hi == lo:
        return f"{lo}{zeros}"
    parts = [f"{lo}\\.{_positive_fraction(fraction)}" if lo_open else f"{lo}{fraction_regex(fraction)}"]
    if hi is None or hi - 1 >= lo + 1:
        parts.append(f"({_naturals(lo + 1, None if hi is None else hi - 1)}){fraction_regex(fraction)}")
    if hi is not None and not hi_open:
        parts.append(f"{hi}{zeros}")
    return "|".join(parts)


def _positive_fraction(digits: int | None) -> str:
    """Regex of the fraction digits (after the point) that are not all zeros, at most ``digits`` of them."""
    if digits is None:
        return "[0-9]*[1-9][0-9]*"
    # i leading zeros, then a nonzero digit, then the rest of the budget
    return "(" + "|".join(f"{'0' * i}[1-9][0-9]{{0,{digits - 1 - i}}}" for i in range(digits)) + ")"


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
