"""Token ↔ bytes for any Hugging Face tokenizer, and its fingerprint.

The token FSM works on bytes, so every token id needs the exact bytes it adds to
the output. Two tokenizer families spell tokens differently:

* byte-level BPE (GPT-2, Llama 3, SmolLM2, Qwen): each byte is a printable
  stand-in character (``Ġ`` for a space), undone with the inverse byte map;
* SentencePiece-style (Llama 2, Gemma): ``▁`` is a space and ``<0xNN>``
  byte-fallback tokens are single raw bytes.

Non-special added tokens are spelled the same way as the rest, from the string
the decoder receives. Special tokens (BOS, chat markers, EOS) produce no output
text and get no bytes, unless a spec places them (`TokenVocab.with_symbols`): then each
spells a *symbol*, two bytes no UTF-8 text holds, which only that token id spells.
"""

from __future__ import annotations

import hashlib
import re
import weakref
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any

from structspec.errors import VocabularyMismatchError

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")

SYMBOLS = (0xDE00, 0xDFFF)
"""The code points a regex names special-token symbols by (lone low surrogates, which no text holds): symbol
``k`` is ``chr(SYMBOLS[0] + k)``. A character class never includes them, so free text never spells one."""
_SYMBOL_LEAD = 0xF8  # bytes 0xF8-0xFF begin no UTF-8 character: a symbol's first byte


def symbol_bytes(code: int) -> bytes:
    """The two bytes symbol ``code`` (a code point in `SYMBOLS`) stands for in the byte automaton."""
    k = code - SYMBOLS[0]
    return bytes([_SYMBOL_LEAD + (k >> 6), 0x80 + (k & 63)])


@lru_cache(maxsize=1)
def _byte_level_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes→printable-unicode table."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars)}


@dataclass(frozen=True)
class TokenVocab:
    """The bytes of every token id of one tokenizer.

    ``token_bytes[i]`` is ``None`` for special tokens, which never appear in
    constrained output; EOS is handled by the FSM itself. ``eos_token_id`` is the
    tokenizer's own; an FSM may end on other special tokens too (`TokenFSM.eos_token_ids`).
    """

    token_bytes: tuple[bytes | None, ...]
    eos_token_id: int
    fingerprint: str
    shown: tuple[tuple[int, bytes], ...] = ()  # (token id, its text) for the tokens that spell a symbol

    def __len__(self) -> int:
        return len(self.token_bytes)

    def spell(self, token_ids: list[int]) -> bytes:
        """The bytes a token sequence adds to the automaton's input (special tokens add none, symbols theirs)."""
        return b"".join(self.token_bytes[t] or b"" for t in token_ids)

    def text_bytes(self, token_ids: list[int]) -> bytes:
        """The output text's bytes: as `spell`, with each symbol token written as its own text."""
        shown = dict(self.shown)
        return b"".join(shown.get(t) or self.token_bytes[t] or b"" for t in token_ids)

    def decode(self, token_ids: list[int]) -> str:
        """Text of a token sequence (special tokens omitted, symbol tokens as their text)."""
        return self.text_bytes(token_ids).decode("utf-8", "replace")

    def with_symbols(self, specials: tuple[tuple[int, str], ...]) -> TokenVocab:
        """A new vocabulary in which ``specials[k]`` (a token id and its text) spells symbol ``k``
        (`symbol_bytes`) and shows as its text; tokens holding a byte from 0xF8 up (no UTF-8 text has one, so
        no regex allowed them before) spell nothing, so only these ids spell a symbol. Kept per tokenizer and
        tokens: each is a copy of the whole vocabulary. Changes nothing here."""
        key = (self.fingerprint, specials)
        if key not in _WITH_SYMBOLS:
            _WITH_SYMBOLS[key] = self._with_symbols(specials)
        return _WITH_SYMBOLS[key]

    def _with_symbols(self, specials: tuple[tuple[int, str], ...]) -> TokenVocab:
        token_bytes = [None if b and max(b) >= _SYMBOL_LEAD else b for b in self.token_bytes]
        for k, (token_id, _) in enumerate(specials):
            token_bytes[token_id] = symbol_bytes(SYMBOLS[0] + k)
        named = repr(specials).encode("utf-8", "surrogatepass")
        return TokenVocab(tuple(token_bytes), self.eos_token_id,
                          hashlib.sha256(self.fingerprint.encode() + named).hexdigest()[:32],
                          tuple((i, text.encode()) for i, text in specials))

    @cached_property
    def single_byte_tokens(self) -> dict[int, int]:
        """byte → the lowest token id spelling exactly that byte (EOS excluded): for walking an FSM byte by byte."""
        out: dict[int, int] = {}
        for i, b in enumerate(self.token_bytes):
            if b is not None and len(b) == 1 and i != self.eos_token_id:
                out.setdefault(b[0], i)
        return out

    @cached_property
    def ids_by_bytes(self) -> dict[bytes, int]:
        """bytes → the lowest token id spelling exactly them (EOS and special tokens excluded)."""
        return {b: ids[0] for b, ids in self.outlines_map().items()}

    def outlines_map(self) -> dict[bytes, list[int]]:
        """bytes → token ids, the form `outlines_core.Vocabulary` takes (EOS excluded)."""
        out: dict[bytes, list[int]] = {}
        for i, b in enumerate(self.token_bytes):
            if b and i != self.eos_token_id:
                out.setdefault(b, []).append(i)
        return out


_WITH_SYMBOLS: dict[tuple[str, tuple[tuple[int, str], ...]], TokenVocab] = {}


def is_byte_level(tokenizer: Any) -> bool:
    """Whether the tokenizer spells bytes GPT-2 style (a ByteLevel decoder)."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    if decoder is None:
        return False
    # The decoder's own JSON (a Sequence lists its parts), not the whole tokenizer's: that spells the
    # vocabulary and merges, and reading it cost 0.2 s per call on Qwen's 151k tokens.
    return '"ByteLevel"' in decoder.__getstate__().decode()


# id(tokenizer) → (a weak reference to it, what its vocabulary was read from, the vocabulary): a serving engine
# compiles each request's spec with the same tokenizer object, and reading 150k tokens takes a second.
_FROM_TOKENIZER: dict[int, tuple[weakref.ref, tuple, TokenVocab]] = {}


def _read_from(tokenizer: Any) -> tuple:
    """What `vocab_from_tokenizer` reads that can change on a tokenizer object: its size, EOS, special ids and
    added tokens (adding tokens changes the size). Changes nothing."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return (len(tokenizer), tokenizer.eos_token_id, tuple(tokenizer.all_special_ids),
            tuple((i, str(tok), getattr(tok, "special", True)) for i, tok in sorted(added.items())))


def vocab_from_tokenizer(tokenizer: Any) -> TokenVocab:
    """The byte vocabulary of a Hugging Face tokenizer (fast or slow): read once per tokenizer object and kept
    while the object lives and its size, EOS, special and added tokens stay the same. Changes nothing."""
    if tokenizer.eos_token_id is None:
        raise VocabularyMismatchError("the tokenizer has no eos_token_id; set tokenizer.eos_token first")
    read_from = _read_from(tokenizer)
    kept = _FROM_TOKENIZER.get(id(tokenizer))
    if kept is not None and kept[0]() is tokenizer and kept[1] == read_from:
        return kept[2]
    vocab = _read_vocab(tokenizer)
    try:
        # (the entry goes with the tokenizer: a new object at the same id must not find it)
        ref = weakref.ref(tokenizer, lambda _, key=id(tokenizer): _FROM_TOKENIZER.pop(key, None))
    except TypeError:  # an object without weak references: read every time
        return vocab
    _FROM_TOKENIZER[id(tokenizer)] = (ref, read_from, vocab)
    return vocab


def _read_vocab(tokenizer: Any) -> TokenVocab:
    size = max(tokenizer.get_vocab().values()) + 1
    special = set(tokenizer.all_special_ids)
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    special |= {i for i, tok in added.items() if getattr(tok, "special", True)}
    byte_level = is_byte_level(tokenizer)
    table = _byte_level_decoder()

    # Spell each token from the string its decoder receives, added tokens included:
    # that is the normalized form ("▁<tool>" for a normalized "<tool>"), and the
    # decoder maps "Ġ"/"▁" in it to a space whether the token is added or not.
    token_bytes: list[bytes | None] = [None] * size
    for i, token in enumerate(tokenizer.convert_ids_to_tokens(list(range(size)))):
        if i in special or token is None:
            continue
        if byte_level:
            try:
                token_bytes[i] = bytes(table[c] for c in token)
            except KeyError:  # not a byte-level spelling: the ByteLevel decoder keeps it as text
                token_bytes[i] = token.encode("utf-8")
        elif m := _BYTE_FALLBACK.match(token):
            token_bytes[i] = bytes([int(m.group(1), 16)])
        else:
            token_bytes[i] = token.replace("▁", " ").encode("utf-8")

    h = hashlib.sha256(str(tokenizer.eos_token_id).encode())
    for i, b in enumerate(token_bytes):
        n = -1 if b is None else len(b)  # length prefix keeps the encoding unambiguous
        h.update(i.to_bytes(4, "little") + n.to_bytes(4, "little", signed=True) + (b or b""))
    return TokenVocab(tuple(token_bytes), tokenizer.eos_token_id, h.hexdigest()[:32])
