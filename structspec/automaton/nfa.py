"""Parsed regex → byte-level Thompson NFA, hash-consed so repeated groups share their states; large groups are
built once, when a walk first reaches them, and entered by calls."""

from __future__ import annotations

import copyreg
import gc
import re._constants as C  # the parser's opcodes
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from structspec.automaton.chars import Unsupported, char_ranges
from structspec.automaton.parse import REPEATS, TOO_DEEP, ParsedRegex, Stated, group_body, parse, unsupported
from structspec.automaton.utf8 import Ranges, byte_automaton, byte_sequences
from structspec.errors import RegexError
from structspec.vocab import SYMBOLS


MAX_STATES = 1_000_000
"""The most NFA states a regex may build into (about 0.5 GB and 10 s of Python); past it, `RegexError`."""

FRAGMENT_MIN = 64
"""An item of about this many states or more is a fragment: built once, when first entered, and called from
every place that needs it (a schema's ``$ref`` target used in a hundred places costs its states once). Not
lower: each call is a frame on the positions' stacks, and a DFA state over deeply nested calls holds more
positions (16 made Kubernetes kb_494's instance walks 2.6x slower than 64)."""

_CALL = 2  # the states a call to a fragment takes where it is made (its site and the state it returns to)

COUNTER_MIN = 256
"""A counted repetition whose copies would take at least this many states is built as a counter: its body once,
as a fragment, entered again with the count on the stack (a ``maxLength`` of 5,000 costs one body, not 5,000)."""


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


class _Facts(NamedTuple):
    """What `ByteNFA` needs to know of a parsed sequence before building it."""

    key: int  # names its structure: equal keys, equal sequences
    size: int  # about how many states building it here takes (a character: one, as if ASCII; most fragments: a call)
    empty: bool  # matches no string (a class matching no character, on every path)
    nullable: bool  # matches the empty string
    keys: tuple[tuple, ...]  # each item's structural key, in order (a literal's: the item itself)


_LITERAL = C.LITERAL


def _constant(name: str) -> C._NamedIntConstant:
    return getattr(C, name)


# The parser's opcodes are compared by identity (`op is C.BRANCH`): an automaton read back from the disk cache
# must hold the same objects, not equal ints, so they pickle by name.
copyreg.pickle(C._NamedIntConstant, lambda constant: (_constant, (constant.name,)))


class ByteNFA:
    """Thompson NFA over bytes: byte-range edges, epsilon edges and calls; one start, one accept state.

    Construction is hash-consed: an item (by structure) built from a state it was
    already built from returns the same end state. Both ends have the same set of
    strings leading to them, so merging them changes no language, and the O(k²)
    spelling of optional properties becomes an O(k) automaton: the alternatives
    ``(a,)?b``, ``(a,)?(b,)?c``, … share their common prefixes.

    An item of `FRAGMENT_MIN` states or more is a *fragment*, built once, from a
    fresh state, and only when a walk first enters it: every place that needs it
    calls it (a call-site state enters the fragment's start and, at the
    fragment's end, returns to a state of its own). So a subschema used in many
    places costs its states once, not once per place, and a schema's branches
    that a generation never reaches cost nothing: compiling builds the outermost
    level only. A large counted repetition ``x{m,n}`` (`COUNTER_MIN`) is a call
    that may repeat: its frame counts the passes through ``x``'s fragment, and at
    the fragment's end the call returns once the count is at least m and enters
    the fragment again while it is below n. Calls nest but never recurse (a
    parsed regex is a tree) and counts are bounded, so the stacks of frames are
    bounded; the automaton's *positions* are (state, stack) pairs, numbered as
    they are reached (`closure`, `moves`). `start` and `accept` are positions.

    Parts that match no string (a class matching no character) are never built,
    so every position a DFA reaches can still end in a match. The language never
    changes; `closure` and `moves` memoize and build fragments on first entry.
    """

    def __init__(self, regex: str | ParsedRegex) -> None:
        """Parse ``regex`` and build its outermost level: `RegexError` if it is invalid, uses what a DFA cannot
        do, matches no string, or repeats a part that matches the empty string into more than `MAX_STATES`
        states. Reads the whole parsed regex once (to know these before any build)."""
        tree = parse(regex)
        self.edges: list[list[tuple[int, int, int]]] = []
        self.eps: list[list[int]] = []
        # call-site state → (fragment, return state, least and most passes; None: unbounded)
        self.calls: dict[int, tuple[Hashable, int, int, int | None]] = {}
        self._name = regex if isinstance(regex, str) else repr(regex)  # (for errors; a schema's text can be huge)
        # id(items) → facts. Ids are not reused: the tree is kept, and so is every `Stated` body made later (its
        # group is in the tree).
        self._tree = tree
        self._facts: dict[int, _Facts] = {}
        self._item_facts: dict[int, tuple[tuple, int, bool, bool]] = {}  # id(item) → `_measure_item`, likewise
        self._interned: dict[tuple, int] = {}
        self._built: dict[tuple[object, int], int] = {}
        self._spans: dict[Hashable, tuple[int, int]] = {}  # fragment → (start, end), once built
        self._recipes: dict[Hashable, tuple[Any, Any]] = {}  # fragment → the item (op, arg) it builds
        with gc_paused():
            try:
                if self._measure(tree).empty:
                    raise Unsupported("it matches no string (an empty class like [^\\s\\S], or a part that "
                                       "can never be completed)")
                start = self._new()
                end = self._sequence(tree, start)
            except Unsupported as e:
                raise RegexError(regex, str(e)) from None
            except RecursionError:  # measuring and building recurse once per level of nesting
                raise RegexError(self._name, TOO_DEEP) from None
        self._stacks: list[tuple[int, int, int]] = [(-1, -1, 0)]  # stack id → (call site, below, passes); 0: empty
        self._stack_ids: dict[tuple[int, int, int], int] = {}
        self._positions: list[tuple[int, int]] = []  # position → (state, stack id)
        self._position_ids: dict[tuple[int, int], int] = {}
        self.start, self.accept = self._position(start, 0), self._position(end, 0)
        # (tuples, not sets or lists: tuples of ints leave the cyclic collector's lists at its next pass, and an
        # automaton keeps hundreds of thousands of them, which full collections would otherwise walk)
        self._closures: dict[int, tuple[int, ...]] = {}
        self._moves: dict[int, tuple[tuple[int, int, int], ...]] = {}

    def __len__(self) -> int:
        """States built so far (fragments not yet entered are not)."""
        return len(self.edges)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        # keyed by ids, which a pickle does not keep: measured again (and the recipes hold what is left to build)
        state["_facts"], state["_item_facts"], state["_tree"] = {}, {}, None
        return state

    def build_all(self) -> ByteNFA:
        """Build every fragment not built yet (what walks would build, all at once); returns ``self``.

        Changes the automaton's states, not its language (for measuring and tests: walks build what they need).
        """
        while len(self._spans) < len(self._recipes):
            for fragment in [f for f in self._recipes if f not in self._spans]:
                self._span(fragment)
        return self

    def _new(self) -> int:
        if len(self.edges) >= MAX_STATES:
            raise Unsupported(f"it needs more than {MAX_STATES:,} automaton states; lower its repetition counts")
        self.edges.append([])
        self.eps.append([])
        return len(self.edges) - 1

    def _measure(self, items: list) -> _Facts:
        """The `_Facts` of the parsed sequence ``items`` (memoized by identity); `Unsupported` if it holds what
        the automaton cannot build."""
        facts = self._facts.get(id(items))
        if facts is None:
            keys: list = []
            key_of, item_facts, size, empty, nullable = keys.append, self._item_facts, 0, False, True
            for item in items:  # (every item of every distinct sequence passes here: the loop is kept lean)
                if item[0] is _LITERAL:  # (the common case, inline: only a lone surrogate, not a symbol, is empty)
                    key_of(item)
                    size += 1
                    nullable = False
                    if 0xD800 <= item[1] < SYMBOLS[0]:
                        empty = True
                    continue
                found = item_facts.get(id(item))  # (an item shared by many sequences: measured once)
                if found is None:
                    found = item_facts[id(item)] = self._measure_item(*item)
                key, item_size, item_empty, item_nullable = found
                key_of(key)
                # a fragment here is a call, unless it may match "": copies of it (x?{n}) are walked through at once
                size += _CALL if item_size >= FRAGMENT_MIN and not item_nullable else item_size
                empty, nullable = empty or item_empty, nullable and item_nullable
            structure = tuple(keys)
            facts = self._facts[id(items)] = _Facts(self._interned.setdefault(structure, len(self._interned)),
                                                    size, empty, nullable, structure)
        return facts

    def _measure_item(self, op: C._NamedIntConstant, arg: Any) -> tuple[tuple, int, bool, bool]:
        """(structural key, size, empty, nullable) of one item, as `_measure`."""
        if op in (C.NOT_LITERAL, C.ANY, C.IN):
            empty = op is C.IN and not byte_sequences(char_ranges(op, arg))
            return (op, tuple(arg) if op is C.IN else arg), 1, empty, False
        if op is C.SUBPATTERN:
            if arg[1] or arg[2]:
                raise Unsupported("inline flags such as (?i) are not supported")
            if type(arg[3]) is Stated:  # read when built, not now
                return (op, "stated", arg[3].key), arg[3].size, False, arg[3].nullable
            facts = self._measure(arg[3])
            return (op, facts.key), facts.size, facts.empty, facts.nullable
        if op is C.BRANCH:
            alternatives = [self._measure(alternative) for alternative in arg[1]]
            return ((op, tuple(a.key for a in alternatives)), 1 + sum(a.size for a in alternatives),
                    all(a.empty for a in alternatives), any(a.nullable for a in alternatives))
        if op in REPEATS:
            low, high, body = arg
            facts = self._measure(body)
            copies = max(low if high is C.MAXREPEAT else high, 1)
            if facts.nullable and not facts.empty and copies * facts.size > MAX_STATES:
                # copied, never counted (a count could pass without reading a byte): refused before any build
                raise Unsupported(f"its repetitions need about {copies * facts.size:,} automaton states, more "
                                   f"than {MAX_STATES:,}; lower their counts")
            return ((op, low, high, facts.key), 1 + copies * facts.size, low > 0 and facts.empty,
                    low == 0 or facts.nullable)
        raise Unsupported(unsupported(op))

    def _sequence(self, items: list, state: int) -> int:
        """Build ``items`` (which match some string) from ``state``; the state they end in."""
        # (memoized; a fragment read back from the disk cache is measured here)
        facts = self._measure(items)
        for item, key in zip(items, facts.keys):
            end = self._built.get((key, state))
            if end is None:
                op, arg = item
                if op is not _LITERAL and self._item_facts[id(item)][1] >= FRAGMENT_MIN:  # (its size)
                    self._recipes.setdefault(key, (op, arg))
                    end = self._enter(key, state, 1, 1)
                else:
                    end = self._item(op, arg, state)
                self._built[key, state] = end
            state = end
        return state

    def _enter(self, fragment: Hashable, state: int, low: int, high: int | None) -> int:
        """A call from ``state`` through ``fragment``, ``low`` to ``high`` times in a row; the state it returns to."""
        site, back = self._new(), self._new()
        self.eps[state].append(site)
        self.calls[site] = (fragment, back, low, high)
        return back

    def _span(self, fragment: Hashable) -> tuple[int, int]:
        """The (start, end) of ``fragment``, built from a fresh state when first needed."""
        span = self._spans.get(fragment)
        if span is None:
            op, arg = self._recipes[fragment]
            with gc_paused():
                try:
                    start = self._new()
                    span = self._spans[fragment] = (start, self._item(op, arg, start) if op is not None
                                                    else self._sequence(arg, start))
                except Unsupported as e:  # past MAX_STATES, found as a walk reaches the part that needs them
                    raise RegexError(self._name, str(e)) from None
                except RecursionError:  # (a walk's own frames sit below this build's)
                    raise RegexError(self._name, TOO_DEEP) from None
        return span

    def _item(self, op: C._NamedIntConstant, arg: Any, state: int) -> int:
        if op in (C.LITERAL, C.NOT_LITERAL, C.ANY, C.IN):
            return self._chars(char_ranges(op, arg), state)
        if op is C.SUBPATTERN:
            return self._sequence(group_body(arg[3]), state)
        if op is C.BRANCH:  # alternatives start at `state` itself, so equal prefixes are shared
            end = self._new()
            for alternative in arg[1]:
                if not self._measure(alternative).empty:  # (an empty one would be a dead end)
                    self.eps[self._sequence(alternative, state)].append(end)
            return end
        low, high, body = arg  # a repeat
        facts = self._measure(body)
        if facts.empty:  # matches "" only (low is 0: the repeat matches some string)
            return state
        copies = low if high is C.MAXREPEAT else high  # (a star adds one more, looping)
        # (a body matching "" could count without reading a byte)
        if copies > 1 and facts.size * copies >= COUNTER_MIN and not facts.nullable:
            fragment = ("body", facts.key)
            self._recipes.setdefault(fragment, (None, body))
            return self._enter(fragment, state, low, None if high is C.MAXREPEAT else high)
        for _ in range(low):
            state = self._sequence(body, state)
        if high is C.MAXREPEAT:  # star: loop through one state
            loop = self._new()
            self.eps[state].append(loop)
            self.eps[self._sequence(body, loop)].append(loop)
            return loop
        end = self._new()
        for _ in range(high - low):
            self.eps[state].append(end)
            state = self._sequence(body, state)
        self.eps[state].append(end)
        return end

    def _chars(self, ranges: Ranges, state: int) -> int:
        """One character of ``ranges`` from ``state`` (`byte_automaton`); the state it ends in."""
        inner, edges = byte_automaton(ranges)
        end = self._new()
        if not inner:  # (one byte per character: most classes)
            self.edges[state].extend([(a, b, end) for _, a, b, _ in edges])
            return end
        states = [state, end, *[self._new() for _ in range(inner)]]
        for at, a, b, then in edges:
            self.edges[states[at]].append((a, b, states[then]))
        return end

    def _position(self, state: int, stack: int) -> int:
        key = (state, stack)
        p = self._position_ids.get(key)
        if p is None:
            p = self._position_ids[key] = len(self._positions)
            self._positions.append(key)
        return p

    def _push(self, site: int, below: int, passes: int) -> int:
        key = (site, below, passes)
        stack = self._stack_ids.get(key)
        if stack is None:
            stack = self._stack_ids[key] = len(self._stacks)
            self._stacks.append(key)
        return stack

    def closure(self, position: int) -> tuple[int, ...]:
        """Positions reachable from ``position`` by epsilon edges, calls and returns that match a byte or
        accept, ascending.

        Does not change the language (memoized; builds the fragments it enters and numbers new positions as
        they are reached, so concurrent callers must hold one lock, as `LazyDFA` does). `RegexError` if a
        fragment would pass `MAX_STATES`.
        """
        found = self._closures.get(position)
        if found is not None:
            return found
        state, stack = self._positions[position]
        if not self.eps[state] and state not in self.calls and (
                not stack or state != self._spans[self.calls[self._stacks[stack][0]][0]][1]):
            # (most positions: a byte edge and nothing else, not a fragment's end: the position alone)
            found = self._closures[position] = (position,) if self.edges[state] or position == self.accept else ()
            return found
        seen, todo = {position}, [position]
        while todo:
            state, stack = self._positions[todo.pop()]
            nexts = [(t, stack) for t in self.eps[state]]
            call = self.calls.get(state)
            if call is not None:  # enter the fragment, to come back to the call's return state at its end
                fragment, back, low, _ = call
                nexts.append((self._span(fragment)[0], self._push(state, stack, 1)))
                if low == 0:
                    nexts.append((back, stack))
            site, below, passes = self._stacks[stack]
            if site >= 0:
                fragment, back, low, high = self.calls[site]
                start, end = self._spans[fragment]  # (built: a position inside it is reached)
                if state == end:  # the fragment's end: return, or pass once more
                    if passes >= low:
                        nexts.append((back, below))
                    if high is None or passes < high:  # (unbounded: every count past `low` is the same)
                        nexts.append((start, self._push(site, below, min(passes + 1, low) if high is None
                                                        else passes + 1)))
            for nxt in nexts:
                p = self._position(*nxt)
                if p not in seen:
                    seen.add(p)
                    todo.append(p)
        found = self._closures[position] = tuple(sorted(
            p for p in seen if self.edges[self._positions[p][0]] or p == self.accept
        ))
        return found

    def moves(self, position: int) -> tuple[tuple[int, int, int], ...]:
        """The byte-range edges out of ``position``: (low byte, high byte, next position). Memoized, as
        `closure`."""
        found = self._moves.get(position)
        if found is None:
            state, stack = self._positions[position]
            found = self._moves[position] = tuple([(lo, hi, self._position(to, stack))
                                                   for lo, hi, to in self.edges[state]])
        return found
