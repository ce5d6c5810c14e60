"""Number and integer nodes as structspec's regex: their bounds exactly (narrowed past `CAP`), the digit
bounds where they have none. Records its rewrites in the walk; changes no schema."""

from __future__ import annotations

from typing import Any

from structspec.errors import SchemaError
from structspec.schema.bounds import (
    CAP,
    EXPONENT_DIGITS,
    decimal_range_regex,
    float_bound,
    float_places,
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
    for bound, (value, is_open) in ((low, (lo, lo_open)), (high, (hi, hi_open))):
        if value is not None and float_bound(value, is_open, bound is low) != (value, is_open):
            walk.rewrites.narrow(ptr, f"{bound.keyword} {node[bound.keyword]} narrowed to the float64 "
                                 f"{float_bound(value, is_open, bound is low)[0]} inside it, inclusive (numbers "
                                 "past 2**53 parse to floats a step of 2 or more apart)")
    (lo, lo_open), (hi, hi_open) = (float_bound(lo, lo_open, True) if lo is not None else (None, False),
                                    float_bound(hi, hi_open, False) if hi is not None else (None, False))
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
    fraction = _float_fraction(walk, ptr, node, (lo, lo_open, low), (hi, hi_open, high),
                               fraction=digits.fraction)
    try:
        regex = decimal_range_regex(lo, lo_open, hi, hi_open, fraction,
                                    None if digits.integer is None else EXPONENT_DIGITS)
    except ValueError as e:
        raise SchemaError((low or high).keyword, ptr, f"{e} (a float64 holds no other number there); "
                          "widen the bounds") from None
    walk.rewrites.narrow_digits(ptr, integer=False, fraction=True, exponent="[eE]" in regex)
    walk.rewrites.narrow(ptr, EXPONENTS)
    walk.rewrites.hole(node, regex)


def _float_fraction(walk: Walk, ptr: str, node: dict[str, Any], *ends: tuple, fraction: int | None) -> int | None:
    """The fraction digits a number between the bounds may have so that it parses (to a float64, as
    ``json.loads`` and Pydantic's float do) inside them: fewer beside an open bound, where more would round
    onto it (``exclusiveMaximum: 1000`` takes 999.999999999999 and not 999.9999999999999999). Narrowings
    recorded."""
    for value, is_open, bound in ends:
        if bound is None or not is_open or value == 0 or value != node[bound.keyword]:
            continue  # (no bound, a digit cap or a narrowed one: inside the schema's; an open 0: SMALLEST_EXPONENT)
        places = float_places(value)
        if fraction is None or places < fraction:
            fraction = places
            walk.rewrites.narrow(ptr, f"at most {places} fraction digits beside {bound.keyword} "
                                 f"{node[bound.keyword]} (more would parse to a float64 on the bound)")
    return fraction
