"""Parsed regex → byte-level Thompson NFA, hash-consed so repeated groups share their states."""

from __future__ import annotations

import gc
import re._constants as C  # the parser's opcodes
from collections.abc import Iterator
from contextlib import contextmanager

from structspec.automaton.parse import REPEATS, parse
from structspec.automaton.utf8 import Ranges, byte_sequences, category, complement, normalize
from structspec.errors import RegexError


MAX_STATES = 1_000_000
"""The most NFA states a regex may build into (about 0.5 GB and 10 s of Python); past it, `RegexError`."""


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while building: a build allocates many small objects and frees
    none, so its collections find nothing, and over a large live heap they cost more than the build."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


class _Unsupported(Exception):
    pass


class ByteNFA:
    """Thompson NFA over bytes: byte-range edges and epsilon edges; one start, one accept state.

    Construction is hash-consed: an item (by structure) built from a state it was
    already built from returns the same end state. Both ends have the same set of
    strings leading to them, so merging them changes no language, and the O(k²)
    spelling of optional properties becomes an O(k) automaton: the alternatives
    ``(a,)?b``, ``(a,)?(b,)?c``, … share their common prefixes.

    Trimmed once built: edges into states from which no accepting path leads are
    removed, so every state a DFA reaches can still end in a match. Immutable once
    built (`closure` only memoizes).
    """

    def __init__(self, regex: str) -> None:
        """Parse and build ``regex``: `RegexError` if it is invalid, uses what a DFA cannot do, matches no
        string, or needs more than `MAX_STATES` states."""
        tree = parse(regex)
        self.edges: list[list[tuple[int, int, int]]] = []
        self.eps: list[list[int]] = []
        self._keys: dict[int, int] = {}  # id(items) → structural key (ints, so hashing stays cheap)
        self._interned: dict[tuple, int] = {}
        self._built: dict[tuple[object, int], int] = {}
        self.start = self._new()
        try:
            with gc_paused():
                self.accept = self._sequence(tree, self.start)
        except _Unsupported as e:
            raise RegexError(regex, str(e)) from None
        del self._keys, self._interned, self._built
        if not self._trim():
            raise RegexError(regex, "it matches no string (an empty class like [^\\s\\S], or a part that "
                             "can never be completed)")
        self._closures: dict[int, frozenset[int]] = {}

    def __len__(self) -> int:
        return len(self.edges)

    def _new(self) -> int:
        if len(self.edges) >= MAX_STATES:
            raise _Unsupported(f"it needs more than {MAX_STATES:,} automaton states; lower its repetition counts")
        self.edges.append([])
        self.eps.append([])
        return len(self.edges) - 1

    def _key(self, items: list) -> int:
        """A small int naming the structure of ``items``, a sequence of the parsed tree."""
        key = self._keys.get(id(items))  # the tree outlives the build, so ids are not reused
        if key is None:
            parts = tuple(self._item_key(op, arg) for op, arg in items)
            key = self._keys[id(items)] = self._interned.setdefault(parts, len(self._interned))
        return key

    def _item_key(self, op: C._NamedIntConstant, arg: object) -> tuple:
        if op is C.SUBPATTERN:
            return op, arg[1], arg[2], self._key(arg[3])
        if op is C.BRANCH:
            return op, tuple(map(self._key, arg[1]))
        if op in REPEATS:
            return op, arg[0], arg[1], self._key(arg[2])
        return op, (tuple(arg) if op is C.IN else arg)

    def _sequence(self, items: list, state: int) -> int:
        for op, arg in items:
            memo = (self._item_key(op, arg), state)
            end = self._built.get(memo)
            if end is None:
                end = self._built[memo] = self._item(op, arg, state)
            state = end
        return state

    def _item(self, op: C._NamedIntConstant, arg: object, state: int) -> int:
        if op in (C.LITERAL, C.NOT_LITERAL, C.ANY, C.IN):
            return self._chars(char_ranges(op, arg), state)
        if op is C.SUBPATTERN:
            if arg[1] or arg[2]:
                raise _Unsupported("inline flags such as (?i) are not supported")
            return self._sequence(arg[3], state)
        if op is C.BRANCH:  # alternatives start at `state` itself, so equal prefixes are shared
            end = self._new()
            for alternative in arg[1]:
                self.eps[self._sequence(alternative, state)].append(end)
            return end
        if op in REPEATS:
            low, high, body = arg
            copies = low if high is C.MAXREPEAT else high  # (a star adds one more, looping)
            for i in range(low):
                state = self._copy(body, state, i == 0, copies)
            if high is C.MAXREPEAT:  # star: loop through one state
                loop = self._new()
                self.eps[state].append(loop)
                self.eps[self._sequence(body, loop)].append(loop)
                return loop
            end = self._new()
            for i in range(high - low):
                self.eps[state].append(end)
                state = self._copy(body, state, low == 0 and i == 0, copies)
            self.eps[state].append(end)
            return end
        raise _Unsupported(f"{str(op).lower()} (anchors, lookarounds, backreferences) is not supported")

    def _copy(self, body: list, state: int, first: bool, copies: int) -> int:
        """One copy of a repeated ``body`` from ``state``; the first tells whether all ``copies`` fit."""
        before = len(self.edges)
        end = self._sequence(body, state)
        needed = before + (len(self.edges) - before) * copies
        if first and needed > MAX_STATES:
            raise _Unsupported(f"its repetitions need about {needed:,} automaton states, more than "
                               f"{MAX_STATES:,}; lower their counts")
        return end

    def _trim(self) -> bool:
        """Drop the edges into states that cannot reach the accept state; whether the start still can."""
        back: list[list[int]] = [[] for _ in self.edges]
        for s, (edges, eps) in enumerate(zip(self.edges, self.eps)):
            for _, _, to in edges:
                back[to].append(s)
            for to in eps:
                back[to].append(s)
        live, todo = {self.accept}, [self.accept]
        while todo:
            for s in back[todo.pop()]:
                if s not in live:
                    live.add(s)
                    todo.append(s)
        for s in range(len(self.edges)):
            self.edges[s] = [e for e in self.edges[s] if e[2] in live]
            self.eps[s] = [t for t in self.eps[s] if t in live]
        return self.start in live

    def _chars(self, ranges: Ranges, state: int) -> int:
        end = self._new()
        for sequence in byte_sequences(ranges):
            at = state
            for a, b in sequence[:-1]:
                at_next = self._new()
                self.edges[at].append((a, b, at_next))
                at = at_next
            self.edges[at].append((*sequence[-1], end))
        return end

    def closure(self, state: int) -> frozenset[int]:
        """NFA states reachable from ``state`` by epsilon edges that match a byte or accept.

        Does not change the NFA (memoized; concurrent callers compute the same set).
        """
        found = self._closures.get(state)
        if found is None:
            seen, todo = {state}, [state]
            while todo:
                for nxt in self.eps[todo.pop()]:
                    if nxt not in seen:
                        seen.add(nxt)
                        todo.append(nxt)
            found = self._closures[state] = frozenset(
                s for s in seen if self.edges[s] or s == self.accept
            )
        return found


def char_ranges(op: C._NamedIntConstant, arg: object) -> Ranges:
    """The code points one parsed character item matches."""
    if op is C.LITERAL:
        return normalize(((arg, arg),))  # (a lone surrogate: none, it has no UTF-8 encoding)
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
            raise _Unsupported(f"character class item {item_op} is not supported")
    return complement(tuple(ranges)) if negate else normalize(tuple(ranges))
