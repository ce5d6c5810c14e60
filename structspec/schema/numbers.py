"""Number and integer nodes as structspec's regex: their bounds exactly (narrowed past `CAP`), the digit
bounds where they have none. Records its rewrites in the walk; changes no schema."""

from __future__ import annotations

from typing import Any

from structspec.errors import SchemaError
from structspec.schema.bounds import (
    CAP,
    EXPONENT_DIGITS,
    decimal_range_regex,
    integer_limits,
    integer_range_regex,
    read_bounds,
)
from structspec.schema.walk import Walk

EXPONENTS = ("numbers between bounds are written in decimal, or with a negative exponent below 1 in magnitude as "
             "Python and Pydantic write small floats (1.5e-07), not with other exponents (1e2, 15e-1)")
"""The narrowing of every number node with bounds (its regex spells each decade it holds in part digit by digit;
an exponent would move the digits)."""


def check_number(walk: Walk, node: dict[str, Any], ptr: str, kind: str) -> None:
    """Emit a number node as structspec's regex: its bounds exactly, the digit bounds where it has none."""
    low, high = read_bounds(node)
    for bound in (low, high):
        if bound is not None and bound.value != node[bound.keyword]:
            walk.rewrites.narrow(ptr, f"{bound.keyword} {node[bound.keyword]} narrowed to {bound.value} "
                                 f"(a range wider than {CAP:.0e} costs automaton states for its digits)")
    digits = walk.rewrites.digits
    if kind == "integer":
        lo, hi = integer_limits(low, high)
        if lo is not None and hi is not None and lo > hi:
            raise SchemaError(low.keyword, ptr, "no integer lies within the bounds")
        if digits.integer is not None and (lo is None or hi is None):
            cap = 10**digits.integer - 1
            if low is None and high is None:
                walk.rewrites.hole(node, digits.integer_regex())
                walk.rewrites.narrow_digits(ptr, integer=True, fraction=False, exponent=False)
                return
            lo, hi = (-cap if lo is None else lo), (cap if hi is None else hi)
            if lo > hi:
                raise SchemaError((low or high).keyword, ptr, f"no integer of at most {digits.integer} digits "
                                  "lies within the bounds; raise max_integer_digits (None lifts it)")
            walk.rewrites.narrow_digits(ptr, integer=True, fraction=False, exponent=False)
        if lo is not None or hi is not None:
            walk.rewrites.hole(node, integer_range_regex(lo, hi))
        return
    if low is None and high is None:
        if digits.bounded:
            walk.rewrites.hole(node, digits.number_regex())
            walk.rewrites.narrow_digits(ptr, integer=True, fraction=True, exponent=True)
        return
    fractional = next((b for b in (low, high) if b is not None and b.value != int(b.value)), None)
    if fractional is not None:
        walk.unenforced(node, fractional.keyword, ptr, "bounds of a number must be integers")
        return
    lo, hi = (None if b is None else int(b.value) for b in (low, high))
    lo_open, hi_open = low is not None and low.open, high is not None and high.open
    if lo is not None and hi is not None and (lo > hi or (lo == hi and (lo_open or hi_open))):
        raise SchemaError(low.keyword, ptr, "no number lies within the bounds")
    if digits.integer is not None and (lo is None or hi is None):
        cap = 10**digits.integer  # fewer integer digits: strictly between -cap and cap
        (lo, lo_open), (hi, hi_open) = ((-cap, True) if lo is None else (lo, lo_open),
                                        (cap, True) if hi is None else (hi, hi_open))
        if lo >= hi:
            raise SchemaError((low or high).keyword, ptr, f"no number of at most {digits.integer} integer "
                              "digits lies within the bounds; raise max_integer_digits (None lifts it)")
        walk.rewrites.narrow_digits(ptr, integer=True, fraction=False, exponent=False)
    regex = decimal_range_regex(lo, lo_open, hi, hi_open, digits.fraction,
                                None if digits.integer is None else EXPONENT_DIGITS)
    walk.rewrites.narrow_digits(ptr, integer=False, fraction=True, exponent="[eE]" in regex)
    walk.rewrites.narrow(ptr, EXPONENTS)
    walk.rewrites.hole(node, regex)
