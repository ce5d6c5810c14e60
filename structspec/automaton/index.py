"""The token index: which tokens a lazy DFA allows in each state, read off the whole vocabulary at once.

outlines-core's `Index` computes, at compile time, the transition of every token
from every state of the regex's DFA. On real JSON Schemas that takes seconds to
minutes (it is JSONSchemaBench's compile-time tail), and most of those states are
never visited by one generation. Here a state's answer is computed when decoding
first asks for it, in two parts (docs/concepts/token-index.md):

* the state's *region*: the states around it that lead back, within a few
  bytes, into a loop at it or a byte away (a string's characters, the bytes of
  one multi-byte character, an escape), relabelled in a canonical order so that every string field of every
  schema has the same region. Every token is walked through the region once per
  tokenizer and region shape (in the compiled core, the GIL released; without
  it, with numpy, one vectorized step per byte position): the tokens that stay
  inside are allowed, the rest leave it by an *exit* (the closing quote) at a
  known position, or die;
* from here, only the tokens that left the region are walked on, from the
  state each exit leads to: for a string field, the few hundred tokens holding
  a quote, not the 150,000 that do not.

A state with no loop is a region of its own, whose exits are its live bytes, so
a brace or a key's letter walks only the tokens that start with it. The
conventions are outlines-core's (EOS is allowed exactly in final states), so the
two can be compared state by state; `tests/automaton/test_automaton.py` does.
Where several tokens end the output (an instruct model's ``<|im_end|>`` beside
the tokenizer's EOS), each of them is allowed exactly in final states.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from structspec.automaton import dfa as dfa_module
from structspec.automaton.dfa import DEAD, LazyDFA
from structspec.automaton.nfa import gc_paused
from structspec.cache import cache_dir, read_pickle, write_pickle
from structspec.errors import UnspellableError
from structspec.vocab import TokenVocab

REGION_DEPTH = 6
"""How many bytes away from a state its region looks for states that lead back to it: a ``\\uXXXX`` escape
inside a string is the longest such loop in a JSON Schema's regex."""
REGION_LIMIT = 32
"""The most states a region search builds the rows of (a string's region has about 20)."""
WIDE_BYTES = 64
"""A state with no loop near it that allows at least this many bytes next is a *counted* character's (a string
with a ``maxLength``: each count is a state of its own, and alone it would walk almost the whole vocabulary)."""
COUNT_DEPTH = 12
"""How many bytes on a counted character's region takes the wide states it reaches: the counts ahead relabel to the
same table in every such string far enough from its end, so one shape's walk serves each count of each schema."""
COUNT_LIMIT = 96
"""The most states a counted character's region takes (about seven a byte: the character's count and the states
inside multi-byte characters)."""
SHAPES_LIMIT = 1024
"""Region shapes kept in memory per tokenizer, the oldest dropped first (most take a few KB, a string's 20)."""
SHAPE_DISK_SECONDS = 0.005
"""A shape walked slower than this is also kept on disk (a string's, over a 150k vocabulary: tens of ms), keyed
by the tokenizer's fingerprint and the shape's table, so the next process reads it back."""
_SHAPE_FORMAT = "shape-3"  # bumped when `_Shape` or the walk changes, so stale disk entries are not read (2: checksum,
# 3: each level's ends sorted)


class _Level(NamedTuple):
    """One byte position of the tokens that left a region, shared where their bytes so far are equal (a trie):
    node i reads byte ``bytes[i]`` from node ``parents[i]`` of the level before (level 0: the exits); the
    tokens ``ids`` end on nodes ``ends``. Nodes are numbered by (parent, byte) and ``ends`` ascend, so the
    compiled walk finds a node's children and tokens by bisection."""

    parents: np.ndarray
    bytes: np.ndarray
    ends: np.ndarray
    ids: np.ndarray


class _Trie(NamedTuple):
    """A trie's `_Level` arrays laid end to end (int64, bytes uint8), so that the compiled walk reads six arrays
    whatever the depth: level k is ``[node_starts[k]:node_starts[k + 1]]`` of ``parents`` and ``bytes`` and
    ``[end_starts[k]:end_starts[k + 1]]`` of ``ends`` and ``ids``."""

    parents: np.ndarray
    bytes: np.ndarray
    ends: np.ndarray
    ids: np.ndarray
    node_starts: np.ndarray
    end_starts: np.ndarray


@dataclass(frozen=True)
class _Shape:
    """The walk of every token through one region shape: ``base`` (packed, little bit order, over token ids)
    holds the tokens that end inside the region or exactly on an exit; ``trie``, the rest of the tokens that
    left it, rooted at the exits."""

    base: np.ndarray
    trie: _Trie

    @property
    def levels(self) -> tuple[_Level, ...]:
        """The trie's levels (views). Changes nothing."""
        t = self.trie
        nodes, ends = t.node_starts.tolist(), t.end_starts.tolist()
        return tuple(_Level(t.parents[a:b], t.bytes[a:b], t.ends[c:d], t.ids[c:d])
                     for a, b, c, d in zip(nodes, nodes[1:], ends, ends[1:]))


class _VocabBytes:
    """A vocabulary's bytes laid end to end (row i: the i-th text token by id; EOS and special tokens left out)
    for vectorized walks, and the walks of its tokens through each region shape met so far (`shape`)."""

    def __init__(self, vocab: TokenVocab) -> None:
        ids = [i for i, b in enumerate(vocab.token_bytes) if b and i != vocab.eos_token_id]
        spelled = [vocab.token_bytes[i] for i in ids]
        self.size = len(vocab)
        self.fingerprint = vocab.fingerprint
        self.ids = np.array(ids, dtype=np.int64)
        # Every token's bytes end to end (a megabyte for 150k tokens: walks gather from it in cache); row r's
        # bytes are data[starts[r]:ends[r]].
        self.data = np.frombuffer(b"".join(spelled), dtype=np.uint8)
        self.ends = np.cumsum(np.array([len(b) for b in spelled], dtype=np.int64))
        self.starts = self.ends - np.array([len(b) for b in spelled], dtype=np.int64)
        # The rows by first byte: a region whose start allows a few first bytes walks only their tokens.
        first = self.data[self.starts]
        self.first = first
        self.row_of = np.full(self.size, -1, dtype=np.int64)  # token id → its row (-1: no text, or EOS)
        self.row_of[self.ids] = np.arange(len(ids))
        self.by_first = np.argsort(first, kind="stable")
        self.first_starts = np.searchsorted(first[self.by_first], np.arange(257))
        self._shapes: dict[bytes, _Shape] = {}
        self._lock = threading.RLock()
        text = np.zeros(self.size, dtype=bool)
        text[self.ids] = True
        self._text = np.packbits(text, bitorder="little")  # the tokens with bytes
        self._first_bits: dict[int, np.ndarray] = {}  # first byte → its tokens, packed

    def forget_shapes(self) -> None:
        """Forget the region shapes walked so far (for measuring a first walk); changes this cache only."""
        with self._lock:
            self._shapes.clear()

    def rows_starting_with(self, first_bytes: np.ndarray) -> np.ndarray:
        """The rows of the tokens whose first byte is in ``first_bytes``. Changes nothing."""
        starts = self.first_starts
        if len(first_bytes) > 128:  # most bytes: one pass over the first column beats gathering buckets
            return np.flatnonzero(np.isin(self.first, first_bytes))
        return np.concatenate([self.by_first[starts[b]:starts[b + 1]] for b in first_bytes.tolist()]
                              or [np.zeros(0, dtype=np.int64)])

    def starting_with_none_of(self, first_bytes: np.ndarray) -> np.ndarray:
        """The text tokens (EOS and special tokens aside) whose first byte is not in ``first_bytes``, as packed
        bits over ids (little bit order). Keeps each byte's tokens as packed bits once asked (a 150k vocabulary:
        19 KB a byte); changes nothing else."""
        found = self._text.copy()
        for b in first_bytes.tolist():
            tokens = self._first_bits.get(b)
            if tokens is None:
                bits = np.zeros(self.size, dtype=bool)
                bits[self.ids[self.by_first[self.first_starts[b]:self.first_starts[b + 1]]]] = True
                tokens = self._first_bits[b] = np.packbits(bits, bitorder="little")
            found &= ~tokens
        return found

    def walked(self, table: np.ndarray) -> bool:
        """Whether the shape of ``table`` is kept in memory (`shape` would not walk it). Changes nothing."""
        return table.tobytes() in self._shapes

    def shape(self, table: np.ndarray, regions: int) -> _Shape:
        """The `_Shape` of the canonical region ``table`` (see `_region`), walked when first asked and kept.
        Threads get what one thread would."""
        key = table.tobytes()
        found = self._shapes.get(key)
        if found is None:
            with self._lock:
                found = self._shapes.get(key)
                if found is None:
                    found = self._shapes[key] = self._read_or_walk(table, regions)
                    if len(self._shapes) > SHAPES_LIMIT:
                        del self._shapes[next(iter(self._shapes))]
        return found

    def _read_or_walk(self, table: np.ndarray, regions: int) -> _Shape:
        """The shape's walk from the disk cache, or walked (and stored when it took `SHAPE_DISK_SECONDS`)."""
        named = f"{_SHAPE_FORMAT}\0{self.fingerprint}\0".encode() + table.tobytes()
        path = cache_dir("shapes") / f"{hashlib.sha256(named).hexdigest()[:40]}.shape"
        stored = read_pickle(path, _Shape, "walked again")  # a damaged entry: dropped
        if stored is not None:
            return stored
        start = time.perf_counter()
        found = self._walk_shape(table, regions)
        if time.perf_counter() - start >= SHAPE_DISK_SECONDS:
            write_pickle(path, found)
        return found

    def _walk_shape(self, table: np.ndarray, regions: int) -> _Shape:
        """Walk every token from region code 1 through ``table`` (codes: 0 dead, 1..``regions`` the region's
        states, above: exits) until it ends, dies or leaves: in the compiled core, the GIL released, where there
        is one."""
        if dfa_module.CORE is None:
            return self._walk_shape_in_python(table, regions)
        base, trie = dfa_module.CORE.walk_shape(np.ascontiguousarray(table, dtype=np.int32), regions, self.data,
                                                self.starts, self.ends, self.ids, self.by_first, self.first_starts,
                                                self.size)
        return _Shape(np.frombuffer(base, dtype=np.uint8),
                      _Trie(*(np.frombuffer(part, dtype=np.uint8 if k == 1 else np.int64)
                              for k, part in enumerate(trie))))

    def _walk_shape_in_python(self, table: np.ndarray, regions: int) -> _Shape:
        """`_walk_shape` with numpy, one vectorized step per byte position (the reference)."""
        rows = self.rows_starting_with(np.flatnonzero(table[1]))
        codes = np.ones(len(rows), dtype=table.dtype)
        offsets = self.starts[rows]
        bits = np.zeros(self.size, dtype=bool)
        left: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        while len(rows):
            codes = table[codes, self.data[offsets]]
            offsets += 1
            alive = codes != 0
            rows, codes, offsets = rows[alive], codes[alive], offsets[alive]
            ended = offsets == self.ends[rows]
            bits[self.ids[rows[ended]]] = True  # inside the region or on an exit: allowed either way
            out = ~ended & (codes > regions)
            left.append((rows[out], offsets[out], codes[out] - regions - 1))
            stay = ~ended & ~out
            rows, codes, offsets = rows[stay], codes[stay], offsets[stay]
        rows, offsets, exits = (np.concatenate([part[i] for part in left] or [np.zeros(0, dtype=np.int64)])
                                for i in range(3))
        return _Shape(np.packbits(bits, bitorder="little"), self._trie(rows, offsets, exits))

    def _trie(self, rows: np.ndarray, offsets: np.ndarray, nodes: np.ndarray) -> _Trie:
        """The bytes of ``rows`` from ``offsets`` on as a trie under root ``nodes`` (one per row)."""
        levels = []
        ends = self.ends[rows]
        while len(rows):
            keys = nodes * 256 + self.data[offsets]
            unique, nodes = np.unique(keys, return_inverse=True)
            offsets = offsets + 1
            ended = offsets == ends
            order = np.argsort(nodes[ended], kind="stable")
            levels.append(_Level(unique // 256, (unique % 256).astype(np.uint8), nodes[ended][order],
                                 self.ids[rows[ended]][order]))
            going = ~ended
            rows, offsets, ends, nodes = rows[going], offsets[going], ends[going], nodes[going]
        cut = [np.cumsum([0, *(len(level[k]) for level in levels)]) for k in (0, 2)]
        parts = ([level[k] for level in levels] for k in range(4))
        return _Trie(*(np.concatenate(part, dtype=np.uint8 if k == 1 else np.int64) if levels
                       else np.zeros(0, dtype=np.uint8 if k == 1 else np.int64) for k, part in enumerate(parts)),
                     *(c.astype(np.int64) for c in cut))

    def walk(self, dfa: LazyDFA, shape: _Shape, exits: list[int], ends: np.ndarray, width: int,
             found: np.ndarray) -> bool:
        """Set in ``found`` (bits over ids, little bit order) the tokens of ``shape``: those that end in the region
        or on an exit, those that left it and stay alive from the DFA state of their exit (``exits``, walked one
        trie level at a time), and ``ends`` (int32 ids: the end tokens of a final state); whether a bit below
        ``width`` is set. In the compiled core where there is one, in one call. Changes ``found``; builds the DFA
        rows it reaches (the table grows, the language does not)."""
        if dfa_module.CORE is not None:
            return dfa_module.CORE.first_mask(dfa, _ensure, shape.trie, shape.base, exits, ends, width, found)
        found[: len(shape.base)] |= shape.base
        _set(found, self._walk_ids(dfa, shape, exits))
        _set(found, ends)
        return _any_below(found, width)

    def _walk_ids(self, dfa: LazyDFA, shape: _Shape, exits: list[int]) -> np.ndarray:
        """`walk` in Python: the ids it would set."""
        states = np.array(exits, dtype=np.int32)
        found = []
        for level in shape.levels:
            before = states[level.parents]
            dfa.ensure(before)
            states = dfa.rows[dfa.slots[before], level.bytes]  # (the dead row is all dead: no need to drop them)
            found.append(level.ids[states[level.ends] != DEAD])
            if not states.any():
                break
        return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


_NO_IDS = np.zeros(0, dtype=np.int32)

# One matrix per tokenizer, shared by every regex compiled over it.
_VOCAB_BYTES: dict[str, _VocabBytes] = {}
_VOCAB_LOCK = threading.Lock()


def vocab_bytes(vocab: TokenVocab) -> _VocabBytes:
    """The `_VocabBytes` of ``vocab``, built on first use (a tenth of a second on a 150k vocabulary) and kept
    per tokenizer fingerprint, with the region shapes walked since."""
    found = _VOCAB_BYTES.get(vocab.fingerprint)
    if found is None:
        with _VOCAB_LOCK:
            found = _VOCAB_BYTES.get(vocab.fingerprint)
            if found is None:
                found = _VOCAB_BYTES[vocab.fingerprint] = _VocabBytes(vocab)
    return found


def _region(dfa: LazyDFA, state: int, successors: dict[int, tuple[int, ...]] | None = None
            ) -> tuple[np.ndarray, int, list[int]]:
    """The region of ``state`` as (canonical table, its number of region states, the DFA state of each exit): in
    the compiled core where there is one, else `_region_in_python` (``successors``: its memo of the rows'
    successors). Builds the rows it reads: the table grows, the language does not."""
    if dfa_module.CORE is None:
        return _region_in_python(dfa, state, successors)
    table, regions, exits = dfa_module.CORE.region(dfa, state, _ensure, REGION_DEPTH, REGION_LIMIT, WIDE_BYTES,
                                                   COUNT_DEPTH, COUNT_LIMIT)
    return np.frombuffer(table, dtype=np.int32).reshape(-1, 256), regions, exits


def _ensure(dfa: LazyDFA, states: list[int]) -> None:
    """`LazyDFA.ensure` of a list (the compiled region search's way to have rows built)."""
    dfa.ensure(np.array(states, dtype=np.int64))


def _region_in_python(dfa: LazyDFA, state: int, successors: dict[int, tuple[int, ...]] | None = None
                      ) -> tuple[np.ndarray, int, list[int]]:
    """`_region` with Python's loops (the reference).

    The region is ``state``, the states a byte away that loop on themselves (a string's characters, entered by
    its first one), and the states within `REGION_DEPTH` bytes that lead back to these. A state with no such
    loop that allows `WIDE_BYTES` bytes or more (a counted character) takes the states as wide within
    `COUNT_DEPTH` bytes, breadth first (up to `COUNT_LIMIT`); any other is a region alone. The table numbers
    them 1, 2, … in breadth-first order from ``state`` over bytes 0-255, and the states outside the region they
    lead to (exits) after them, in the order first met; 0 is dead. Equal tables mean equal walks for every token
    until it leaves the region, whatever the schema. Builds the rows it reads: the table grows, the language does not.
    """
    dfa.ensure(np.array([state]))
    members = {state}
    successors = {} if successors is None else successors  # state → the states its row leads to, by first byte
    explored: set[int] = set()

    def nexts(d: int) -> tuple[int, ...]:
        found = successors.get(d)
        if found is None:  # (a tuple: kept per state, it leaves the cyclic collector's lists, as the DFA's do)
            found = successors[d] = dfa.successors(d)
        return found

    after = [d for d in nexts(state) if d != DEAD]
    dfa.ensure(np.array(after or [DEAD]))
    loops = [d for d in [state, *after] if d in nexts(d)]
    if loops:  # a loop here or a byte away (a string's characters): look for the states around it that lead back
        members.update(loops)
        frontier, depth = [state], 0
        while frontier and depth < REGION_DEPTH and len(explored) < REGION_LIMIT:
            frontier = list(dict.fromkeys(d for d in frontier if d not in explored and d != DEAD))
            frontier = frontier[: REGION_LIMIT - len(explored)]
            if frontier:
                dfa.ensure(np.array(frontier))
            explored.update(frontier)
            frontier, depth = [s for d in frontier for s in nexts(d)], depth + 1
        grew = True
        while grew:  # the explored states that lead back to the loops through explored states
            before = len(members)
            members |= {d for d in explored if not members.isdisjoint(nexts(d))}
            grew = len(members) > before
    elif _width(dfa, state) >= WIDE_BYTES:  # a counted character: the counts ahead, and the bytes inside characters
        frontier = [state]
        for _ in range(COUNT_DEPTH):
            if not frontier or len(members) >= COUNT_LIMIT:
                break
            found = list(dict.fromkeys(s for d in frontier for s in nexts(d) if s != DEAD and s not in members))
            if not found:
                break
            dfa.ensure(np.array(found))
            frontier = [s for s in found if _width(dfa, s) >= WIDE_BYTES][: COUNT_LIMIT - len(members)]
            members.update(frontier)
    order, codes = [state], {DEAD: 0, state: 1}
    for d in order:  # (grows as it goes: breadth-first)
        for s in nexts(d):
            if s not in codes and s in members:
                codes[s] = len(order) + 1
                order.append(s)
    exits = [s for s in dict.fromkeys(s for d in order for s in nexts(d)) if s not in codes]
    codes.update((s, len(order) + 1 + k) for k, s in enumerate(exits))
    recode = np.zeros(max(codes) + 1, dtype=np.int32)  # DFA state → its code (only those the rows hold are read)
    recode[list(codes)] = list(codes.values())
    return np.concatenate([np.zeros((1, 256), dtype=np.int32), recode[dfa.table[order]]]), len(order), exits


def _width(dfa: LazyDFA, d: int) -> int:
    """How many bytes built row ``d`` allows. Changes nothing."""
    return int(np.count_nonzero(dfa.table[d]))


def _equivalent(table: np.ndarray, regions: int) -> np.ndarray:
    """Per code of the canonical ``table`` (see `_region`), a class: two region states share one exactly when
    every byte string takes them through states of equal classes to the same exit, or to death (the coarsest
    such partition, refined from "all region states alike"); dead and each exit are classes of their own. In the
    compiled core where there is one, else `_equivalent_in_python`. Changes nothing."""
    if dfa_module.CORE is None:
        return _equivalent_in_python(table, regions)
    return np.frombuffer(dfa_module.CORE.equivalent(table, regions), dtype=np.int64)


def _equivalent_in_python(table: np.ndarray, regions: int) -> np.ndarray:
    """`_equivalent` with numpy and a dict of signatures (the reference); classes are numbered past every code,
    in the order first met."""
    kinds = np.arange(max(int(table.max()), regions) + 1)
    kinds[1: regions + 1] = len(kinds)  # (past every code: no exit's class is reused)
    count = 1
    while True:
        classes: dict[bytes, int] = {}
        rows = kinds[table[1:]]
        found = [classes.setdefault(kinds[i].tobytes() + rows[i - 1].tobytes(), len(kinds) + len(classes))
                 for i in range(1, regions + 1)]
        kinds[1: regions + 1] = found
        if len(classes) == count:
            return kinds
        count = len(classes)


def pack(ids: np.ndarray, logits_width: int) -> np.ndarray:
    """Token ``ids`` as ceil(logits_width / 32) int32 words: bit j of word i ⇔ token 32*i+j (ids at or past the
    width left out)."""
    bits = np.zeros(32 * -(-logits_width // 32), dtype=bool)
    bits[ids[ids < logits_width]] = True
    # little bit order, little-endian words: bit j of word i is bits[32*i + j]
    return np.packbits(bits, bitorder="little").view("<i4")


def cached(cache: dict[Any, np.ndarray], key: Any, compute: Callable[[Any], np.ndarray],
           lock: threading.RLock) -> np.ndarray:
    """``cache[key]``, computed (under ``lock``, reentrant: a computation may read the cache) when first asked;
    threads sharing the cache get what one thread would."""
    found = cache.get(key)
    if found is None:
        with lock:  # re-read under the lock: another thread may have computed it meanwhile
            found = cache.get(key)
            if found is None:
                found = cache[key] = compute(key)
    return found


class TokenIndex:
    """A `LazyDFA` over one vocabulary, logits width and set of end tokens: per-state allowed token ids and
    packed masks. ``eos_token_ids`` are special tokens (no bytes) or the tokenizer's EOS, so no walk meets them.

    Each state's answers are computed when first asked and kept (one cache per
    answer), under a lock, so threads sharing an index get what one thread would.
    """

    def __init__(self, dfa: LazyDFA, vocab: TokenVocab, logits_width: int, eos_token_ids: tuple[int, ...]) -> None:
        self.dfa = dfa
        self.vocab = vocab
        self.logits_width = logits_width
        self.eos_token_ids = eos_token_ids
        self._eos_sorted = np.array(sorted(eos_token_ids), dtype=np.int32)
        self._vocab_bytes = vocab_bytes(vocab)
        self._bytes: dict[int, np.ndarray] = {}
        self._successors: dict[int, tuple[int, ...]] = {}  # state → the states its row leads to (rows never change)
        self._allowed: dict[int, np.ndarray] = {}
        self._packed: dict[int, np.ndarray] = {}
        self._unspellable: dict[int, UnspellableError] = {}  # state → why no token can follow (walked once)
        self._lock = threading.RLock()  # reentrant: the answers are built from a state's allowed bits

    def allowed_token_ids(self, state: int) -> np.ndarray:
        """Allowed token ids in ``state``, ascending, every EOS id included when final: a read-only int32 array.

        `UnspellableError` (naming the characters needed) if ``state`` is not final and no token the model
        can produce is allowed: the vocabulary cannot spell what comes next. Raised on every call for such a
        state, the first included (the same error: the vocabulary is walked once). Does not change the language; the first call per state walks the
        vocabulary and builds the DFA rows it reaches (the table grows, the language does not).
        """
        return self._cached(self._allowed, state, self._compute_allowed)

    def packed_mask(self, state: int) -> np.ndarray:
        """The allowed ids of ``state`` as ceil(logits_width / 32) int32 words: bit j of word i ⇔ token 32*i+j.

        Ids at or past ``logits_width`` are never set. Computed once per state; do
        not modify the returned array (callers copy it into their bitmask). `UnspellableError` as
        `allowed_token_ids`.
        """
        return self._cached(self._packed, state, self._compute_packed)

    def packed_if_computed(self, state: int) -> np.ndarray | None:
        """`packed_mask` of ``state`` if already computed (so ``state`` is one reached), else None. Changes
        nothing: the warm fill's read."""
        return self._packed.get(state)

    def computed(self, state: int) -> bool:
        """Whether ``state``'s answers are computed (its vocabulary walk done, or found unspellable). Changes
        nothing."""
        return state in self._bytes or state in self._unspellable

    def walk_tokens(self, state: int, token_ids: list[int]) -> list[int]:
        """The states after each of ``token_ids`` from ``state``, stopping before the first the language rejects
        (an EOS id, or one without text, included), in the compiled core: `TokenFSM.walk` where there is one.
        Builds the rows it reaches: the table grows, the language does not."""
        vocab = self._vocab_bytes
        return self.dfa.walk_tokens(state, token_ids, vocab.data, vocab.starts, vocab.ends, vocab.row_of)

    def _cached(self, cache: dict[int, np.ndarray], state: int, compute: Callable[[int], np.ndarray]) -> np.ndarray:
        return cached(cache, state, compute, self._lock)

    def _allowed_bytes(self, state: int) -> np.ndarray:
        """The allowed tokens, EOS ids included in a final state, as read-only bits over ids (little bit order)
        covering both the vocabulary and ``32 * words``. `UnspellableError` as `allowed_token_ids`."""
        error = self._unspellable.get(state)
        if error is not None:
            raise error.with_traceback(None)  # (a kept error raised again would grow its old traceback)
        return self._cached(self._bytes, state, self._compute_bytes)

    def _compute_bytes(self, state: int) -> np.ndarray:
        size = -(-max(len(self.vocab), 32 * -(-self.logits_width // 32)) // 8)
        found = np.zeros(size, dtype=np.uint8)
        if state != DEAD:
            vocab, dfa = self._vocab_bytes, self.dfa
            final = dfa.is_final(state)
            with gc_paused():
                table, regions, exits = _region(dfa, state, self._successors)
                table = self._from_loop(state, table, regions, found)
                spelled = vocab.walk(dfa, vocab.shape(table, regions), exits, self._eos_sorted if final else _NO_IDS,
                                     self.logits_width, found)
            if not spelled and not final:
                error = self._unspellable[state] = UnspellableError(state, dfa.next_characters(state))
                raise error
        found.setflags(write=False)
        return found

    def _from_loop(self, state: int, table: np.ndarray, regions: int, found: np.ndarray) -> np.ndarray:
        """Where ``state`` is a byte away from a loop whose row it shares but on a few first bytes (the first
        character of an object's key that may be any string, or one of its properties' names: each such object
        a region shape of its own), set in ``found`` the tokens of the loop's answer whose first byte the two rows
        agree on, and return ``table`` with those bytes dead, so that only the tokens starting with the others are
        walked: a few thousand, not the whole vocabulary. Elsewhere, ``table`` itself. Builds what the loop's
        answer needs (the table grows, the language does not)."""
        vocab = self._vocab_bytes
        if (regions < 2 or (table[1:] == 1).any() or 2 not in table[2]  # entered again, or code 2 not a loop
                or vocab.walked(table)):  # (then reading the walk costs less)
            return table
        kinds = _equivalent(table, regions)
        same = kinds[table[1]] == kinds[table[2]]  # the bytes on which both lead to states with the same future
        others = np.flatnonzero(~same)
        if (vocab.first_starts[others + 1] - vocab.first_starts[others]).sum() * 4 > len(vocab.first):
            return table  # too many tokens start otherwise: the region's own walk is as cheap
        loop = int(self.dfa.table[state, int(np.argmax(table[1] == 2))])
        try:
            answer = self._allowed_bytes(loop)
        except UnspellableError:
            return table
        agreed = vocab.starting_with_none_of(others)
        found[: len(agreed)] = answer[: len(agreed)] & agreed
        table = table.copy()
        table[1, same] = 0
        return table

    def _compute_allowed(self, state: int) -> np.ndarray:
        found = self._allowed_bytes(state)
        at = np.flatnonzero(found)  # only the bytes holding a bit are unpacked: most states allow a few tokens
        bits = np.unpackbits(found[at, None], axis=1, bitorder="little").astype(bool)
        ids = (at[:, None] * 8 + np.arange(8))[bits].astype(np.int32)  # (row-major: ascending)
        ids.setflags(write=False)
        return ids

    def _compute_packed(self, state: int) -> np.ndarray:
        width = self.logits_width
        found = self._allowed_bytes(state)
        if width % 32 == 0 and len(found) == width // 8:  # (no id at or past the width: the bits are the words)
            return found.view("<i4")
        words = found[: 4 * -(-width // 32)].copy()
        words[-(-width // 8):] = 0  # ids at or past the width: never allowed
        if width % 8:
            words[width // 8] &= (1 << (width % 8)) - 1
        return words.view("<i4")  # little bit order, little-endian words: bit j of word i is token 32*i + j


def _set(found: np.ndarray, ids: np.ndarray) -> None:
    """Set the bits of ``ids`` in ``found`` (little bit order). Changes ``found``."""
    np.bitwise_or.at(found, ids >> 3, np.left_shift(1, ids & 7).astype(np.uint8))


def _any_below(found: np.ndarray, width: int) -> bool:
    """Whether ``found`` (little bit order) has a bit set below ``width``. Changes nothing."""
    return bool(found[: width // 8].any() or (width % 8 and found[width // 8] & ((1 << (width % 8)) - 1)))
