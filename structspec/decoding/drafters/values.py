"""Guesses at how a value being written goes on, read off the document: lookahead's value-start siblings."""

from __future__ import annotations

import re

# A value being written at the end of the output: the scalar value before it if any (``Elena Vasquez`` in
# ``"name":"Elena Vasquez","title":"Sen``), its key (``title``) and what of it is written (``Sen``).
_OPENING = re.compile(
    rb'(?::(?:"((?:[^"\\]|\\.)+)"|(-?[0-9][0-9.eE+-]*))[]},{[]*)?"([^"\\]*)":"?([^"\\,{}[\]:]*)$')
_SKIPPED = re.compile(rb"(?:[\s|,;:.\-()/$#*]|\xe2\x82\xac|\xc2\xa3)*")  # separators, currency signs
_WORDS = re.compile(rb"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")  # of a key: snake_case, camelCase, kebab-case
VALUE_START = 32  # bytes of the document `value_starts` reads for one guess, cut back to a word's end
LABEL_GAP = 20  # the most bytes between a key's word and the colon after it (``Tracking number: 1Z...``)


def value_starts(text: bytes, most: int = 3) -> list[bytes]:
    """Where ``text`` (a prompt and the output so far) ends inside a value's first bytes (or where it opens),
    up to ``most`` guesses at how it goes on, from the document, best first: the document's text after the
    value before it (documents list fields in the order schemas do: ``Elena Vasquez | Senior Procurement
    Manager``), then after the words of the value's key (``Tracking number: 1Z999...`` for ``tracking_number``,
    after the colon where one follows), each where the document goes on as the value's written bytes do; then,
    once some are written, the first word the document starts with them after the value before, and the first
    of all (``"date":"2`` → ``024-03-14``).
    Separators and currency signs skipped; each at most `VALUE_START` bytes, ended at ``|`` or a line's end,
    else at a word's end where one fits. Changes nothing."""
    found = _OPENING.search(text, max(len(text) - 256, 0))
    if found is None:
        return []

    def after_label(at: int) -> int:  # past the colon of a label that follows (``. Vendor: Müller``), if any
        colon = text.find(b":", at, at + LABEL_GAP)
        return colon + 1 if colon >= 0 else at

    starts: list[int] = []
    value, written = found.group(1) or found.group(2), found.group(4)
    before = -1  # where the value before ends in the document
    if value is not None:  # (its first occurrence before the output's copy of it)
        at = text.find(value, 0, found.start() + 2)
        if at >= 0:
            before = at + len(value)
            starts.append(after_label(before))
    for word in dict.fromkeys(w.lower() for w in _WORDS.findall(found.group(3)) if len(w) >= 3):
        # a label, not a list of names (``fields: status, weight_kg``) nor a JSON key (``"status":``)
        label = re.compile(rb"(?<![A-Za-z0-9_])" + re.escape(word) + rb'(?![A-Za-z0-9_",.;])', re.IGNORECASE)
        starts += [after_label(match.end()) for match in label.finditer(text, 0, found.start())]
    if written:  # a word the document starts so, the first after the value before, then the first of all
        word = re.compile(rb"(?<![A-Za-z0-9])" + re.escape(written))
        starts += [match.start() for match in (word.search(text, max(before, 0), found.start()),
                                               word.search(text, 0, found.start())) if match]
    out: list[bytes] = []
    for at in starts:
        at = _SKIPPED.match(text, at).end()
        if text[at : at + len(written)] != written:
            continue
        rest = re.split(rb"[|\n]", text[at + len(written) : at + VALUE_START], maxsplit=1)[0]  # a field ends there
        space = rest.rfind(b" ") if len(rest) == VALUE_START - len(written) else -1  # (cut: end at a word's end)
        guess = _SKIPPED.sub(b"", (rest[:space] if space > 0 else rest)[::-1], count=1)[::-1]  # (trailing ones)
        if guess and guess not in out:
            out.append(guess)
            if len(out) == most:
                break
    return out
