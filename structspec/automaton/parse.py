"""Regex text → `re._parser` items, each distinct large group parsed once.

Python's own parser does the reading (so the dialect is Python's); this module
adds the cut-outs that keep translated JSON Schemas cheap to parse, and turns
parser errors into `RegexError`s whose positions refer to the whole regex.
"""

from __future__ import annotations

import re
import re._constants as C  # the parser's opcodes
import re._parser as parser

from structspec.errors import RegexError

REPEATS = (C.MAX_REPEAT, C.MIN_REPEAT, C.POSSESSIVE_REPEAT)

# Escapes, whole character classes, and parentheses: what a scan for groups must tell apart.
_GROUP_SCAN = re.compile(r"\\.|\[\^?\]?(?:\\.|[^\]\\])*\]|[()]", re.DOTALL)
_HOLE = 0xF0000  # private-use code points stand in for groups cut out of a regex
_HOLE_MIN = 48  # groups shorter than this are parsed in place


def parse(regex: str) -> list:
    """The parsed items of ``regex``; `RegexError` if it is invalid or sets inline flags."""
    try:
        items = _parse_shared(regex, {})
    except re.error:
        try:  # the whole regex again, so that the position refers to it
            parser.parse(regex)
        except re.error as e:
            raise RegexError(regex, f"{e.msg} at position {e.pos}") from None
        raise
    if re.match(r"\(\?[aiLmsux]+\)", regex):
        raise RegexError(regex, "inline flags such as (?i) are not supported")
    return items


def _parse_shared(regex: str, cache: dict[str, list]) -> list:
    """Parse ``regex``, parsing each distinct large group's text once.

    Translated JSON Schemas repeat subschemas verbatim (outlines-core spells k optional
    properties in O(k²) text), and Python's parser costs microseconds per character.
    Large groups are cut out, replaced by one placeholder character each, and parsed
    separately through ``cache``; identical groups then share one subtree.
    """
    found = cache.get(regex)
    if found is not None:
        return found
    pieces, holes, depth, start, last = [], [], 0, 0, 0
    if not any(_HOLE <= ord(c) < _HOLE + 0x10000 for c in set(regex)):
        for m in _GROUP_SCAN.finditer(regex):
            if m.group() == "(":
                start, depth = (m.start() if depth == 0 else start), depth + 1
            elif m.group() == ")" and depth:
                depth -= 1
                body = start + 3 if regex.startswith("(?:", start) else start + 1
                if depth or m.end() - start < _HOLE_MIN or regex[body] == "?" or len(holes) == 0x10000:
                    continue  # nested, small, or another kind of (?...) group: parsed in place
                pieces += [regex[last:start], chr(_HOLE + len(holes))]
                holes.append(regex[body : m.end() - 1])
                last = m.end()
    tree = list(parser.parse("".join(pieces) + regex[last:]))
    found = cache[regex] = _fill(tree, [_parse_shared(h, cache) for h in holes]) if holes else tree
    return found


def _fill(items: list, subtrees: list[list]) -> list:
    """``items`` with each placeholder literal replaced by its group's subtree."""
    def hole(op: C._NamedIntConstant, arg: object) -> bool:
        return op is C.LITERAL and _HOLE <= arg < _HOLE + len(subtrees)

    out = []
    for op, arg in items:
        if hole(op, arg):
            op, arg = C.SUBPATTERN, (None, 0, 0, subtrees[arg - _HOLE])
        elif op is C.IN and any(hole(*item) for item in arg):  # the parser turned `(…)|(…)` into a set
            others = [item for item in arg if not hole(*item)]
            alternatives = [subtrees[a - _HOLE] for o, a in arg if hole(o, a)] + ([[(C.IN, others)]] if others else [])
            op, arg = C.BRANCH, (None, alternatives)
        elif op is C.SUBPATTERN:
            arg = (*arg[:3], _fill(arg[3], subtrees))
        elif op is C.BRANCH:
            arg = (arg[0], [_fill(alt, subtrees) for alt in arg[1]])
        elif op in REPEATS:
            arg = (arg[0], arg[1], _fill(arg[2], subtrees))
        out.append((op, arg))
    return out
