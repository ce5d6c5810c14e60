"""Prefix KV reuse: a prompt prefilled on a fixed grid of chunks, the KV of its whole chunks kept, so a later prompt
that starts with the same tokens computes only from its first chunk that differs.

Exact by construction, where the model is batch-invariant (`LM.batch_invariant`): every prompt is prefilled chunk
by chunk at absolute positions 0, `CHUNK`, 2 × `CHUNK`, … whether or not anything is reused, and a chunk's pass is
then the same call on the same inputs (its tokens and the KV of the chunks before it) in every prompt that starts
with those tokens, so the KV a prompt reuses is bit for bit what its own prefill would have computed. Elsewhere a
prompt is prefilled whole and nothing is reused.

A chunk's KV is keyed by the token ids up to its end (a hash chain: each key digests the one before it and the
chunk's ids), per model, in a store bounded in bytes that evicts the least recently used chunk first
(`PrefixCache`). A conversation reuses for free: each turn's prompt starts with the previous turn's prompt.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from array import array
from collections import OrderedDict
from typing import Any

from structspec.errors import OptionError
from structspec.models.protocol import KVCache, LanguageModel

CHUNK = 128
"""Tokens per prefill chunk. A whole chunk is one pass of the whole-prompt kernels (more than `WHOLE_ROWS` rows,
`structspec.models.invariance`); on a 2-core AVX-512 BF16 CPU, SmolLM2-135M in bfloat16 prefilled 600 tokens in
1.23× the time of one whole pass in chunks of 128, 2.0× in chunks of 64 (attention by row)."""
DEFAULT_BYTES = 256 * 2**20
"""The default bound of a model's `PrefixCache` (SmolLM2-135M's chunk in bfloat16: 2.9 MB; Qwen2.5-0.5B's: 1.5 MB)."""


class PrefixCache:
    """The KV of whole prompt chunks one model computed, by the hash chain of the token ids up to each chunk's end,
    at most ``max_bytes`` of it (least recently used chunks go first). ``max_bytes = 0`` turns reuse off; prompts
    are still prefilled on the grid, so outputs do not change."""

    def __init__(self, max_bytes: int = DEFAULT_BYTES) -> None:
        self.max_bytes = max_bytes
        self._chunks: OrderedDict[bytes, tuple[KVCache, int]] = OrderedDict()  # key -> (chunk, its bytes)
        self.bytes = 0  # held now
        self._lock = threading.Lock()  # calls on one model from several threads share its cache

    @property
    def max_bytes(self) -> int:
        return self._max_bytes

    @max_bytes.setter
    def max_bytes(self, value: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise OptionError(f"a prefix cache's max_bytes must be an int ≥ 0, got {value!r}; 0 turns reuse off")
        self._max_bytes = value
        if hasattr(self, "_chunks"):  # (not while __init__ sets the first bound)
            with self._lock:
                self._evict()

    def __len__(self) -> int:
        """Chunks held."""
        return len(self._chunks)

    def lookup(self, keys: list[bytes]) -> list[KVCache]:
        """The held chunks of ``keys`` from the first on, up to the first that is not held; marks them recently
        used (changes the LRU order only)."""
        found = []
        with self._lock:
            for key in keys:
                if key not in self._chunks:
                    break
                self._chunks.move_to_end(key)
                found.append(self._chunks[key][0])
        return found

    def put(self, key: bytes, chunk: KVCache) -> None:
        """Hold ``chunk`` (a chunk's slots, `KVCache.copy_slots`) under ``key``, evicting the least recently used
        chunks past `max_bytes` (changes the cache). A chunk larger than the bound is not held."""
        size = chunk.nbytes
        with self._lock:
            if key in self._chunks or size > self.max_bytes:
                return
            self._chunks[key] = (chunk, size)
            self.bytes += size
            self._evict()

    def clear(self) -> None:
        """Forget every chunk (changes the cache)."""
        with self._lock:
            self._chunks.clear()
            self.bytes = 0

    def _evict(self) -> None:
        """Drop least recently used chunks until the bound holds (the caller holds the lock)."""
        while self.bytes > self.max_bytes:
            _, (_, size) = self._chunks.popitem(last=False)
            self.bytes -= size


_CACHES: weakref.WeakKeyDictionary[Any, PrefixCache] = weakref.WeakKeyDictionary()  # per model, while it lives


def prefix_cache(lm: LanguageModel) -> PrefixCache:
    """``lm``'s prefix cache, made (empty, `DEFAULT_BYTES`) on first use; set its ``max_bytes`` to bound it, 0 to
    turn reuse off. Changes nothing else."""
    if lm not in _CACHES:
        _CACHES[lm] = PrefixCache()
    return _CACHES[lm]


def clear_prefix_caches() -> None:
    """Forget every model's reusable prompt KV (changes the caches; their bounds stay)."""
    for cache in list(_CACHES.values()):
        cache.clear()


def chunk_keys(token_ids: list[int]) -> list[bytes]:
    """The key of each whole `CHUNK` of ``token_ids``: a digest of the previous key and the chunk's ids, so a key
    names every token up to its chunk's end. Changes nothing."""
    keys, key = [], b""
    for start in range(0, len(token_ids) - CHUNK + 1, CHUNK):
        key = hashlib.blake2b(key + array("q", token_ids[start:start + CHUNK]).tobytes(), digest_size=16).digest()
        keys.append(key)
    return keys


def on_grid(lm: LanguageModel) -> bool:
    """Whether ``lm`` prefills prompts on the chunk grid, reusing held chunks: where every pass gives a row what it
    gets alone (`LanguageModel.batch_invariant`) and its cache has no sliding-window layers (`batchable`)."""
    return lm.batch_invariant and lm.batchable


def prefill_prompt(lm: LanguageModel, token_ids: list[int], cache: KVCache) -> int:
    """Feed ``token_ids`` into the empty ``cache`` (changes it, and ``lm``'s `prefix_cache`): on a model
    `on_grid`, chunk by chunk on the grid, the leading chunks held in its prefix cache copied in, and every whole
    chunk it computes held there; elsewhere in one pass. Returns how many tokens were reused."""
    if not on_grid(lm):
        lm.forward(token_ids, cache)
        return 0
    store = prefix_cache(lm)
    keys = chunk_keys(token_ids) if store.max_bytes else []
    found = store.lookup(keys)
    if found:
        cache.append_slots(found)
    reused = len(found) * CHUNK
    for start in range(reused, len(token_ids), CHUNK):
        end = start + CHUNK
        lm.forward(token_ids[start:end], cache)
        if end <= len(token_ids) and keys:
            store.put(keys[start // CHUNK], cache.copy_slots(start, end))
    return reused
