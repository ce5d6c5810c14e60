"""Byte NFA → DFA by the subset construction over the NFA's positions, one state at a time, as states are reached."""

from __future__ import annotations

import threading

import numpy as np

from structspec.automaton.nfa import ByteNFA

DEAD = 0


class LazyDFA:
    """The subset construction of a `ByteNFA`, built as states are reached.

    State 0 is dead. ``table[d, byte]`` is the next state once row ``d`` is
    built (``built[d]``); rows are built for whole batches of states at once.
    Reads build the rows they need under a lock, so threads sharing one DFA see
    the same language as one thread would (state numbers follow the build order).
    """

    def __init__(self, nfa: ByteNFA) -> None:
        self.nfa = nfa
        self._sets: list[frozenset[int]] = [frozenset()]
        self._ids: dict[frozenset[int], int] = {frozenset(): DEAD}
        self.table = np.zeros((64, 256), dtype=np.int32)
        self.built = np.zeros(64, dtype=bool)
        self.built[DEAD] = True
        self._lock = threading.Lock()
        # positions a byte enters → the state of their closure: rows of one region (a string's characters, the
        # last byte of a multi-byte character) enter the same positions
        self._entered: dict[frozenset[int], int] = {}
        self.initial = self._intern(nfa.closure(nfa.start))

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_lock"]  # locks do not pickle; the disk cache stores DFAs
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._sets)

    def _intern(self, states: frozenset[int]) -> int:
        d = self._ids.get(states)
        if d is None:
            d = self._ids[states] = len(self._sets)
            self._sets.append(states)
            # Grow by doubling; the table first, so an id read from it always fits in `built`.
            if d >= len(self.built):
                self.table = np.concatenate([self.table, np.zeros_like(self.table)])
                self.built = np.concatenate([self.built, np.zeros_like(self.built)])
        return d

    def is_final(self, d: int) -> bool:
        """Whether ``d`` accepts. Does not change the DFA."""
        return self.nfa.accept in self._sets[d]

    def ensure(self, states: np.ndarray) -> None:
        """Build the rows of every state in ``states`` not built yet.

        Builds the rows it reaches: the table grows, the language does not.
        """
        if self.built[states].all():
            return
        with self._lock:  # re-read under the lock: another thread may have built some meanwhile
            for d in np.unique(states[~self.built[states]]).tolist():
                self._build(d)

    def _build(self, d: int) -> None:
        # Swept by byte range, not byte by byte: a range of bytes that enters the same NFA positions (a string's
        # characters) is one DFA state, interned once.
        changes: dict[int, list[tuple[int, int]]] = {0: [], 256: []}  # byte → (position, +1 entering / -1 leaving)
        for s in self._sets[d]:
            for lo, hi, to in self.nfa.moves(s):
                changes.setdefault(lo, []).append((to, 1))
                changes.setdefault(hi + 1, []).append((to, -1))
        row = np.empty(256, dtype=np.int32)
        interned = self._entered
        active: dict[int, int] = {}  # position → how many of the ranges covering this byte enter it
        cuts = sorted(changes)
        for lo, end in zip(cuts, cuts[1:]):
            for to, change in changes[lo]:
                active[to] = active.get(to, 0) + change
                if not active[to]:
                    del active[to]
            key = frozenset(active)
            if key not in interned:
                interned[key] = self._intern(frozenset().union(*map(self.nfa.closure, key)))
            row[lo:end] = interned[key]
        self.table[d] = row  # after interning, which may have grown (and copied) the table
        self.built[d] = True

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
        for byte in data:
            if not self.built[d]:
                self.ensure(np.array([d]))
            d = int(self.table[d, byte])
            if d == DEAD:
                return DEAD
        return d
