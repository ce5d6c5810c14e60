"""JSON Schema patterns (ECMA-262 regexes) → regexes that mean the same and fit inside a JSON string.

outlines-core puts a schema pattern between the quotes as it is and reads
``\\d`` and ``\\w`` as Unicode classes; these functions give classes their ECMA
meaning, keep wildcards off the characters a JSON string holds only escaped,
and read ``patternProperties`` patterns, which search rather than match.
"""

from __future__ import annotations

import re
from functools import lru_cache

_ECMA = {"d": "0-9", "w": "a-zA-Z0-9_"}
# What a JSON string holds only escaped (outlines-core's string also leaves out U+007F-U+009F).
_JSON_UNSAFE = "\"\\\\\\x00-\\x1F\\x7F-\\x9F"
_UNSAFE_CHARS = ['"', "\\"] + [chr(c) for c in (*range(0x20), *range(0x7F, 0xA0))]
# ECMA-262 counts U+FEFF as \s, and . stops at the line terminators U+2028 and U+2029.
_NEGATED = {"\\S": "\\s\ufeff", "\\W": "a-zA-Z0-9_", "\\D": "0-9", ".": "\u2028\u2029"}
_KEY_CHAR = f"[^{_JSON_UNSAFE}]"
# A pattern that is one character (class) repeated, as json_safe_pattern leaves it.
_REPEATED_CLASS = re.compile(r"\((?P<char>\[(?:\\.|[^\]\\])*\]|\\.|[a-zA-Z0-9 ])(?P<times>[+*])\)")


def ecma_classes(pattern: str) -> str:
    """Give ``\\d`` and ``\\w`` their JSON Schema (ECMA-262) meaning: ASCII only.

    outlines-core's regex engine reads them as Unicode classes (``\\d`` matches
    ``۴``), which would make schema patterns and formats (``date``: ``\\d{4}-…``)
    looser than JSON Schema says.
    """
    out, in_class, i = [], False, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            esc = pattern[i + 1]
            if esc in _ECMA:
                out.append(_ECMA[esc] if in_class else f"[{_ECMA[esc]}]")
            else:
                out.append(c + esc)
            i += 2
            continue
        in_class = (in_class and c != "]") or c == "["
        out.append(c)
        i += 1
    return "".join(out)


def json_safe_pattern(pattern: str) -> str | None:
    """``pattern`` narrowed to characters a JSON string holds unescaped, or None if it needs escaped ones.

    outlines-core puts a schema pattern between the quotes as it is, so ``.`` or
    ``[^a]`` would match a raw quote or newline and break the JSON. Wildcards and
    negated classes exclude those characters here, ``\\s`` means a space; a pattern
    that asks for one of them (a literal quote, ``\\n``) gets None. Anchors are left
    out (the match is always whole) and the result is a group.
    """
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "[":
            j = _class_end(pattern, i)
            atom, i = pattern[i : j + 1], j + 1
            if not atom.startswith("[^"):
                atom = atom.replace("\\s", " ")
        elif c == "\\":
            size = {"x": 4, "u": 6}.get(pattern[i + 1 : i + 2], 2)
            atom, i = pattern[i : i + size], i + size
        elif c == "." or c in _UNSAFE_CHARS:
            atom, i = c, i + 1
        elif c in "^$":  # the regex matches whole strings: anchors are implied
            i += 1
            continue
        else:  # a literal or an operator
            out.append(c)
            i += 1
            continue
        unsafe = _unsafe(atom)
        if unsafe is None:
            return None
        if not unsafe:
            out.append(atom)
        elif atom == "\\s":
            out.append(" ")
        elif atom in _NEGATED:
            out.append(f"[^{_NEGATED[atom]}{_JSON_UNSAFE}]")
        elif atom.startswith("[^"):
            out.append(atom[:-1] + _JSON_UNSAFE + "]")
        else:
            return None
    return "(" + "".join(out) + ")"  # a group: outlines-core puts quotes around it as it is


@lru_cache(maxsize=4096)
def _unsafe(atom: str) -> bool | None:
    """Whether the pattern atom ``atom`` matches a character a JSON string holds only escaped; None if it is no
    regex. (Memoized: schemas repeat their atoms, and each answer costs a match per unsafe character.)"""
    try:
        return any(re.fullmatch(atom, u) for u in _UNSAFE_CHARS)
    except re.error:
        return None


def with_lengths(safe: str, min_length: int, max_length: int | None) -> str | None:
    """A `json_safe_pattern` result that repeats one character (class), counted from ``min_length`` to
    ``max_length`` (None: no limit); None for any other pattern, where lengths cannot be folded in.
    `ValueError` if no string of the pattern is short enough."""
    repeated = _REPEATED_CLASS.fullmatch(safe)
    if repeated is None:
        return None
    low = max(min_length, 1 if repeated["times"] == "+" else 0)
    if max_length is not None and max_length < low:
        raise ValueError(f"it needs at least {low} characters and maxLength is {max_length}")
    return f"{repeated['char']}{{{low},{'' if max_length is None else max_length}}}"


def key_regex(pattern: str) -> str | None:
    """The property names (unescaped JSON string content) in which ``pattern`` finds a match, or None.

    JSON Schema patterns search: an unanchored side may extend by any characters.
    Anchors anywhere but at the ends of a top-level branch get None, as do patterns
    that need characters a name holds only escaped (narrowing would leave names out).
    """
    out = []
    for branch in _branches(pattern):
        head, tail = branch.startswith("^"), branch.endswith("$") and not branch.endswith("\\$")
        body = branch[head : len(branch) - tail]
        if _branches(body, "^$") != [body]:  # an anchor left inside
            return None
        safe = json_safe_pattern(ecma_classes(body))
        if safe is None:
            return None
        out.append(("" if head else f"{_KEY_CHAR}*") + safe + ("" if tail else f"{_KEY_CHAR}*"))
    return "(" + "|".join(out) + ")"


def whole(pattern: str) -> bool:
    """Whether matching ``pattern`` whole (as the translation does) finds what JSON Schema's search finds: each
    top-level branch anchored (or opened by ``.*``) at both ends."""
    return all((b.startswith("^") or b.startswith(".*")) and ((b.endswith("$") and not b.endswith("\\$"))
                                                             or b.endswith(".*")) for b in _branches(pattern))


def search(pattern: str, name: str) -> bool:
    """Whether ``pattern`` finds a match in ``name`` (an unreadable pattern counts as a match)."""
    try:
        return re.search(ecma_classes(pattern), name) is not None
    except re.error:
        return True


def disjoint_patterns(p: str, q: str) -> bool:
    """Whether no name matches both: anchored at the start on literal prefixes that part ways,
    or on first characters from disjoint sets."""
    a, b = _literal_prefix(p), _literal_prefix(q)
    if a is not None and b is not None and not a.startswith(b) and not b.startswith(a):
        return True
    first_p, first_q = _first_chars(p), _first_chars(q)
    return first_p is not None and first_q is not None and not first_p & first_q


def _branches(pattern: str, at: str = "|") -> list[str]:
    """``pattern`` split at the characters ``at`` outside groups, classes and escapes."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 1
        elif c == "[":
            i = _class_end(pattern, i)
        elif c in "()":
            depth += 1 if c == "(" else -1
        elif c in at and (depth == 0 or at != "|"):
            parts.append(pattern[start:i])
            start = i + 1
        i += 1
    return parts + [pattern[start:]]


def _class_end(pattern: str, i: int) -> int:
    """The index of the ``]`` closing the character class that opens at ``i``."""
    j = i + 1 + (pattern[i + 1 : i + 2] == "^")
    j += pattern[j : j + 1] == "]"
    while j < len(pattern) and pattern[j] != "]":
        j += 2 if pattern[j] == "\\" else 1
    return j


def _literal_prefix(pattern: str) -> str | None:
    """The text every match of a ``^``-anchored pattern without top-level ``|`` starts with (None: unknown)."""
    if not pattern.startswith("^") or len(_branches(pattern)) > 1:
        return None
    prefix = re.match(r"[A-Za-z0-9_/:@ -]*", pattern[1:])[0]
    return prefix[:-1] if pattern[1 + len(prefix) : 2 + len(prefix)] in ("?", "*", "{") else prefix


def _first_chars(pattern: str) -> set[str] | None:
    """The characters a match of a ``^``-anchored pattern can start with, where its first atom is
    a mandatory ASCII character or class (None: unknown)."""
    if not pattern.startswith("^") or len(_branches(pattern)) > 1 or pattern[1:2] in ("", "(", "^", "."):
        return None
    end = _class_end(pattern, 1) + 1 if pattern[1] == "[" else 2 + (pattern[1] == "\\")
    atom = ecma_classes(pattern[1:end])
    if atom.startswith("[^") or not atom.isascii() or pattern[end : end + 1] in ("?", "*", "{"):
        return None
    try:
        return {chr(c) for c in range(128) if re.fullmatch(atom, chr(c))}
    except re.error:
        return None
