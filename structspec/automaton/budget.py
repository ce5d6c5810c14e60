"""Token budgets: at most N tokens of free text, then only its end marker (vLLM's "thinking budget").

A count of tokens is not a property of the text, so no byte regex holds it; a `BudgetedFSM` pairs each state of
the regex's FSM with where the budgeted text stands: still in its ``opening`` marker, inside it with ``count``
tokens written and the partial matches of its end markers, or past it. While the count is below the budget a
state allows exactly what the regex's state allows (the same cached mask row); once it is spent, only tokens
that go on spelling an end marker from where the text stands (the rest of a partly written ``</think>``, or the
special token), or an end token where the text has no end marker and runs to the output's end — after the
rest of a character the budget's last token left half written (tokens of its continuation bytes alone). A
forced special marker is then the state's only token, so fast-forward writes it without a model call.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field

import numpy as np

from structspec.automaton.fsm import TokenFSM
from structspec.automaton.index import TokenIndex, cached, pack


@dataclass(frozen=True)
class TokenBudget:
    """At most ``tokens`` tokens from the end of ``opening`` (the bytes the output opens with: a begin marker, or
    nothing) until one of ``ends`` (byte strings; a special token's are its symbol's) is written; empty ``ends``:
    the text runs to the end of the output, and a spent budget allows only an end token."""

    tokens: int
    opening: bytes = b""
    ends: tuple[bytes, ...] = ()


_OPENING, _INSIDE, _PAST = 0, 1, 2


@dataclass(eq=False)
class _Learned:
    """What walks of a `BudgetedFSM` have built: its states (``keys`` by id, ``ids`` by key), steps, spent
    states' allowed ids and masks, and the ids going on from each end marker's rest. Grows under ``lock``."""

    tables: list[list[dict[int, int]]]  # KMP's automaton of each end marker
    keys: list[tuple[int, int, int, tuple[int, ...]]] = field(default_factory=list)
    ids: dict[tuple[int, int, int, tuple[int, ...]], int] = field(default_factory=dict)
    steps: dict[tuple[int, int], int | None] = field(default_factory=dict)
    spent: dict[tuple[int, tuple[int, ...]], np.ndarray] = field(default_factory=dict)
    packed: dict[tuple[int, tuple[int, ...]], np.ndarray] = field(default_factory=dict)
    ending: dict[bytes, np.ndarray] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)


# Per token index (kept while the index is: the compile cache's bound holds for these too) and budget.
_LEARNED: weakref.WeakKeyDictionary[TokenIndex, dict[TokenBudget, _Learned]] = weakref.WeakKeyDictionary()
_LEARNED_LOCK = threading.Lock()


def _partial_matches(marker: bytes) -> list[dict[int, int]]:
    """KMP's automaton of ``marker``: ``table[k][byte]`` is the length of the longest prefix of ``marker`` that
    ends the text after ``byte``, from a text whose longest such suffix has length ``k`` (a byte it lacks: 0)."""
    fail = [0] * (len(marker) + 1)
    for i in range(1, len(marker)):
        k = fail[i]
        while k and marker[i] != marker[k]:
            k = fail[k]
        fail[i + 1] = k + 1 if marker[i] == marker[k] else 0
    table: list[dict[int, int]] = []
    for k in range(len(marker)):
        row = dict(table[fail[k]]) if k else {}
        row[marker[k]] = k + 1
        table.append(row)
    return table


@dataclass(frozen=True, eq=False)
class BudgetedFSM(TokenFSM):
    """A `TokenFSM` whose budgeted text (`TokenBudget`) is held to its token count: states are ids of (the
    regex's state, where the budgeted text stands). Same reads as `TokenFSM`; each new state is numbered when a
    walk first reaches it, under a lock (the table grows, the language does not)."""

    budget: TokenBudget
    _learned: _Learned = field(init=False, repr=False)

    @classmethod
    def over(cls, fsm: TokenFSM, budget: TokenBudget) -> BudgetedFSM:
        """``fsm`` held to ``budget`` (a new object: ``fsm`` is not changed). What decoding reaches in it is kept
        per index and budget, as the index keeps its own masks, so a later compile of the spec starts warm."""
        return cls(fsm.pattern, fsm.index, fsm.info, budget)

    def __post_init__(self) -> None:
        with _LEARNED_LOCK:
            learned = _LEARNED.setdefault(self.index, {}).get(self.budget)
            if learned is None:
                learned = _LEARNED[self.index][self.budget] = _Learned(
                    [_partial_matches(m) for m in self.budget.ends])
        object.__setattr__(self, "_learned", learned)  # (frozen)
        start = (_OPENING, 0, ()) if self.budget.opening else (_INSIDE, 0, (0,) * len(self.budget.ends))
        self._id(super().initial_state, *start)

    @property
    def _keys(self) -> list[tuple[int, int, int, tuple[int, ...]]]:
        return self._learned.keys

    @property
    def _lock(self) -> threading.RLock:
        return self._learned.lock

    def _id(self, state: int, phase: int, count: int, partial: tuple[int, ...]) -> int:
        key, ids = (state, phase, count, partial), self._learned.ids
        found = ids.get(key)
        if found is None:
            with self._lock:
                found = ids.setdefault(key, len(self._keys))
                if found == len(self._keys):
                    self._keys.append(key)
        return found

    def _spent_key(self, state: int) -> tuple[int, tuple[int, ...]] | None:
        """(regex state, partial matches) where ``state``'s budget is spent inside the text, else None."""
        inner, phase, count, partial = self._keys[state]
        return (inner, partial) if phase == _INSIDE and count >= self.budget.tokens else None

    def _limit_key(self, state: int) -> tuple[int, tuple[int, ...] | int] | None:
        """Where ``state`` allows less than its regex state: a spent budget (`_spent_key`), or a budget of 0 tokens
        still in its opening marker, (regex state, the opening's bytes written), where a token that completes
        the marker may carry no thinking, only the way to an end marker; else None."""
        inner, phase, count, _ = self._keys[state]
        if phase == _OPENING and self.budget.tokens == 0:
            return inner, count
        return self._spent_key(state)

    @property
    def initial_state(self) -> int:
        return 0

    def knows(self, state: int) -> bool:
        return 0 <= state < len(self._keys)

    def is_final(self, state: int) -> bool:
        return super().is_final(self._keys[state][0])

    def next_bytes(self, state: int) -> list[int]:
        live = super().next_bytes(self._keys[state][0])
        spent = self._spent_key(state)
        if spent is None or _mid_character(live):
            return live
        firsts = {m[k] for m, k in zip(self.budget.ends, spent[1], strict=True)}
        return [b for b in live if b in firsts]

    def allowed_token_ids(self, state: int) -> np.ndarray:
        limit = self._limit_key(state)
        if limit is None:
            return super().allowed_token_ids(self._keys[state][0])
        return cached(self._learned.spent, limit, self._limited_ids, self._lock)

    def packed_mask(self, state: int) -> np.ndarray:
        limit = self._limit_key(state)
        if limit is None:
            return super().packed_mask(self._keys[state][0])
        learned = self._learned
        return cached(learned.packed, limit, lambda key: pack(cached(learned.spent, key, self._limited_ids,
                                                                     self._lock), self.logits_width), self._lock)

    def mask_ready(self, state: int) -> bool:
        limit = self._limit_key(state)
        return super().mask_ready(self._keys[state][0]) if limit is None else limit in self._learned.packed

    def _limited_ids(self, limit: tuple[int, tuple[int, ...] | int]) -> np.ndarray:
        """The ids a state limited as ``limit`` says (`_limit_key`) allows."""
        inner, where = limit
        if isinstance(where, int):
            return self._opening_ids(inner, where)
        return self._spent_ids(inner, where)

    def _opening_ids(self, inner: int, written: int) -> np.ndarray:
        """The ids a budget of 0 tokens allows in regex state ``inner``, ``written`` bytes into its opening marker:
        those that stay in the marker, and those that complete it and go on only to spell an end marker (a
        prefix of one, or one and more), or with no end marker, nothing (only the end of the output may follow)."""
        rest, ends = self.budget.opening[written:], self.budget.ends
        token_bytes = self.vocab.token_bytes

        def fits(data: bytes) -> bool:
            if rest.startswith(data):
                return True
            thinking = data[len(rest):]
            return data.startswith(rest) and any(m.startswith(thinking) or thinking.startswith(m) for m in ends)

        allowed = super().allowed_token_ids(inner)
        ids = allowed[[fits(token_bytes[i]) for i in allowed]] if allowed.size else allowed
        ids.setflags(write=False)
        return ids

    def _spent_ids(self, inner: int, partial: tuple[int, ...]) -> np.ndarray:
        """The ids a spent budget allows in regex state ``inner`` with the end markers matched to ``partial``."""
        going_on = self._going_on(partial)
        if _mid_character(super().next_bytes(inner)):
            going_on = np.union1d(going_on, self._ending_ids(b""))
        ids = np.intersect1d(super().allowed_token_ids(inner), going_on)
        ids.setflags(write=False)
        return ids

    def _going_on(self, partial: tuple[int, ...]) -> np.ndarray:
        """Ids that go on spelling an end marker from ``partial`` (each marker's matched length): a token that
        spells a prefix of a marker's rest, or the whole rest and then more; the end tokens where the text has
        no end marker."""
        if not self.budget.ends:
            return np.array(sorted(self.eos_token_ids), dtype=np.int32)
        out = [self._ending_ids(m[k:]) for m, k in zip(self.budget.ends, partial, strict=True)]
        return np.unique(np.concatenate(out))

    def _ending_ids(self, rest: bytes) -> np.ndarray:
        """Ids spelling a prefix of ``rest`` or ``rest`` and more; for b"", those of continuation bytes alone."""
        ending = self._learned.ending
        if rest not in ending:
            ids = [i for i, b in enumerate(self.vocab.token_bytes) if b and (
                rest.startswith(b) or b.startswith(rest) if rest else all(0x80 <= c < 0xC0 for c in b))]
            ending[rest] = np.array(ids, dtype=np.int32)
        return ending[rest]

    def next_state(self, state: int, token_id: int) -> int | None:
        key, steps = (state, token_id), self._learned.steps
        if key in steps:
            return steps[key]
        inner, phase, count, partial = self._keys[state]
        after = super().next_state(inner, token_id)
        if after is not None and self._limit_key(state) is not None and token_id not in self.allowed_token_ids(state):
            after = None
        if after is not None:
            after = self._id(after, *self._advance(phase, count, partial, self.vocab.token_bytes[token_id]))
        steps[key] = after
        return after

    def _advance(self, phase: int, count: int, partial: tuple[int, ...], data: bytes) -> tuple[int, int,
                                                                                              tuple[int, ...]]:
        """Where the budgeted text stands after a token spelling ``data``."""
        if phase == _OPENING:
            taken = min(len(self.budget.opening) - count, len(data))
            if count + taken < len(self.budget.opening):
                return _OPENING, count + taken, ()
            data, phase, count, partial = data[taken:], _INSIDE, 0, (0,) * len(self.budget.ends)
            if not data:
                return phase, count, partial
        if phase == _PAST:
            return _PAST, 0, ()
        matched = list(partial)
        for byte in data:
            for i, table in enumerate(self._learned.tables):
                matched[i] = table[matched[i]].get(byte, 0)
                if matched[i] == len(table):
                    return _PAST, 0, ()
        return _INSIDE, min(count + 1, self.budget.tokens), tuple(matched)


def _mid_character(live: list[int]) -> bool:
    """Whether only UTF-8 continuation bytes may come next: a character is half written."""
    return bool(live) and all(0x80 <= b < 0xC0 for b in live)


__all__ = ["BudgetedFSM", "TokenBudget"]
