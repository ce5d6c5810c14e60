"""Numeric bounds as regexes over decimal digits (outlines-core ignores ``minimum`` and its kin), and the
default digit bounds that make every JSON number end."""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

MAX_INTEGER_DIGITS = 18
"""Default bound on the integer digits of a number the schema leaves unbounded (``max_integer_digits``)."""

MAX_FRACTION_DIGITS = 15
"""Default bound on the fraction digits of a number (``max_fraction_digits``)."""

EXPONENT_DIGITS = 3
"""Exponent digits of an unbounded number while integer digits are bounded (a float64's exponent has 3)."""

LARGEST_EXPONENT = 308
"""Every number below ``10**LARGEST_EXPONENT`` in magnitude is a finite float64 (the largest is about 1.8e308)."""

SMALLEST_EXPONENT = 323
"""Every number of at least ``10**-SMALLEST_EXPONENT`` in magnitude parses to a nonzero float64 (the smallest
is 5e-324; ``json.loads("1e-400")`` is 0.0, outside ``exclusiveMinimum: 0``)."""

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
        without them, but for the exponent's sign, which JSON leaves optional (``1e5``). While the integer
        digits are bounded, every number is below 1e308, so that it parses to a finite float
        (``json.loads("1e400")`` is ``inf``, which no float field without infinities takes): a positive exponent
        is at most 308 less the integer digits, or up to 307 after one integer digit (``1.5e+300``, as Python writes
        one)."""
        if self.integer is None:
            return rf"{self.integer_regex()}{fraction_regex(self.fraction)}([eE][+-]?[0-9]+)?"
        large = LARGEST_EXPONENT - self.integer  # (an integer of that many digits: below 10**(digits + exponent))
        negative = f"-[0-9]{_times(1, EXPONENT_DIGITS)}"  # (a tiny number parses to 0: never out of range)
        exponent = rf"[eE](\+?({exponent_regex(0, large, EXPONENT_DIGITS)})|{negative})"
        larger = exponent_regex(large + 1, LARGEST_EXPONENT - 1, EXPONENT_DIGITS)
        integer, fraction = rf"(0|[1-9][0-9]{_times(0, self.integer - 1)})", fraction_regex(self.fraction)
        return rf"-?({integer}{fraction}({exponent})?|[1-9]{fraction}[eE]\+?({larger}))"

    def describe(self, kind: str) -> str:
        """What the bounds narrow a ``kind`` ("integer" or "number") to, in words."""
        parts = [] if self.integer is None else [f"{self.integer} integer digits (max_integer_digits)"]
        if kind == "number" and self.fraction is not None:
            parts.append(f"{self.fraction} fraction digits (max_fraction_digits)")
        if kind == "number" and self.integer is not None:
            parts.append(f"{EXPONENT_DIGITS} exponent digits")
        return f"{kind} of at most " + ", ".join(parts)


def fraction_regex(digits: int | None) -> str:
    """Regex of an optional fraction of at most ``digits`` digits (None: any number; 0: none)."""
    return "" if digits == 0 else rf"(\.[0-9]{_times(1, digits)})?"


def exponent_regex(low: int, high: int, width: int | None) -> str:
    """Regex of the digit strings of at most ``width`` digits (None: any number), leading zeros allowed, whose
    value lies from ``low`` to ``high``."""
    if width is None:
        return f"0*({_naturals(low, high)})"
    parts = []
    for n in range(len(str(low)), width + 1):
        top = min(high, 10**n - 1)
        if top >= low:
            parts.append(_same_length(str(low).zfill(n), str(top).zfill(n)))
    return "|".join(f"({p})" for p in parts)


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
    number, 0: none); ``*_open`` excludes the bound itself. Decimals, and the numbers below 1 in magnitude
    written as Python and Pydantic write small floats (``1.5e-07``: one nonzero integer digit, a negative
    exponent of at most ``exponent`` digits, None: any, and at most `SMALLEST_EXPONENT`, so none parses to 0)
    where the range holds all of them on their side of 0; no other exponent (a decade the range holds only in
    part would take a regex of its digits). `ValueError` if it holds no number."""
    # the small ones just below an open 1 (or above an open -1) keep one digit fewer (0.99..9 rounds up)
    near_one = (hi == 1 and hi_open) or (lo == -1 and lo_open)
    mantissa = fraction_regex(max(fraction - 1, 0) if near_one and fraction is not None else fraction)
    # 0 < x < 1; at the next exponent, 3e-324 parses to 5e-324 (the smallest float64) and 2e-324 to 0
    small = (rf"[1-9]{mantissa}[eE]-({exponent_regex(1, SMALLEST_EXPONENT, exponent)})"
             rf"|[3-9]{mantissa}[eE]-{'0*' if exponent is None else ''}{SMALLEST_EXPONENT + 1}")
    parts = []
    if hi is None or hi > 0 or (hi == 0 and not hi_open):
        low = (lo, lo_open) if lo is not None and lo >= 0 else (0, False)
        parts.append(_nonnegative_decimals(*low, hi, hi_open, fraction))
    if lo is None or lo < 0:  # x = -y, y > 0 (or y >= -hi when hi < 0)
        low, low_open = (-hi, hi_open) if hi is not None and hi < 0 else (0, True)
        parts.append("-(" + _nonnegative_decimals(low, low_open, None if lo is None else -lo, lo_open, fraction) + ")")
    if (lo is None or lo < 0 or (lo == 0 and not lo_open)) and (hi is None or hi > 0 or (hi == 0 and not hi_open)):
        parts.append(f"-0{_zeros(fraction)}")  # -0.0, as Python and Pydantic write negative zero
    if (lo is None or lo <= 0) and (hi is None or hi >= 1):
        parts.append(small)
    if (hi is None or hi >= 0) and (lo is None or lo <= -1):
        parts.append(f"-({small})")
    if "" in parts or "-()" in parts:
        raise ValueError("no number of at most that many fraction digits lies within the bounds")
    return "|".join(f"({p})" for p in parts)


def float_places(bound: int) -> int:
    """The most fraction digits a number beside the open ``bound`` may have and still parse (to a float64) to a
    number other than the bound: a number 10**-places from it is at least one float64 step away."""
    step, places = Fraction(math.ulp(float(bound))), 0
    while Fraction(1, 10 ** (places + 1)) >= step:
        places += 1
    return places


def float_bound(value: int, is_open: bool, lower: bool) -> tuple[int, bool]:
    """The bound a number past 2**53 in magnitude is kept to, so that it lies within ``value`` both as written
    (``json.loads`` reads it exactly) and as float64s (Pydantic's float reads the number and the bound so):
    the float64 just inside, inclusive. ``value`` itself where float64 holds every integer."""
    if abs(value) <= 2**53:
        return value, is_open
    inside = float(value)
    if is_open or (inside < value if lower else inside > value):
        inside = math.nextafter(inside, math.inf if lower else -math.inf)
    return int(inside), False


def _zeros(fraction: int | None) -> str:
    """Regex of an optional fraction of zeros (``.0``, ``.00``, ...)."""
    return "" if fraction == 0 else rf"(\.0{_times(1, fraction)})?"


def _nonnegative_decimals(lo: int, lo_open: bool, hi: int | None, hi_open: bool, fraction: int | None) -> str:
    if hi == lo:
        return f"{lo}{_zeros(fraction)}"
    parts = []
    if not lo_open:
        parts.append(f"{lo}{fraction_regex(fraction)}")
    elif fraction != 0:  # (an open 0: the first nonzero digit early enough that the number is no float 0)
        parts.append(f"{lo}\\.{_positive_fraction(fraction, SMALLEST_EXPONENT if lo == 0 else None)}")
    if hi is None or hi - 1 >= lo + 1:
        parts.append(f"({_naturals(lo + 1, None if hi is None else hi - 1)}){fraction_regex(fraction)}")
    if hi is not None and not hi_open:
        parts.append(f"{hi}{_zeros(fraction)}")
    return "|".join(parts)


def _positive_fraction(digits: int | None, first: int | None = None) -> str:
    """Regex of the fraction digits (after the point) that are not all zeros, at most ``digits`` of them (None:
    any number), the first nonzero among the first ``first`` (None: anywhere)."""
    if digits is None:
        return "[0-9]*[1-9][0-9]*" if first is None else f"0{{0,{first - 1}}}[1-9][0-9]*"
    # i leading zeros, then a nonzero digit, then the rest of the budget
    leading = digits if first is None else min(digits, first)
    return "(" + "|".join(f"{'0' * i}[1-9][0-9]{{0,{digits - 1 - i}}}" for i in range(leading)) + ")"


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
