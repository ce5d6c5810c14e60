"""Byte NFA → DFA by the subset construction over the NFA's positions, one state at a time, as states are reached."""

from __future__ import annotations

import os
import threading
from types import ModuleType
from typing import Any

import numpy as np

from structspec.automaton.nfa import ByteNFA

DEAD = 0


def _load_core() -> ModuleType | None:
    """The compiled core (`_core.c`), or None where it was not built or ``STRUCTSPEC_PURE_PYTHON`` is set (to
    1, or any value but 0 or empty): then the Python loops below, which give the same answers, run instead."""
    if os.environ.get("STRUCTSPEC_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        from structspec.automaton import _core
    except ImportError:  # an install without a C compiler: the build skipped the optional extension
        return None
    return _core


CORE = _load_core()
"""The compiled core the automaton's hot loops run in, or None (the Python loops); tests set it to compare."""


def _cell(state: int) -> bytes:
    """``state`` as a row's bytes hold it (int32, little-endian)."""
    return state.to_bytes(4, "little")


_DEAD_CELL = _cell(DEAD)


class _Table:
    """A `LazyDFA`'s rows by state: ``[d, byte]`` or ``[d]``, as `LazyDFA.table` says."""

    __slots__ = ("_dfa",)

    def __init__(self, dfa: LazyDFA) -> None:
        self._dfa = dfa

    def __getitem__(self, key: Any) -> Any:
        dfa = self._dfa
        if isinstance(key, tuple):
            d, byte = key
            return dfa.rows[dfa.slots[d], byte]
        return dfa.rows[dfa.slots[key]]


class LazyDFA:
    """The subset construction of a `ByteNFA`, built as states are reached.

    State 0 is dead. ``table[d, byte]`` is the next state once row ``d`` is
    built (``built[d]``; before, the row reads dead); rows are built for whole batches of states at once. Only
    built rows are stored (``rows[slots[d]]``): most states are met as a row's targets and never built.
    Reads build the rows they need under a lock, so threads sharing one DFA see
    the same language as one thread would (state numbers follow the build order). Rows are built by the
    compiled core's `Builder` where there is one (`CORE`), else by the Python loops below: both number states
    and NFA positions alike and record them in the same lists, so either goes on where the other stopped. The
    core builds with the GIL released (other threads run, a batch's masks fill in parallel) and publishes a row
    (sets its slot) only once the states it leads to are recorded, so lock-free readers never meet one unknown.
    """

    def __init__(self, nfa: ByteNFA) -> None:
        self.nfa = nfa
        # A state is its NFA positions, ascending (a tuple, as `ByteNFA.closure` gives them: no set kept per state)
        self._sets: list[tuple[int, ...]] = [()]
        self._ids: dict[tuple[int, ...], int] = {(): DEAD}
        self.rows = np.zeros((64, 256), dtype=np.int32)  # slot 0: the dead row, read by every state not built
        self._rows_used = 1
        self.slots = np.zeros(64, dtype=np.int32)  # state → its row's slot
        self.built = np.zeros(64, dtype=bool)
        self.built[DEAD] = True
        self._lock = threading.Lock()
        # positions a byte enters → the state of their closure: rows of one region (a string's characters, the
        # last byte of a multi-byte character) enter the same positions
        self._entered: dict[tuple[int, ...], int] = {}
        self._entered_one: dict[int, bytes] = {}  # one position entered → its state, as a row's 4 bytes hold it
        self._builder: Any = None  # the compiled core's `Builder` over these sets, made when first building with it
        self.initial = self._intern(nfa.closure(nfa.start))

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_lock"], state["_builder"]  # neither pickles (the disk cache stores DFAs); both are remade
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._builder = None

    def __len__(self) -> int:
        return len(self._sets)

    @property
    def table(self) -> _Table:
        """``table[d, byte]``, ``table[d]`` (ints, arrays of states or slices for ``d``): the next states, as read
        from the built rows (an unbuilt state's row reads dead). Does not change the DFA."""
        return _Table(self)

    def _intern(self, states: tuple[int, ...]) -> int:
        d = self._ids.get(states)
        if d is None:
            d = self._ids[states] = len(self._sets)
            self._sets.append(states)
            # Grow by doubling, before the id is written in a row: an id read from a row always fits.
            if d >= len(self.built):
                self.slots = np.concatenate([self.slots, np.zeros_like(self.slots)])
                self.built = np.concatenate([self.built, np.zeros_like(self.built)])
        return d

    def is_final(self, d: int) -> bool:
        """Whether ``d`` accepts. Does not change the DFA."""
        return self.nfa.accept in self._sets[d]

    def ensure(self, states: np.ndarray) -> None:
        """Build the rows of every state in ``states`` not built yet.

        Builds the rows it reaches: the table grows, the language does not.
        """
        if CORE is not None:
            if CORE.unbuilt(states, self.built):
                with self._lock:  # (the core re-reads which are built, under the lock)
                    self._build_compiled(states)
            return
        if self.built[states].all():
            return
        with self._lock:  # re-read under the lock: another thread may have built some meanwhile
            # (ascending, each once: a set of the few unbuilt states costs less than numpy's unique)
            for d in sorted(set(states[~self.built[states]].tolist())):
                self._build(d)

    def _build_compiled(self, states: np.ndarray) -> None:
        """`_build` of each state of ``states`` not built yet, ascending, in the compiled core, which numbers and
        records positions and states as the Python loops would (so either may go on where the other stopped),
        the GIL released while it builds."""
        if self._builder is None:
            self._builder = CORE.Builder(self.nfa, self._sets, self._ids)
        while True:  # the core stops where the arrays may be too small for the next row, and goes on once grown
            done, self._rows_used = self._builder.build_rows(states, self.rows, self.slots, self.built,
                                                             self._rows_used)
            if done:
                return
            if self._rows_used == len(self.rows):
                self.rows = np.concatenate([self.rows, np.zeros_like(self.rows)])
            while len(self.slots) <= len(self._sets) + 256:  # (a row interns at most 256 new states)
                self.slots = np.concatenate([self.slots, np.zeros_like(self.slots)])
                self.built = np.concatenate([self.built, np.zeros_like(self.built)])

    def _build(self, d: int) -> None:
        moves = sorted([m for s in self._sets[d] for m in self.nfa.moves(s)])  # (by byte range)
        if not all(a[1] < b[0] or a[:2] == b[:2] for a, b in zip(moves, moves[1:])):  # ranges overlap
            row = self._written(self._sweep(moves))
        else:
            row = self._written(self._partition(moves))
        slot = self._rows_used
        if slot == len(self.rows):
            self.rows = np.concatenate([self.rows, np.zeros_like(self.rows)])
        self.rows[slot] = row
        self._rows_used += 1
        self.slots[d] = slot  # after interning, which may have grown (and copied) the slots
        self.built[d] = True

    @staticmethod
    def _written(segments: list[tuple[int, int, bytes]]) -> np.ndarray:
        """The row of live (low byte, end byte, state cell) ``segments``, ascending, dead elsewhere."""
        # The row is written as bytes joined once: a numpy write per range would cost more than the rest of the row.
        parts, at = [], 0
        for lo, end, cell in segments:
            parts += (_DEAD_CELL * (lo - at), cell * (end - lo))
            at = end
        parts.append(_DEAD_CELL * (256 - at))
        return np.frombuffer(b"".join(parts), dtype="<i4")

    def _enter_one(self, position: int) -> bytes:
        """The state entering ``position`` alone leads to, interned and kept, as a row's 4 bytes hold it."""
        cell = self._entered_one[position] = _cell(self._intern(self.nfa.closure(position)))
        return cell

    def _enter_many(self, positions: tuple[int, ...]) -> int:
        """The state entering ``positions`` (ascending, each once) leads to, interned and kept."""
        state = self._entered[positions] = self._intern(self._union(positions))
        return state

    def _partition(self, moves: list[tuple[int, int, int]]) -> list[tuple[int, int, bytes]]:
        """The live (low byte, end byte, state cell) segments of sorted ``moves`` whose ranges are equal or
        disjoint (most rows: a literal's next byte, a string's characters, alternatives on the same class)."""
        segments: list[tuple[int, int, bytes]] = []
        one, many = self._entered_one, self._entered
        i, n = 0, len(moves)
        while i < n:
            lo, hi, to = moves[i]
            j = i + 1
            while j < n and moves[j][0] == lo and moves[j][1] == hi:
                j += 1
            if j == i + 1:  # one position entered: no set to build
                cell = one.get(to) or self._enter_one(to)
            else:
                key = tuple(dict.fromkeys([m[2] for m in moves[i:j]]))  # (ascending: the moves are sorted)
                state = many.get(key)
                cell = _cell(self._enter_many(key) if state is None else state)
            segments.append((lo, hi + 1, cell))
            i = j
        return segments

    def _sweep(self, moves: list[tuple[int, int, int]]) -> list[tuple[int, int, bytes]]:
        """The live (low byte, end byte, state cell) segments of overlapping ``moves``, ascending: swept by byte range,
        not byte by byte, so a range of bytes that enters the same positions is one DFA state, interned once."""
        changes: dict[int, list[tuple[int, int]]] = {0: [], 256: []}  # byte → (position, +1 entering / -1 leaving)
        for lo, hi, to in moves:
            changes.setdefault(lo, []).append((to, 1))
            changes.setdefault(hi + 1, []).append((to, -1))
        interned, segments = self._entered, []
        active: dict[int, int] = {}  # position → how many of the ranges covering this byte enter it
        cuts = sorted(changes)
        for lo, end in zip(cuts, cuts[1:]):
            for to, change in changes[lo]:
                active[to] = active.get(to, 0) + change
                if not active[to]:
                    del active[to]
            if active:
                key = tuple(sorted(active))
                state = interned.get(key)
                if state is None:
                    state = self._enter_many(key)
                segments.append((lo, end, _cell(state)))
        return segments

    def _union(self, positions: tuple[int, ...]) -> tuple[int, ...]:
        """The closures of ``positions`` together, ascending."""
        closure = self.nfa.closure
        if len(positions) == 1:
            return closure(positions[0])
        return tuple(sorted(set().union(*map(closure, positions))))

    def successors(self, d: int) -> tuple[int, ...]:
        """The distinct states row ``d`` leads to, in the order of the first byte leading to each (dead included
        where a byte leads there; a state not built reads the dead row). Does not change the DFA."""
        if CORE is not None:
            return CORE.successors(self.slots, self.rows, d)
        return tuple(dict.fromkeys(self.table[d].tolist()))

    def next_bytes(self, d: int) -> list[int]:
        """The bytes that can come next from ``d``, ascending.

        Builds the row it reads: the table grows, the language does not.
        """
        self.ensure(np.array([d]))
        return np.flatnonzero(self.table[d] != DEAD).tolist()

    def next_characters(self, d: int, limit: int = 8) -> list[str]:
        """Up to ``limit`` characters that can come next from ``d``, smallest first (mid-character: the
        bytes that end it, as ``\\xNN``).

        Builds the rows it reaches: the table grows, the language does not.
        """
        found: list[str] = []
        todo = [(d, b"")]
        while todo and len(found) < limit:
            state, data = todo.pop()
            try:
                if data:
                    found.append(data.decode())
                    continue
            except UnicodeDecodeError:
                pass
            live = self.next_bytes(state)
            if data and (len(data) == 4 or not live):  # began mid-character (a token ended inside one)
                found.append(data.decode("utf-8", "backslashreplace"))
                continue
            todo += [(int(self.table[state, byte]), data + bytes([byte])) for byte in reversed(live)]
        return found

    def step(self, d: int, data: bytes) -> int:
        """The state after ``data`` from ``d`` (DEAD if it leaves the language).

        Builds the rows it reaches: the table grows, the language does not.
        """
        if CORE is not None:
            at = 0
            while True:  # the compiled loop stops before each row not built yet, and goes on once it is
                # (slots read before rows: a slot set is a row written in these rows or a later copy of them)
                d, at = CORE.step(self.slots, self.rows, d, data, at)
                if d == DEAD or at == len(data):
                    return d
                self.ensure(np.array([d]))
        for byte in data:  # (a decoded token's path: `item` reads a Python int without a numpy scalar)
            slot = self.slots.item(d)
            if not slot:  # not built (a slot is set once its row is written), or dead
                if d == DEAD:
                    return DEAD
                self.ensure(np.array([d]))
                slot = self.slots.item(d)
            d = self.rows.item(slot, byte)
            if d == DEAD:
                return DEAD
        return d

    def walk_tokens(self, state: int, tokens: list[int], data: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                    row_of: np.ndarray) -> list[int]:
        """The states after each of ``tokens`` from ``state``, stopping before the first that leaves the language
        or has no text (``row_of[token]`` -1); token t reads ``data[starts[r]:ends[r]]``, r = ``row_of[t]``. With
        the compiled core (`CORE`). Builds the rows it reaches: the table grows, the language does not."""
        ids = np.asarray(tokens, dtype=np.int64)
        found: list[int] = []
        k, at = 0, 0
        while True:  # the core stops before each row not built yet (mid-token), and goes on once it is
            states, k, at, state = CORE.walk_tokens(self.slots, self.rows, data, starts, ends, row_of, state, ids, k, at)
            found += states
            if k == len(ids) or at < 0:
                return found
            self.ensure(np.array([state]))
