"""A regular language less a finite set of texts, on parsed regex items: what ``not`` over a string or integer
node, and an overlapping ``oneOf``, subtract.

The regex layer has no complement, but L less a finite set F is still a regex. Walk a trie of F beside
Antimirov's linear forms of L (each way L can go on, paired with the characters that lead there): where a
character leaves the trie, L goes on unchanged; along the trie, L goes on only through the trie's children,
and may end only where the trie's prefix is not itself in F. Each trie node writes one alternative per way
on, so the result grows with F's total length times L's ways on from a point, not with L's size times F's.
"""

from __future__ import annotations

import re._constants as C  # the parser's opcodes
from collections.abc import Iterable
from functools import lru_cache, partial

from structspec.automaton.chars import char_ranges
from structspec.automaton.parse import REPEATS, Stated, group_body, parse, write
from structspec.automaton.utf8 import Ranges, complement
from structspec.schema.items import Items, branch, group, json_string, literal

_CHARS = (C.LITERAL, C.NOT_LITERAL, C.ANY, C.IN)


class _Trie(dict):
    """Texts by their characters: a child per next character; ``end`` marks a whole text."""

    end = False


# A property name's characters (those a JSON string holds unescaped, outlines-core's set) and escapes (all
# but \/ and \uXXXX: `json.dumps` writes neither for them), then the closing quote.
_NAME_REST = parse(r'([^"\\\x00-\x1F\x7F-\x9F]|\\["\\bfnrt])*"')
_ESCAPES = '"\\bfnrt'
_UNESCAPED = complement(((0x22, 0x22), (0x5C, 0x5C), (0x00, 0x1F), (0x7F, 0x9F)))


def names_except(names: Iterable[str]) -> Items:
    """A JSON property name, quotes included, other than ``names``: each name spelled one way, as `json_string`
    spells it (so a listed name cannot come back spelled otherwise). Linear in the names' total length: a
    trie of their spellings, each node closing the name or leaving the trie by any other character. One group
    whose facts are stated (`Stated`): its items are made only once a walk enters it."""
    spelt = frozenset(body for body in (json_string(name)[1:-1] for name in names)
                      if "\\u" not in body)  # a control character json.dumps writes as \uXXXX: no name is spelled so
    nodes = 1 + sum(map(len, spelt))  # (at most: prefixes the spellings share are one node)
    return [group(Stated(partial(_name_except, spelt), ("names except", spelt), _NODE_SIZE * nodes, False))]


def _name_except(spellings: frozenset[str]) -> Items:
    """`names_except`'s items: the opening quote, then a rest other than ``spellings``."""
    return [*_QUOTE, *_rest_except(spellings)]


@lru_cache(maxsize=65536)
def _rest_except(rests: frozenset[str]) -> Items:
    """The rest of a name after a trie node (its closing quote included) other than ``rests`` (the spellings'
    rests from that node). Memoized, and shared: names with a common end (a schema's "description" in every
    object) share that end's items, which the automaton measures once."""
    after: dict[str, list[str]] = {}  # each unit a rest starts with (an escape is one) → the rests after it
    for rest in sorted(rests):
        if rest:
            unit = rest[:2] if rest[0] == "\\" else rest[0]
            after.setdefault(unit, []).append(rest[len(unit):])
    alternatives: list[Items] = [] if "" in rests else [_QUOTE]
    for unit, tails in after.items():
        alternatives.append([*literal(unit), *_rest_except(frozenset(tails))])
    return [branch([*alternatives, *_leaving(frozenset(after))])]


_QUOTE = [(C.LITERAL, ord('"'))]
_NODE_SIZE = 8  # about the states a trie node measures (its ways out share the rest of a name after them)


@lru_cache(maxsize=4096)
def _leaving(units: frozenset[str]) -> tuple[Items, ...]:
    """The ways a name leaves a trie node whose children start with ``units``: another character or escape,
    then any rest. Memoized, and shared: the automaton measures an item list once, however often it appears."""
    out = []
    others = complement((*complement(_UNESCAPED), *((ord(u), ord(u)) for u in units if len(u) == 1)))
    if others:
        out.append([_class(others), *_NAME_REST])
    escapes = [e for e in _ESCAPES if "\\" + e not in units]
    if escapes:
        out.append([(C.LITERAL, ord("\\")), _class(tuple((ord(e), ord(e)) for e in escapes)), *_NAME_REST])
    return tuple(out)


def difference(items: Items, texts: Iterable[str]) -> Items | None:
    """Items matching what ``items`` matches except ``texts``; None if nothing is left. ``ValueError`` for
    items a DFA cannot read either (anchors, lookarounds). Builds new items around shared parts of ``items``;
    changes neither."""
    trie = _Trie()
    for text in texts:
        node = trie
        for c in text:
            node = node.setdefault(c, _Trie())
        node.end = True
    alternatives = _less([items], trie)
    return [branch(alternatives)] if alternatives else None


def _less(ways: list[Items], trie: _Trie) -> list[Items]:
    """The alternatives of what any of ``ways`` matches, less the texts of ``trie`` (ways and texts both
    read from the same point)."""
    out: list[Items] = [[]] if any(map(_nullable, ways)) and not trie.end else []
    steps = {write(rest): (chars, rest) for way in ways for chars, rest in _linear(way)}.values()  # (deduped)
    for c, child in trie.items():
        after = [rest for chars, rest in steps if _contains(chars, ord(c))]
        if after and (tails := _less(after, child)):
            out.append([(C.LITERAL, ord(c)), *(tails[0] if len(tails) == 1 else [branch(tails)])])
    for chars, rest in steps:  # characters that leave the trie: the way goes on as it was
        others = complement((*complement(chars), *((ord(c), ord(c)) for c in trie)))
        if others:
            out.append([_class(others), *rest])
    return out


def _linear(way: Items) -> list[tuple[Ranges, Items]]:
    """Antimirov's linear form of ``way``: (characters, rest) pairs, ``way`` matching exactly the strings
    c + s with c of a pair's characters and s matched by its rest."""
    out = []
    for i, (op, arg) in enumerate(way):
        out += [(chars, [*rest, *way[i + 1 :]]) for chars, rest in _first(op, arg)]
        if not _nullable([(op, arg)]):
            break
    return out


def _first(op: C._NamedIntConstant, arg: object) -> list[tuple[Ranges, Items]]:
    """The linear form of one item."""
    if op in _CHARS:
        return [(char_ranges(op, arg), [])]
    if op is C.SUBPATTERN:
        return _linear(group_body(arg[3]))
    if op is C.BRANCH:
        return [pair for alternative in arg[1] for pair in _linear(alternative)]
    if op in REPEATS:
        low, high, body = arg
        if high == 0:
            return []
        low = 0 if _nullable(body) else max(low - 1, 0)  # a nullable body may stand in for its copies
        left = high if high is C.MAXREPEAT else high - 1
        again = [(C.MAX_REPEAT, (low, left, body))] if left else []
        return [(chars, [*rest, *again]) for chars, rest in _linear(body)]
    raise ValueError(f"{str(op).lower()} (anchors, lookarounds, backreferences) is not supported")


def _nullable(way: Items) -> bool:
    """Whether ``way`` matches the empty string."""
    for op, arg in way:
        if op in _CHARS:
            return False
        if op is C.SUBPATTERN and not _nullable(group_body(arg[3])):
            return False
        if op is C.BRANCH and not any(map(_nullable, arg[1])):
            return False
        if op in REPEATS and arg[0] and not _nullable(arg[2]):
            return False
        if op not in (C.SUBPATTERN, C.BRANCH, *REPEATS):
            raise ValueError(f"{str(op).lower()} (anchors, lookarounds, backreferences) is not supported")
    return True


def _contains(chars: Ranges, code: int) -> bool:
    return any(lo <= code <= hi for lo, hi in chars)


def _class(chars: Ranges) -> tuple:
    """One item matching ``chars``."""
    return C.IN, [(C.LITERAL, lo) if lo == hi else (C.RANGE, (lo, hi)) for lo, hi in chars]
