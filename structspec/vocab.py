"""Token ↔ bytes for any Hugging Face tokenizer, and its fingerprint.

The token FSM works on bytes, so every token id needs the exact bytes it adds to
the output. Two tokenizer families spell tokens differently:

* byte-level BPE (GPT-2, Llama 3, SmolLM2, Qwen): each byte is a printable
  stand-in character (``Ġ`` for a space), undone with the inverse byte map;
* SentencePiece-style (Llama 2, Gemma): ``▁`` is a space and ``<0xNN>``
  byte-fallback tokens are single raw bytes.

Non-special added tokens are spelled the same way as the rest, from the string
the decoder receives. Special tokens (BOS, chat markers, EOS) produce no output
text and get no bytes.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any

from structspec.errors import VocabularyMismatchError

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


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

    def __len__(self) -> int:
        return len(self.token_bytes)

    def spell(self, token_ids: list[int]) -> bytes:
        """The bytes a token sequence adds to the output (special tokens add none)."""
        return b"".join(self.token_bytes[t] or b"" for t in token_ids)

    def decode(self, token_ids: list[int]) -> str:
        """Text of a token sequence (special tokens omitted)."""
        return self.spell(token_ids).decode("utf-8", "replace")

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


def is_byte_level(tokenizer: Any) -> bool:
    """Whether the tokenizer spells bytes GPT-2 style (a ByteLevel decoder)."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    if decoder is None:
        return False
    # The decoder's own JSON (a Sequence lists its parts), not the whole tokenizer's: that spells the
    # vocabulary and merges, and reading it cost 0.2 s per call on Qwen's 151k tokens.
    return '"ByteLevel"' in decoder.__getstate__().decode()


def vocab_from_tokenizer(tokenizer: Any) -> TokenVocab:
    """Build the byte vocabulary of a Hugging Face tokenizer (fast or slow)."""
    if tokenizer.eos_token_id is None:
        raise VocabularyMismatchError("the tokenizer has no eos_token_id; set tokenizer.eos_token first")
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
