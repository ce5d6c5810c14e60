"""The code points a parsed character item matches, and those some string of a regex may hold."""

from __future__ import annotations

import re._constants as C  # the parser's opcodes

from structspec.automaton.parse import REPEATS, group_body, parse
from structspec.automaton.utf8 import Ranges, category, complement, normalize
from structspec.errors import RegexError
from structspec.vocab import SYMBOLS


class Unsupported(Exception):
    """A regex item the automaton cannot build (raised while building; the builder turns it into `RegexError`)."""


def char_ranges(op: C._NamedIntConstant, arg: object) -> Ranges:
    """The code points one parsed character item matches."""
    if op is C.LITERAL:  # (a lone surrogate: none, it has no UTF-8 encoding; a symbol's: that symbol)
        return ((arg, arg),) if SYMBOLS[0] <= arg <= SYMBOLS[1] else normalize(((arg, arg),))
    if op is C.NOT_LITERAL:
        return complement(((arg, arg),))
    if op is C.ANY:  # like Rust's regex (and Python's), '.' is any character but \n
        return complement(((10, 10),))
    ranges, negate = [], False
    for item_op, item in arg:
        if item_op is C.NEGATE:
            negate = True
        elif item_op is C.LITERAL:
            ranges.append((item, item))
        elif item_op is C.RANGE:
            ranges.append(item)
        elif item_op is C.CATEGORY:
            ranges += category(item)
        else:
            raise Unsupported(f"character class item {item_op} is not supported")
    return complement(tuple(ranges)) if negate else normalize(tuple(ranges))


def characters(regex: str) -> Ranges:
    """The code points that some string of ``regex`` may hold (each character item's, over the whole regex; a
    part that matches no string still counts); `RegexError` if it is invalid."""
    found: list[tuple[int, int]] = []

    def walk(items: list) -> None:
        for op, arg in items:
            if op in (C.LITERAL, C.NOT_LITERAL, C.ANY, C.IN):
                try:
                    found.extend(char_ranges(op, arg))
                except Unsupported as e:
                    raise RegexError(regex, str(e)) from None
            elif op is C.SUBPATTERN:
                walk(group_body(arg[3]))
            elif op is C.BRANCH:
                for alternative in arg[1]:
                    walk(alternative)
            elif op in REPEATS:
                walk(arg[2])

    walk(parse(regex))
    return normalize(tuple(found))
