"""Anchors in a parsed regex → the same language without them, read in a context.

A context says whether the text before the regex's match is empty (``start``) and whether the text after it is
(``end``). A full match (a `Regex`, a schema pattern matched whole) is the context (True, True); a search (a JSON
Schema pattern) is the union of the four, each padded with text on its open sides. ``^`` and ``\\A`` hold where
nothing was read before; ``$`` and ``\\Z`` where nothing follows (the end of the text, as ECMA-262 and Rust's
regex, outlines-core's dialect, read ``$``; Python's ``$`` also holds before a final newline).

Both assertions hold in a wider context whenever they hold in a narrower one, so a part's language in a narrower
context is sound in a wider one: a sequence is read one item at a time, each term taking the narrowest context
its neighbours allow, plus the terms where a neighbour matched the empty string.
"""

from __future__ import annotations

import re._constants as C  # the parser's opcodes
from typing import Any

REPEATS = (C.MAX_REPEAT, C.MIN_REPEAT, C.POSSESSIVE_REPEAT)
_BEGIN = (C.AT_BEGINNING, C.AT_BEGINNING_STRING)
_END = (C.AT_END, C.AT_END_STRING)
_CONTEXTS = ((True, True), (True, False), (False, True), (False, False))

MAX_ANCHORED_COPIES = 64
"""A repetition whose body holds an anchor is read copy by copy: at most this many copies."""

NOTHING = [(C.IN, [(C.NEGATE, None), (C.CATEGORY, C.CATEGORY_SPACE), (C.CATEGORY, C.CATEGORY_NOT_SPACE)])]
"""Items that match no string (``[^\\s\\S]``)."""

Variant = tuple[list | None, bool]  # the items of a language without anchors (None: no string), and whether "" is in it


def has_anchors(items: Any) -> bool:
    """Whether ``items`` (parsed) hold ``^``, ``$``, ``\\A`` or ``\\Z`` anywhere. Does not change them."""
    for op, arg in items:
        if (op is C.AT and arg in (*_BEGIN, *_END)) or (op is C.SUBPATTERN and has_anchors(arg[3])) or (
                op is C.BRANCH and any(has_anchors(a) for a in arg[1])) or (op in REPEATS and has_anchors(arg[2])):
            return True
    return False


def in_context(items: Any, start: bool, end: bool) -> list | None:
    """Items without anchors of the strings ``items`` match where the text before the match is empty iff
    ``start`` and the text after it iff ``end``; None if no string does. Shares ``items``' parts; changes none.
    `ValueError` for a repetition of more than `MAX_ANCHORED_COPIES` copies whose body holds an anchor."""
    return _sequence(items)[(start, end)][0]


def full_match(items: Any) -> list:
    """``items`` without anchors, matched whole (`NOTHING` if no string matches)."""
    found = in_context(items, True, True)
    return NOTHING if found is None else found


def _nullable(items: Any) -> bool:
    """Whether anchor-free ``items`` match the empty string."""
    for op, arg in items:
        if op is C.SUBPATTERN:
            if not _nullable(arg[3]):
                return False
        elif op is C.BRANCH:
            if not any(_nullable(a) for a in arg[1]):
                return False
        elif op in REPEATS:
            if arg[0] > 0 and not _nullable(arg[2]):
                return False
        elif op is not C.AT:
            return False
    return True


def _group(items: list) -> tuple:
    return C.SUBPATTERN, (None, 0, 0, items)


def _union(parts: list[list | None]) -> list | None:
    """One of ``parts`` (None ones left out, each list once)."""
    kept = list({id(p): p for p in parts if p is not None}.values())
    return None if not kept else kept[0] if len(kept) == 1 else [(C.BRANCH, (None, kept))]


def _sequence(items: Any) -> dict[tuple[bool, bool], Variant]:
    if not has_anchors(items):
        plain = (list(items), _nullable(items))
        return dict.fromkeys(_CONTEXTS, plain)
    done: dict[tuple[bool, bool], Variant] = dict.fromkeys(_CONTEXTS, ([], True))
    for item in items:
        done = _then(done, _item(*item))
    return done


def _then(first: dict[tuple[bool, bool], Variant], then: dict[tuple[bool, bool], Variant]) -> dict:
    """The variants of ``first`` followed by ``then``."""
    out = {}
    for start, end in _CONTEXTS:
        head, head_empty = first[start, False]  # text follows the head: then matched some
        tail = then[False, end][0]  # text precedes the tail: the head matched some
        parts = [None if head is None or tail is None else [*head, _group(tail)]]
        if head_empty:  # the head matched "": the tail reads the whole context
            parts.append(then[start, end][0])
        if then[False, end][1]:  # the tail matched "": the head reads the whole context
            parts.append(first[start, end][0])
        empty = first[start, end][1] and then[start, end][1]
        out[start, end] = (_union(parts + ([[]] if empty else [])), empty)
    return out


def _item(op: Any, arg: Any) -> dict[tuple[bool, bool], Variant]:
    if op is C.AT and arg in _BEGIN:
        return {(s, e): ([], True) if s else (None, False) for s, e in _CONTEXTS}
    if op is C.AT and arg in _END:
        return {(s, e): ([], True) if e else (None, False) for s, e in _CONTEXTS}
    if op is C.SUBPATTERN and has_anchors(arg[3]) and not (arg[1] or arg[2]):
        return _sequence(arg[3])
    if op is C.BRANCH and has_anchors([(op, arg)]):
        alternatives = [_sequence(a) for a in arg[1]]
        return {c: (_union([a[c][0] for a in alternatives]), any(a[c][1] for a in alternatives)) for c in _CONTEXTS}
    if op in REPEATS and has_anchors(arg[2]):
        return _repeat(*arg)
    plain = ([(op, arg)], _nullable([(op, arg)]))
    return dict.fromkeys(_CONTEXTS, plain)


def _repeat(low: int, high: Any, body: Any) -> dict[tuple[bool, bool], Variant]:
    """``body`` (which holds an anchor) ``low`` to ``high`` times: copy after copy."""
    copies = low + (1 if high is C.MAXREPEAT else high - low)
    if copies > MAX_ANCHORED_COPIES:
        raise ValueError(f"it repeats a part holding an anchor (^ or $) {copies} times, more than "
                         f"{MAX_ANCHORED_COPIES}; move the anchor out of the repetition")
    one = _sequence(body)
    if high is C.MAXREPEAT:  # "", one copy, or a first, middle ones (neither end) and a last
        middle = one[False, False][0]
        more = {}
        for start, end in _CONTEXTS:
            first, last = one[start, False][0], one[False, end][0]
            many = None if first is None or last is None else [
                *first, *([(C.MAX_REPEAT, (0, C.MAXREPEAT, middle))] if middle is not None else []), _group(last)]
            more[start, end] = (_union([[], one[start, end][0], many]), True)
    else:
        more = {c: (_union([[], one[c][0]]), True) for c in _CONTEXTS}  # an optional copy
    done: dict[tuple[bool, bool], Variant] = dict.fromkeys(_CONTEXTS, ([], True))
    for _ in range(low):
        done = _then(done, one)
    for _ in range(copies - low):
        done = _then(done, more)
    return done
