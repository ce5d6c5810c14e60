"""Parsed regex items (the `re._parser` form the automaton builds from) made by hand: literals, groups,
repeats and alternatives, shared by the translation and the regex difference. Pure: nothing here changes
state."""

from __future__ import annotations

import re._constants as C  # the parser's opcodes
from json.encoder import encode_basestring

Items = list  # parsed regex items: (opcode, argument) pairs

# One item per ASCII character, shared by every literal: a schema's names are thousands of characters, and
# fewer new objects leave the garbage collector less to scan once a compile ends.
ASCII = {chr(c): (C.LITERAL, c) for c in range(128)}


def json_string(text: str) -> str:
    """``text`` as a JSON string, quotes included, as ``json.dumps(text, ensure_ascii=False)`` writes it (its
    encoder's own function: `json.dumps` with an option builds an encoder per call, and names are many)."""
    return encode_basestring(text)


def literal(text: str) -> Items:
    """Items matching exactly ``text``."""
    return [ASCII[c] if c in ASCII else (C.LITERAL, ord(c)) for c in text]


def group(items: Items) -> tuple:
    """``items`` as one item: a non-capturing group, or the one item ``items`` holds (a group of one item is that
    item: it shares the item, which the automaton then measures once, and adds no layer to measure)."""
    if type(items) is list and len(items) == 1:  # (a `Stated` body stays in its group)
        return items[0]
    return C.SUBPATTERN, (None, 0, 0, items)


def repeat(low: int, high: int | None, items: Items) -> tuple:
    """``items`` repeated ``low`` to ``high`` times (None: no limit)."""
    return C.MAX_REPEAT, (low, C.MAXREPEAT if high is None else high, items)


def branch(alternatives: list[Items]) -> tuple:
    """One of ``alternatives``."""
    return C.BRANCH, (None, alternatives)
