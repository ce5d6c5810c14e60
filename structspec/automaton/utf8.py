"""Characters as bytes: code point ranges → UTF-8 byte-range sequences, and the Unicode classes.

A byte automaton matches a character class by the byte sequences of its UTF-8
encodings. Ranges here are tuples of inclusive ``(lo, hi)`` code points; the
surrogates are never in them (they have no UTF-8 encoding, so nothing matches them), except that a literal
low surrogate in `structspec.vocab.SYMBOLS` matches its special-token symbol's two bytes (`symbol_bytes`).
"""

from __future__ import annotations

import re._constants as C  # the parser's names for \d, \s, \w
import unicodedata
from functools import cache

from structspec.vocab import SYMBOLS, symbol_bytes

Ranges = tuple[tuple[int, int], ...]

MAX_CODEPOINT = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)


def _utf8_sequences(lo: int, hi: int) -> list[list[tuple[int, int]]]:
    """Byte-range sequences whose concatenations are exactly the UTF-8 encodings of ``lo..hi``.

    Splits the range until every piece has one encoded length and aligned
    continuation bytes; then each byte position ranges independently.
    """
    out, todo = [], [(lo, hi)]
    while todo:
        lo, hi = todo.pop()
        if SYMBOLS[0] <= lo <= SYMBOLS[1]:  # (one symbol: `char_ranges` makes such a range of a literal alone)
            out.append([(b, b) for b in symbol_bytes(lo)])
            continue
        bound = next((b for b in (0x7F, 0x7FF, 0xFFFF) if lo <= b < hi), None)
        if bound is not None:
            todo += [(lo, bound), (bound + 1, hi)]
            continue
        for i in range(1, len(chr(lo).encode())):
            low_bits = (1 << (6 * i)) - 1
            if lo & ~low_bits == hi & ~low_bits:
                continue
            if lo & low_bits:  # lo is not at the start of a block of 2^(6i) code points
                todo += [(lo, lo | low_bits), ((lo | low_bits) + 1, hi)]
                break
            if hi & low_bits != low_bits:  # hi is not at the end of one
                todo += [(lo, (hi & ~low_bits) - 1), (hi & ~low_bits, hi)]
                break
        else:
            out.append(list(zip(chr(lo).encode(), chr(hi).encode())))
    return out


@cache
def byte_sequences(ranges: Ranges) -> list[list[tuple[int, int]]]:
    """The UTF-8 byte-range sequences of a character class (classes recur: computed once)."""
    return [seq for lo, hi in ranges for seq in _utf8_sequences(lo, hi)]


@cache
def byte_automaton(ranges: Ranges) -> tuple[int, tuple[tuple[int, int, int, int], ...]]:
    """A small automaton reading one character of ``ranges`` in UTF-8: how many states it has between its start
    (0) and its end (1), numbered from 2, and its edges (from, first byte, last byte, to). The byte sequences
    share the states of equal rests (most multi-byte ones end in the same continuation bytes): a class of all
    but a few characters takes 8 inner states instead of 19. Computed once per class."""
    rests: dict[tuple[tuple[int, int], ...], int] = {(): 1}  # bytes still to read → the state that reads them
    edges = []
    for sequence in byte_sequences(ranges):
        at = 0
        for i, (a, b) in enumerate(sequence):
            rest = tuple(sequence[i + 1:])
            then = rests.get(rest)
            if then is not None:  # (that rest is read from there already: join it)
                edges.append((at, a, b, then))
                break
            then = rests[rest] = len(rests) + 1
            edges.append((at, a, b, then))
            at = then
    return len(rests) - 1, tuple(edges)


@cache
def normalize(ranges: Ranges) -> Ranges:
    """Sorted, merged code point ranges without the surrogates (classes recur: computed once per class)."""
    merged: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    out = []
    for lo, hi in merged:
        for a, b in ((lo, min(hi, _SURROGATES[0] - 1)), (max(lo, _SURROGATES[1] + 1), hi)):
            if a <= b:
                out.append((a, b))
    return tuple(out)


@cache
def complement(ranges: Ranges) -> Ranges:
    """Every code point not in ``ranges`` (surrogates aside)."""
    out, nxt = [], 0
    for lo, hi in normalize(ranges):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CODEPOINT:
        out.append((nxt, MAX_CODEPOINT))
    return normalize(tuple(out))


# Unicode's White_Space property, which Rust's regex (outlines-core) reads \s as.
_WHITE_SPACE = ((0x09, 0x0D), (0x20, 0x20), (0x85, 0x85), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
                (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000))


@cache
def category(name: C._NamedIntConstant) -> Ranges:
    """Code point ranges of ``\\d``, ``\\s``, ``\\w`` (and negations), as Rust's regex reads them."""
    negated = {C.CATEGORY_NOT_DIGIT: C.CATEGORY_DIGIT, C.CATEGORY_NOT_SPACE: C.CATEGORY_SPACE,
               C.CATEGORY_NOT_WORD: C.CATEGORY_WORD}
    if name in negated:
        return complement(category(negated[name]))
    if name is C.CATEGORY_SPACE:
        return _WHITE_SPACE
    # \d is Nd; \w is letters, marks, Nd, Nl, Pc and the two joiners (Python's own \w differs).
    wanted = {"Nd"} if name is C.CATEGORY_DIGIT else {"Nd", "Nl", "Mn", "Mc", "Me", "Pc"}
    letters = name is C.CATEGORY_WORD
    ranges: list[list[int]] = []
    for cp in range(MAX_CODEPOINT + 1):
        kind = unicodedata.category(chr(cp))
        if kind in wanted or (letters and (kind[0] == "L" or cp in (0x200C, 0x200D))):
            if ranges and ranges[-1][1] == cp - 1:
                ranges[-1][1] = cp
            else:
                ranges.append([cp, cp])
    return tuple((lo, hi) for lo, hi in ranges)
