"""JSON Schema patterns (ECMA-262 regexes) → regexes that mean the same and fit inside a JSON string.

outlines-core puts a schema pattern between the quotes as it is and reads
``\\d`` and ``\\w`` as Unicode classes; these functions give classes their ECMA
meaning, keep wildcards off the characters a JSON string holds only escaped,
and read ``patternProperties`` patterns, which search rather than match.
"""

from __future__ import annotations

import re
import re._parser as parser
import unicodedata
from functools import cache, lru_cache

from structspec.automaton.anchors import full_match, has_anchors, in_context
from structspec.automaton.nfa import ByteNFA
from structspec.automaton.parse import maybe_anchored, write
from structspec.errors import RegexError

_ECMA = {"d": "0-9", "w": "a-zA-Z0-9_"}
# What a JSON string holds only escaped.
_JSON_UNSAFE = "\"\\\\\\x00-\\x1F"
_UNSAFE_CHARS = ['"', "\\"] + [chr(c) for c in range(0x20)]
# The spaces both ECMA-262's \s and Python's hold, less those a JSON string holds only escaped.
_SPACES = " \xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
# What the negated atoms leave out, read both ways (ECMA-262 counts U+FEFF as \s, Python's re reads \d and \w
# as Unicode; the automaton reads \d, \s, \w as Unicode), and . stops at \r, U+2028 and U+2029 (ECMA-262).
_NEGATED = {"\\S": "\\s\ufeff", "\\D": "\\d", ".": "\u2028\u2029"}  # (and \W: every _python_word)


@cache
def _python_word() -> str:
    """Class text of the characters Python's re reads as ``\\w``: the automaton's ``\\w`` (letters, marks, Nd, Nl,
    Pc) and the other numbers (No: ``²``, ``½``), which ``str.isalnum`` counts. Scanned once, where needed."""
    ranges: list[list[int]] = []
    for c in range(0x110000):
        if unicodedata.category(chr(c)) == "No":
            if ranges and ranges[-1][1] == c - 1:
                ranges[-1][1] = c
            else:
                ranges.append([c, c])
    return "\\w" + "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges)


_KEY_CHAR = f"[^{_JSON_UNSAFE}]"
# A pattern that is one character (class) repeated, as json_safe_pattern leaves it.
_REPEATED_CLASS = re.compile(r"\((?P<char>\[(?:\\.|[^\]\\])*\]|\\.|[a-zA-Z0-9 ])(?P<times>[+*])\)")


def ecma_classes(pattern: str) -> str:
    """Give ``\\d`` and ``\\w`` their JSON Schema (ECMA-262) meaning: ASCII only.

    outlines-core's regex engine reads them as Unicode classes (``\\d`` matches
    ``۴``), which would make schema patterns and formats (``date``: ``\\d{4}-…``)
    looser than JSON Schema says.
    """
    return _ecma(pattern)[0]


ASCII_CLASSES = ("reads \\d and \\w as ECMA-262 does: ASCII digits, letters and _ only (Python's re and Pydantic "
                 "also match é, ٣)")
"""What a pattern `ascii_classes` holds for is narrowed to (a narrowing, after the pattern)."""


def ascii_classes(pattern: str) -> bool:
    """Whether `ecma_classes` reads a ``\\d`` or ``\\w`` of ``pattern`` as ASCII where Python's re (jsonschema's)
    and Pydantic read Unicode (``é``, ``٣``): a narrowing, since every reading holds the ASCII characters."""
    return _ecma(pattern)[1]


@lru_cache(maxsize=4096)
def _ecma(pattern: str) -> tuple[str, bool]:
    """`ecma_classes` of ``pattern``, and whether it narrowed a class (`ascii_classes`)."""
    out, in_class, negated, narrowed, i = [], False, False, False, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            esc = pattern[i + 1]
            if esc in _ECMA and not negated:  # (a negated class leaves out Python's wider \d, \w too)
                out.append(_ECMA[esc] if in_class else f"[{_ECMA[esc]}]")
                narrowed = True
            elif esc == "w" and negated:
                out.append(_python_word())
            else:
                out.append(c + esc)
            i += 2
            continue
        opens = c == "[" and not in_class
        in_class = (in_class and c != "]") or c == "["
        negated = in_class and (negated if not opens else pattern[i + 1 : i + 2] == "^")
        out.append(c)
        i += 1
    return "".join(out), narrowed


def json_safe_pattern(pattern: str) -> tuple[str, bool] | None:
    """``pattern`` narrowed to characters a JSON string holds unescaped, and whether that left any out; None if
    it needs escaped ones.

    outlines-core puts a schema pattern between the quotes as it is, so ``.`` or
    ``[^a]`` would match a raw quote or newline and break the JSON. Wildcards and
    negated classes exclude those characters here, ``\\s`` means the spaces a JSON string holds unescaped (those
    both ECMA-262 and Python's re, which validates the output, count), ``\\D`` excludes every Unicode digit
    (Python's reading) as well as ECMA-262's; a pattern
    that asks for one of them (a literal quote, ``\\n``) gets None. Anchors at the ends
    of a top-level branch with none inside are left out (the match is whole); others stay,
    for `matched_whole`. The result is a group.
    """
    pattern = "|".join(body if _branches(body, "^$") == [body] else branch  # (inner anchors: all kept)
                       for branch, (_, body, _) in ((b, _ends(b)) for b in _branches(pattern)))
    out, i, narrowed = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "[":
            j = _class_end(pattern, i)
            atom, i = pattern[i : j + 1], j + 1
            if not atom.startswith("[^") and "\\s" in atom:
                atom, narrowed = atom.replace("\\s", _SPACES), True
        elif c == "\\":
            size = {"x": 4, "u": 6}.get(pattern[i + 1 : i + 2], 2)
            atom, i = pattern[i : i + size], i + size
        elif c == "." or c in _UNSAFE_CHARS:
            atom, i = c, i + 1
        else:  # a literal or an operator (an anchor inside: see matched_whole)
            out.append(c)
            i += 1
            continue
        unsafe = _unsafe(atom)
        if unsafe is None:
            return None
        if not unsafe:
            out.append(atom)
            continue
        if atom == "\\s":
            out.append(f"[{_SPACES}]")
        elif atom in _NEGATED or atom == "\\W":
            excluded = _python_word() if atom == "\\W" else _NEGATED[atom]
            out.append(f"[^{excluded}{_JSON_UNSAFE}]")
        elif atom.startswith("[^"):
            out.append(atom[:-1] + _JSON_UNSAFE + "]")
        else:
            return None
        narrowed = True
    return "(" + "".join(out) + ")", narrowed  # a group: outlines-core puts quotes around it as it is


@lru_cache(maxsize=1024)
def matched_whole(safe: str) -> tuple[str, bool]:
    """``safe`` (a `json_safe_pattern` result) without the anchors it keeps inside, matched whole (``a$b``: no
    string; ``a$(b)?``: "a"), and whether no string matches it with text before or after (then a search, as JSON
    Schema reads a pattern, finds no more than the whole match). Without inner anchors: ``safe`` and False.
    `ValueError` if an anchor sits in a long repetition."""
    if not maybe_anchored(safe):  # (most patterns: no parse)
        return safe, False
    try:
        items = list(parser.parse(safe))
    except re.error:  # (the automaton's own parse says why)
        return safe, False
    if not has_anchors(items):
        return safe, False
    alone = all(in_context(items, start, end) is None for start, end in ((True, False), (False, True), (False, False)))
    try:
        return f"({write(full_match(items))})", alone
    except RegexError:  # (a lookaround beside the anchors: the automaton's build says why)
        return safe, False


def _ends(branch: str) -> tuple[bool, str, bool]:
    """Whether a top-level ``branch`` opens with ``^`` and closes with an unescaped ``$``, and what is between."""
    head = branch.startswith("^")
    tail = branch.endswith("$") and (len(branch) - len(branch[:-1].rstrip("\\")) - 1) % 2 == 0 and len(branch) > head
    return head, branch[head : len(branch) - tail], tail


@lru_cache(maxsize=4096)
def _unsafe(atom: str) -> bool | None:
    """Whether the pattern atom ``atom`` matches a character a JSON string holds only escaped; None if it is no
    regex. (Memoized: schemas repeat their atoms, and each answer costs a match per unsafe character.)"""
    try:
        return any(re.fullmatch(atom, u) for u in _UNSAFE_CHARS)
    except re.error:
        return None


@lru_cache(maxsize=1024)
def unreadable(pattern: str) -> str | None:
    """Why Python's re, which validates the output (jsonschema's pattern), cannot read the ECMA-262 ``pattern``,
    with the fix; None if it can."""
    try:
        re.compile(pattern)
    except re.error as e:
        if re.search(r"\\[pP]\{", pattern):
            return ("Unicode property escapes (\\p{…}) cannot be read by Python's re, which validates the output; "
                    "write the characters as a class, like [A-Za-zÀ-ÿ]")
        if "\\u{" in pattern:
            return ("code point escapes (\\u{…}) cannot be read by Python's re, which validates the output; write "
                    "the character itself, or \\uXXXX")
        return (f"Python's re, which validates the output, cannot read it ({e}); write it as both ECMA-262 and "
                "Python read")
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
    for head, body, tail in map(_ends, _branches(pattern)):
        if _branches(body, "^$") != [body]:  # an anchor left inside
            return None
        found = json_safe_pattern(ecma_classes(body))
        if found is None:
            return None
        safe = found[0]
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


@lru_cache(maxsize=1024)
def unbuildable(pattern: str) -> str | None:
    """Why the automaton cannot build ``pattern`` (a `RegexError`'s reason), or None if it can. Once per
    process for each pattern: schemas repeat theirs (one per property of the same kind)."""
    try:
        ByteNFA(pattern)
    except RegexError as e:
        return e.reason
    return None
