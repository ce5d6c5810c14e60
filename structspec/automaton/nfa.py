"""Parsed regex → byte-level Thompson NFA, hash-consed so repeated groups share their states, and large
groups needed in several places built once and entered by calls."""

from __future__ import annotations

import gc
import re._constants as C  # the parser's opcodes
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from structspec.automaton.parse import REPEATS, parse
from structspec.automaton.utf8 import Ranges, byte_sequences, category, complement, normalize
from structspec.errors import RegexError


MAX_STATES = 1_000_000
"""The most NFA states a regex may build into (about 0.5 GB and 10 s of Python); past it, `RegexError`."""

FRAGMENT_MIN = 16
"""A group whose first build took at least this many states is built once more as a fragment, which every
later place calls, instead of once per place (a schema's ``$ref`` target used in a hundred places)."""

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


class _Unsupported(Exception):
    pass


class ByteNFA:
    """Thompson NFA over bytes: byte-range edges, epsilon edges and calls; one start, one accept state.

    Construction is hash-consed: an item (by structure) built from a state it was
    already built from returns the same end state. Both ends have the same set of
    strings leading to them, so merging them changes no language, and the O(k²)
    spelling of optional properties becomes an O(k) automaton: the alternatives
    ``(a,)?b``, ``(a,)?(b,)?c``, … share their common prefixes.

    An item needed in several places is first built from a fresh state as a
    *fragment*, which its places call: a call-site state enters the fragment's
    start and, at the fragment's end, returns to a state of its own; once the
    fragment is known to be small (under `FRAGMENT_MIN` states), later places
    build their own copies instead.
    So a subschema used in many places costs its states once, not once per place.
    A large counted repetition ``x{m,n}`` (`COUNTER_MIN`) is a call that may
    repeat: its frame counts the passes through ``x``'s fragment, and at the
    fragment's end the call returns once the count is at least m and enters the
    fragment again while it is below n. Calls nest but never recurse (a parsed
    regex is a tree) and counts are bounded, so the stacks of frames are bounded;
    the automaton's *positions* are (state, stack) pairs, numbered as they are
    reached (`closure`, `moves`). `start` and `accept` are positions.

    Trimmed once built: edges into states from which no accepting path leads are
    removed, so every position a DFA reaches can still end in a match. Immutable
    once built (`closure` and `moves` only memoize).
    """

    def __init__(self, regex: str) -> None:
        """Parse and build ``regex``: `RegexError` if it is invalid, uses what a DFA cannot do, matches no
        string, or needs more than `MAX_STATES` states."""
        tree = parse(regex)
        self.edges: list[list[tuple[int, int, int]]] = []
        self.eps: list[list[int]] = []
        # call-site state → (fragment start, its end, return state, least and most passes; None: unbounded)
        self.calls: dict[int, tuple[int, int, int, int, int | None]] = {}
        self._keys: dict[int, int] = {}  # id(items) → structural key (ints, so hashing stays cheap)
        self._interned: dict[tuple, int] = {}
        self._built: dict[tuple[object, int], int] = {}
        self._first: dict[object, int] = {}  # item key → states its first build took
        self._fragments: dict[object, tuple[int, int]] = {}  # item key → (start, end) of its fragment
        self._sizes: dict[object, int] = {}  # item key → states its fragment took
        self._needs: dict[object, int] = {}  # item key → places that need it (`_count`)
        self._estimates: dict[int, int] = {}  # id(items) → `_size`
        self._dead_ends = False  # whether a class matching no character was built (`_chars`)
        start = self._new()
        with gc_paused():
            try:
                self._count(tree)
                end = self._sequence(tree, start)
            except _Unsupported as e:
                raise RegexError(regex, str(e)) from None
            del self._keys, self._interned, self._built, self._first, self._fragments, self._sizes, self._needs
            del self._estimates
            # Every state a build makes lies on a path to its item's end, but for a class matching no character:
            # only then are there dead states to trim.
            live = self._trim(start, end) if self._dead_ends else True
        if not live:
            raise RegexError(regex, "it matches no string (an empty class like [^\\s\\S], or a part that "
                             "can never be completed)")
        self._stacks: list[tuple[int, int, int]] = [(-1, -1, 0)]  # stack id → (call site, below, passes); 0: empty
        self._stack_ids: dict[tuple[int, int, int], int] = {}
        self._positions: list[tuple[int, int]] = []  # position → (state, stack id)
        self._position_ids: dict[tuple[int, int], int] = {}
        self.start, self.accept = self._position(start, 0), self._position(end, 0)
        self._closures: dict[int, frozenset[int]] = {}
        self._moves: dict[int, list[tuple[int, int, int]]] = {}

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
            key = self._item_key(op, arg)
            end = self._built.get((key, state))
            if end is None:
                first = self._first.get(key)
                if first is None and self._needs.get(key, 0) > 1 and self._item_size(op, arg) >= FRAGMENT_MIN:
                    # needed again: built once, as a fragment, which this place calls
                    end = self._call(key, op, arg, state)
                    self._first[key] = self._sizes[key]
                elif first is not None and first >= FRAGMENT_MIN:
                    end = self._call(key, op, arg, state)
                else:
                    before = len(self.edges)
                    end = self._item(op, arg, state)
                    self._first.setdefault(key, len(self.edges) - before)
                self._built[key, state] = end
            state = end
        return state

    def _count(self, items: list, times: int = 1) -> None:
        """Count in ``_needs`` how many places need each item (where an item is needed again, its parts are
        not counted again: if large, it is a fragment, and they are built once)."""
        for op, arg in items:
            key = self._item_key(op, arg)
            again = key in self._needs
            self._needs[key] = self._needs.get(key, 0) + times
            if again:
                continue
            if op is C.SUBPATTERN:
                self._count(arg[3])
            elif op is C.BRANCH:
                for alternative in arg[1]:
                    self._count(alternative)
            elif op in REPEATS:
                builds = arg[0] + (1 if arg[1] is C.MAXREPEAT else arg[1] - arg[0])
                self._count(arg[2], 1 if builds <= 1 else 2)  # copied: needed again

    def _size(self, items: list) -> int:
        """About how many states building the parsed sequence ``items`` inline takes (a character: one, as
        if ASCII; sharing and calls aside). Memoized by the sequence's identity: the tree outlives the build."""
        size = self._estimates.get(id(items))
        if size is None:
            size = self._estimates[id(items)] = sum(self._item_size(op, arg) for op, arg in items)
        return size

    def _item_size(self, op: C._NamedIntConstant, arg: object) -> int:
        """`_size` of one item."""
        if op is C.SUBPATTERN:
            return self._size(arg[3])
        if op is C.BRANCH:
            return 1 + sum(map(self._size, arg[1]))
        if op in REPEATS:
            return 1 + max(arg[0] if arg[1] is C.MAXREPEAT else arg[1], 1) * self._size(arg[2])
        return 1

    def _call(self, key: object, op: C._NamedIntConstant, arg: object, state: int) -> int:
        """A call of the item's fragment (built on first need) from ``state``; the state it returns to."""
        return self._enter(self._fragment(key, lambda start: self._item(op, arg, start)), state, 1, 1)

    def _fragment(self, key: object, build: Callable[[int], int]) -> tuple[int, int]:
        """The (start, end) of the fragment named ``key``, built from a fresh state on first need."""
        fragment = self._fragments.get(key)
        if fragment is None:
            start = self._new()
            fragment = self._fragments[key] = (start, build(start))
            self._sizes[key] = len(self.edges) - start
        return fragment

    def _enter(self, fragment: tuple[int, int], state: int, low: int, high: int | None) -> int:
        """A call from ``state`` through ``fragment``, ``low`` to ``high`` times in a row; the state it returns to."""
        site, back = self._new(), self._new()
        self.eps[state].append(site)
        self.calls[site] = (*fragment, back, low, high)
        return back

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
            # (a body matching "" could count without reading a byte)
            if copies > 1 and self._size(body) * copies >= COUNTER_MIN and not _nullable(body):
                fragment = self._fragment(("body", self._key(body)), lambda start: self._sequence(body, start))
                return self._enter(fragment, state, low, None if high is C.MAXREPEAT else high)
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

    def _trim(self, start: int, end: int) -> bool:
        """Drop the edges into states that cannot reach ``end`` (their fragment's end, inside a fragment), and
        the calls of fragments that cannot reach theirs; whether ``start`` still can reach ``end``."""
        back: list[list[int]] = [[] for _ in self.edges]
        for s, (edges, eps) in enumerate(zip(self.edges, self.eps)):
            for _, _, to in edges:
                back[to].append(s)
            for to in eps:
                back[to].append(s)
        for site, (_, _, back_state, low, _) in self.calls.items():
            # A call site is live once its return state is, and its fragment too unless it may pass through it 0 times.
            back[back_state].append(site if low == 0 else -1 - site)
        live: set[int] = set()
        todo: list[int] = []
        waiting: dict[int, list[int]] = {}  # fragment start → its call sites whose return state is live

        def reach(s: int) -> None:
            if s not in live:
                live.add(s)
                todo.append(s)

        for s in [end, *(call[1] for call in self.calls.values())]:
            reach(s)
        while todo:
            s = todo.pop()
            for site in waiting.pop(s, []):  # call sites of the fragment that starts at s
                reach(site)
            for t in back[s]:
                if t >= 0:
                    reach(t)
                elif self.calls[-1 - t][0] in live:
                    reach(-1 - t)
                else:
                    waiting.setdefault(self.calls[-1 - t][0], []).append(-1 - t)
        for s in range(len(self.edges)):
            self.edges[s] = [e for e in self.edges[s] if e[2] in live]
            self.eps[s] = [t for t in self.eps[s] if t in live]
        self.calls = {site: call for site, call in self.calls.items() if site in live}
        return start in live

    def _chars(self, ranges: Ranges, state: int) -> int:
        end = self._new()
        sequences = byte_sequences(ranges)
        self._dead_ends |= not sequences
        for sequence in sequences:
            at = state
            for a, b in sequence[:-1]:
                at_next = self._new()
                self.edges[at].append((a, b, at_next))
                at = at_next
            self.edges[at].append((*sequence[-1], end))
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

    def closure(self, position: int) -> frozenset[int]:
        """Positions reachable from ``position`` by epsilon edges, calls and returns that match a byte or
        accept.

        Does not change the language (memoized; numbers new positions as they are reached, so concurrent
        callers must hold one lock, as `LazyDFA` does).
        """
        found = self._closures.get(position)
        if found is None:
            seen, todo = {position}, [position]
            while todo:
                state, stack = self._positions[todo.pop()]
                nexts = [(t, stack) for t in self.eps[state]]
                call = self.calls.get(state)
                if call is not None:  # enter the fragment, to come back to the call's return state at its end
                    start, _, back, low, _ = call
                    nexts.append((start, self._push(state, stack, 1)))
                    if low == 0:
                        nexts.append((back, stack))
                site, below, passes = self._stacks[stack]
                if site >= 0 and state == self.calls[site][1]:  # the fragment's end: return, or pass once more
                    start, _, back, low, high = self.calls[site]
                    if passes >= low:
                        nexts.append((back, below))
                    if high is None or passes < high:  # (unbounded: every count past `low` is the same)
                        nexts.append((start, self._push(site, below, min(passes + 1, low) if high is None else passes + 1)))
                for nxt in nexts:
                    p = self._position(*nxt)
                    if p not in seen:
                        seen.add(p)
                        todo.append(p)
            found = self._closures[position] = frozenset(
                p for p in seen if self.edges[self._positions[p][0]] or p == self.accept
            )
        return found

    def moves(self, position: int) -> list[tuple[int, int, int]]:
        """The byte-range edges out of ``position``: (low byte, high byte, next position). Memoized, as
        `closure`."""
        found = self._moves.get(position)
        if found is None:
            state, stack = self._positions[position]
            found = self._moves[position] = [(lo, hi, self._position(to, stack)) for lo, hi, to in self.edges[state]]
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


def _nullable(items: list) -> bool:
    """Whether the parsed sequence ``items`` matches the empty string."""
    for op, arg in items:
        if op is C.SUBPATTERN:
            empty = _nullable(arg[3])
        elif op is C.BRANCH:
            empty = any(map(_nullable, arg[1]))
        elif op in REPEATS:
            empty = arg[0] == 0 or _nullable(arg[2])
        else:
            empty = False  # a character (anything else is refused when built)
        if not empty:
            return False
    return True

