"""The token index: which tokens a lazy DFA allows in each state, read off the whole vocabulary at once.

outlines-core's `Index` computes, at compile time, the transition of every token
from every state of the regex's DFA. On real JSON Schemas that takes seconds to
minutes (it is JSONSchemaBench's compile-time tail), and most of those states are
never visited by one generation. Here a state's answer is computed when decoding
first asks for it: the vocabulary is walked through the DFA at once with numpy,
one vectorized step per byte position, and tokens drop out as soon as they hit
the dead state; a state that allows few first bytes walks only the tokens that
start with them. The conventions are outlines-core's (EOS is allowed exactly in
final states), so the two can be compared state by state; `tests/automaton/test_automaton.py` does.
Where several tokens end the output (an instruct model's ``<|im_end|>`` beside the
tokenizer's EOS), each of them is allowed exactly in final states.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from structspec.automaton.dfa import DEAD, LazyDFA
from structspec.errors import UnspellableError
from structspec.vocab import TokenVocab


class _VocabBytes:
    """A vocabulary as a byte matrix, longest tokens first, for vectorized walks (EOS and special tokens left out)."""

    def __init__(self, vocab: TokenVocab) -> None:
        ids = [i for i, b in enumerate(vocab.token_bytes) if b and i != vocab.eos_token_id]
        ids.sort(key=lambda i: -len(vocab.token_bytes[i]))
        self.ids = np.array(ids, dtype=np.int64)
        self.lengths = np.array([len(vocab.token_bytes[i]) for i in ids], dtype=np.int64)
        self.matrix = np.zeros((len(ids), int(self.lengths.max(initial=1))), dtype=np.uint8)
        for row, i in enumerate(ids):
            self.matrix[row, : self.lengths[row]] = np.frombuffer(vocab.token_bytes[i], dtype=np.uint8)
        # The rows by first byte: a state that allows a few first bytes walks only their tokens.
        self.first = self.matrix[:, 0].copy()
        self.by_first = np.argsort(self.first, kind="stable")
        self.first_starts = np.searchsorted(self.first[self.by_first], np.arange(257))


_FEW_FIRST_BYTES = 16
"""A state allowing at most this many first bytes gathers their tokens by bucket; more, by one pass over all."""

# One matrix per tokenizer, shared by every regex compiled over it.
_VOCAB_BYTES: dict[str, _VocabBytes] = {}


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
        if vocab.fingerprint not in _VOCAB_BYTES:
            _VOCAB_BYTES[vocab.fingerprint] = _VocabBytes(vocab)
        self._vocab_bytes = _VOCAB_BYTES[vocab.fingerprint]
        self._allowed: dict[int, np.ndarray] = {}
        self._packed: dict[int, np.ndarray] = {}
        self._lock = threading.RLock()  # reentrant: a packed mask is built from the allowed ids

    def allowed_token_ids(self, state: int) -> np.ndarray:
        """Allowed token ids in ``state``, ascending, every EOS id included when final: a read-only int32 array.

        `UnspellableError` (naming the characters needed) if ``state`` is not final and no token the model
        can produce is allowed: the vocabulary cannot spell what comes next. Raised on every call for such a
        state, the first included. Does not change the language; the first call per state walks the
        vocabulary and builds the DFA rows it reaches (the table grows, the language does not).
        """
        return self._cached(self._allowed, state, self._compute_allowed)

    def packed_mask(self, state: int) -> np.ndarray:
        """The allowed ids of ``state`` as ceil(logits_width / 32) int32 words: bit j of word i ⇔ token 32*i+j.

        Ids at or past ``logits_width`` are never set. Computed once per state; do
        not modify the returned array (callers copy it into their bitmask).
        """
        return self._cached(self._packed, state, self._compute_packed)

    def _cached(self, cache: dict[int, np.ndarray], state: int, compute: Callable[[int], np.ndarray]) -> np.ndarray:
        return cached(cache, state, compute, self._lock)

    def _compute_allowed(self, state: int) -> np.ndarray:
        ids = self._walk_vocabulary(state)
        if state != DEAD and not self.dfa.is_final(state) and not (ids < self.logits_width).any():
            raise UnspellableError(state, self.dfa.next_characters(state))
        if self.dfa.is_final(state):
            ids = np.insert(ids, np.searchsorted(ids, self._eos_sorted), self._eos_sorted)
        ids.setflags(write=False)
        return ids

    def _compute_packed(self, state: int) -> np.ndarray:
        return pack(self.allowed_token_ids(state), self.logits_width)

    def _walk_vocabulary(self, state: int) -> np.ndarray:
        """Ids of the tokens (EOS aside) whose bytes stay alive from ``state``, sorted, as int32."""
        vocab, dfa = self._vocab_bytes, self.dfa
        dfa.ensure(np.array([state]))
        row = dfa.table[state]
        live = np.flatnonzero(row != DEAD)
        if len(live) <= _FEW_FIRST_BYTES:  # (structure: a brace, a quote, a key's first letter) only their tokens
            starts = vocab.first_starts
            rows = np.concatenate([vocab.by_first[starts[b]:starts[b + 1]] for b in live.tolist()] or [live])
        else:
            rows = np.flatnonzero(row[vocab.first] != DEAD)
        states = row[vocab.first[rows]]
        allowed = []
        for position in range(1, vocab.matrix.shape[1]):
            ended = vocab.lengths[rows] == position
            allowed.append(rows[ended])
            rows, states = rows[~ended], states[~ended]
            if not len(rows):
                break
            dfa.ensure(states)
            states = dfa.table[states, vocab.matrix[rows, position]]
            alive = states != DEAD
            rows, states = rows[alive], states[alive]
        allowed.append(rows)
        return np.sort(vocab.ids[np.concatenate(allowed)]).astype(np.int32)
