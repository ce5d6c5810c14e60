"""Regex text ↔ `re._parser` items: text parsed (each distinct large group once), items written back as text.

Python's own parser does the reading (so the dialect is Python's); this module
adds the cut-outs that keep large regexes cheap to parse, turns parser errors
into `RegexError`s whose positions refer to the whole regex, and carries items
a translator built directly (`ParsedRegex`), so they are never parsed again, nor written unless asked.
"""

from __future__ import annotations

import re
import re._constants as C  # the parser's opcodes
import re._parser as parser
import threading
from collections.abc import Callable, Hashable
from functools import lru_cache

from structspec.automaton.anchors import full_match, has_anchors
from structspec.errors import RegexError

REPEATS = (C.MAX_REPEAT, C.MIN_REPEAT, C.POSSESSIVE_REPEAT)

# Escapes, whole character classes, and parentheses: what a scan for groups must tell apart.
_GROUP_SCAN = re.compile(r"\\.|\[\^?\]?(?:\\.|[^\]\\])*\]|[()]", re.DOTALL)
_HOLE = 0xF0000  # private-use code points stand in for groups cut out of a regex
_HOLE_MIN = 48  # groups shorter than this are parsed in place


MAX_WRITTEN = 20_000_000
"""The longest regex text a `ParsedRegex` writes (for other engines; the automaton reads the items)."""


class Stated:
    """A group's body whose producer states its facts and makes its items only when first read (`items`).

    ``key`` names its language (equal keys, equal languages), ``size`` is about how many states it builds into;
    it matches some string, and the empty one only if ``nullable``. The automaton measures it by these and
    reads its items only when a walk first enters it; so a large generated part whose language its producer
    knows without spelling it (a property name other than an object's listed ones, one per object) costs
    nothing until then. ``recipe`` makes the items (picklable: the disk cache keeps unbuilt parts as recipes).
    """

    _making = threading.Lock()  # one list per body: the automaton memoizes sequences by identity

    def __init__(self, recipe: Callable[[], list], key: Hashable, size: int, nullable: bool) -> None:
        self.recipe, self.key, self.size, self.nullable = recipe, key, size, nullable
        self._items: list | None = None

    @property
    def items(self) -> list:
        """The items, made on the first read (changes only this cache)."""
        if self._items is None:
            with Stated._making:
                if self._items is None:
                    self._items = self.recipe()
        return self._items

    def __getstate__(self) -> dict:
        return self.__dict__ | {"_items": None}  # made again where read


def group_body(items: list | Stated) -> list:
    """A group's items (``arg[3]`` of a group item): a `Stated` body's made now if not yet."""
    return items.items if type(items) is Stated else items


class ParsedRegex:
    """A regex as parsed items, for `parse` to return as they are, and a ``key`` naming its language.

    ``key`` names the language for the compile cache (something cheaper to hash than the text, such as the
    translated schema and its options). Items shared in many places (a DAG) can spell megabytes of text, so
    the text is written only when asked for (`str`, pickling); the items and the language never change.
    """

    __slots__ = ("items", "key", "_text")

    def __init__(self, items: list, key: str) -> None:
        self.items, self.key = items, key
        self._text: str | None = None

    def __str__(self) -> str:
        """The regex text (`write`): written on the first call and kept; `RegexError` if it would be longer than
        `MAX_WRITTEN` characters (the automaton never needs it)."""
        if self._text is None:
            try:  # (both recurse once per level of nesting)
                size = written_size(self.items)
                if size > MAX_WRITTEN:
                    raise RegexError("", f"its text would be about {size:.1e} characters (more than "
                                     f"{MAX_WRITTEN:,}): the text spells an array's items twice and an object's "
                                     "optional properties up to once per property, level after level; the "
                                     "compiled automaton shares them and needs no text")
                self._text = write(self.items)
            except RecursionError:
                raise RegexError(repr(self), TOO_DEEP) from None
        return self._text

    def __repr__(self) -> str:
        return f"ParsedRegex(key={self.key[:12]!r}…)"

    def __reduce__(self) -> tuple:
        return str, (str(self),)  # pickled (to a process or a Ray worker) as its text: parsed there if needed


def parse(regex: str | ParsedRegex) -> list:
    """The parsed items of ``regex`` (do not change them: short texts' items are shared, see `_parse_short`);
    `RegexError` if it is invalid or sets inline flags."""
    if isinstance(regex, ParsedRegex):
        return regex.items
    return _parse_short(regex) if len(regex) <= _SHARED_MAX else _parse_text(regex)


_SHARED_MAX = 4096

TOO_DEEP = ("it nests groups, repetitions or alternatives deeper than structspec's reader recurses (Python's "
            "recursion limit); flatten the nesting")


@lru_cache(maxsize=1024)
def _parse_short(regex: str) -> list:
    """`_parse_text`, once per process for each short text: schemas repeat their leaves' texts (a string, an
    integer, a date-time, the same pattern in the checker and the translator)."""
    return _parse_text(regex)


def _parse_text(regex: str) -> list:
    posix = posix_class(regex)
    if posix is not None:
        raise RegexError(regex, posix)
    try:
        items = _parse_shared(regex, {})
    except RecursionError:  # Python's parser recurses once per group
        raise RegexError(regex, TOO_DEEP) from None
    except re.error:
        try:  # the whole regex again, so that the position refers to it
            parser.parse(regex)
        except re.error as e:
            raise RegexError(regex, _with_fix(regex, f"{e.msg} at position {e.pos}")) from None
        raise
    if re.match(r"\(\?[aiLmsux]+\)", regex) or ("(?" in regex and _SCOPED_FLAGS.search(regex)):
        raise RegexError(regex, FLAGS)
    if maybe_anchored(regex) and has_anchors(items):  # (the text test spares most regexes the walk)
        try:
            items = full_match(items)  # the regex matches whole: ^ holds at its start, $ at its end
        except ValueError as e:
            raise RegexError(regex, str(e)) from None
    return items


FLAGS = ("inline flags such as (?i) are not supported; spell the cases out instead, like [Hh][Ii] for (?i)hi "
         "(or [A-Za-z] for (?i)[a-z])")

_POSIX_FIXES = {"alpha": "A-Za-z", "digit": "0-9", "alnum": "A-Za-z0-9", "upper": "A-Z", "lower": "a-z",
                "space": " \\t\\n\\r\\f\\v", "blank": " \\t", "xdigit": "0-9A-Fa-f", "word": "A-Za-z0-9_",
                "punct": "!-/:-@\\[-`{-~", "cntrl": "\\x00-\\x1f\\x7f", "print": " -~", "graph": "!-~"}
"""What each POSIX class (``[:alpha:]``) holds, as the range items of a class."""

# A character class (escapes skipped): Python ends ``[[:alpha:]]`` at its first ``]``, so a POSIX class shows as
# a class ending in ``[:name:]``.
_CLASSES = re.compile(r"\\.|\[\^?\]?(?:\\.|[^\]\\])*\]", re.DOTALL)
_POSIX = re.compile(r"[^\\]\[:(\w+):\]$")  # (inside a class: a ``[`` not escaped before it)
_SCOPED_FLAGS = re.compile(r"(?<!\\)\(\?[aiLmsux]*-?[imsx]+:")  # (?i:…), (?-i:…)


def posix_class(regex: str) -> str | None:
    """Why ``regex`` cannot be read as written if it holds a POSIX class (``[[:alpha:]]``), with the fix; None if
    it holds none. Python's re reads ``[[:alpha:]]`` as the characters ``[:alph`` then a ``]``, another language."""
    if "[:" not in regex:
        return None
    for m in _CLASSES.finditer(regex):
        name = _POSIX.search(m.group()) if m.group().startswith("[") else None
        if name is not None and name[1] in _POSIX_FIXES:
            return (f"POSIX classes such as [:{name[1]}:] are not supported (Python's re, and JSON Schema's "
                    f"ECMA-262, read [[:{name[1]}:]] as a set of the characters '[:{name[1]}' followed by a ']'); "
                    f"write the characters instead, like [{_POSIX_FIXES[name[1]]}]")
    return None


def _with_fix(regex: str, reason: str) -> str:
    """Python's parser error ``reason`` about ``regex``, with the fix where structspec knows it."""
    if re.search(r"\\[pP]\{", regex):
        return (f"Unicode property escapes (\\p{{…}}) are not supported ({reason}); write the characters as a "
                "class, like [A-Za-zÀ-ÿ] for \\p{L}")
    if "flags" in reason:
        return f"{FLAGS} ({reason})"
    return reason


# Where an anchor may be: a $, \A or \Z, or a ^ that opens no class (an escaped [ before it still may).
_MAYBE_ANCHORED = re.compile(r"\$|\\[AZ]|(?:^|[^\[]|\\\[)\^")


def maybe_anchored(regex: str) -> bool:
    """Whether the text ``regex`` may hold an anchor (False: certainly none; cheaper than parsing it)."""
    return _MAYBE_ANCHORED.search(regex) is not None


def unsupported(op: C._NamedIntConstant, arg: object = None) -> str:
    """Why the automaton cannot read the parsed item ``op`` (what a finite automaton cannot hold), with the fix."""
    if op is C.AT:
        return "word boundaries (\\b, \\B) are not supported; spell the characters on each side instead"
    if op in (C.ASSERT, C.ASSERT_NOT):
        return "lookarounds ((?=…), (?!…), (?<=…), (?<!…)) are not supported; write the language without them"
    if op in (C.GROUPREF, C.GROUPREF_EXISTS):
        return ("backreferences and conditional groups (\\1, (?P=name), (?(1)…)) are not supported: no finite "
                "automaton holds them; spell the repeated text out")
    return f"{str(op).lower()} is not supported; write the regex without it"


def _parse_shared(regex: str, cache: dict[str, list]) -> list:
    """Parse ``regex``, parsing each distinct large group's text once.

    Translated JSON Schemas repeat subschemas verbatim (outlines-core spells k optional
    properties in O(k²) text), and Python's parser costs microseconds per character.
    Large groups are cut out, replaced by one placeholder character each, and parsed
    separately through ``cache``; identical groups then share one subtree.
    """
    found = cache.get(regex)
    if found is not None:
        return found
    pieces, holes, depth, start, last = [], [], 0, 0, 0
    if not any(_HOLE <= ord(c) < _HOLE + 0x10000 for c in set(regex)):
        for m in _GROUP_SCAN.finditer(regex):
            if m.group() == "(":
                start, depth = (m.start() if depth == 0 else start), depth + 1
            elif m.group() == ")" and depth:
                depth -= 1
                body = start + 3 if regex.startswith("(?:", start) else start + 1
                if depth or m.end() - start < _HOLE_MIN or regex[body] == "?" or len(holes) == 0x10000:
                    continue  # nested, small, or another kind of (?...) group: parsed in place
                pieces += [regex[last:start], chr(_HOLE + len(holes))]
                holes.append(regex[body : m.end() - 1])
                last = m.end()
    tree = list(parser.parse("".join(pieces) + regex[last:]))
    found = cache[regex] = _fill(tree, [_parse_shared(h, cache) for h in holes]) if holes else tree
    return found


def _fill(items: list, subtrees: list[list]) -> list:
    """``items`` with each placeholder literal replaced by its group's subtree."""
    def hole(op: C._NamedIntConstant, arg: object) -> bool:
        return op is C.LITERAL and _HOLE <= arg < _HOLE + len(subtrees)

    out = []
    for op, arg in items:
        if hole(op, arg):
            op, arg = C.SUBPATTERN, (None, 0, 0, subtrees[arg - _HOLE])
        elif op is C.IN and any(hole(*item) for item in arg):  # the parser turned `(…)|(…)` into a set
            others = [item for item in arg if not hole(*item)]
            alternatives = [subtrees[a - _HOLE] for o, a in arg if hole(o, a)] + ([[(C.IN, others)]] if others else [])
            op, arg = C.BRANCH, (None, alternatives)
        elif op is C.SUBPATTERN:
            arg = (*arg[:3], _fill(arg[3], subtrees))
        elif op is C.BRANCH:
            arg = (arg[0], [_fill(alt, subtrees) for alt in arg[1]])
        elif op in REPEATS:
            arg = (arg[0], arg[1], _fill(arg[2], subtrees))
        out.append((op, arg))
    return out


_CATEGORIES = {C.CATEGORY_DIGIT: r"\d", C.CATEGORY_NOT_DIGIT: r"\D", C.CATEGORY_SPACE: r"\s",
               C.CATEGORY_NOT_SPACE: r"\S", C.CATEGORY_WORD: r"\w", C.CATEGORY_NOT_WORD: r"\W"}


def write(items: list) -> str:
    """Regex text that `parse` reads back as ``items`` (the same language); shared sub-lists are written once
    and copied, so the cost is the length of the text."""
    memo: dict[int, str] = {}

    def sequence(seq: list) -> str:
        found = memo.get(id(seq))
        if found is None:
            found = memo[id(seq)] = "".join(item(op, arg) for op, arg in seq)
        return found

    def item(op: C._NamedIntConstant, arg: object) -> str:
        if op is C.LITERAL:
            return _char(arg) if not chr(arg).isprintable() else re.escape(chr(arg))
        if op is C.NOT_LITERAL:
            return f"[^{_in_class(arg)}]"
        if op is C.ANY:
            return "."
        if op is C.IN:
            return "[" + "".join(_class_item(o, a) for o, a in arg) + "]"
        if op is C.SUBPATTERN:
            if arg[1] or arg[2]:
                raise RegexError("", FLAGS)
            return f"(?:{sequence(group_body(arg[3]))})"
        if op is C.BRANCH:
            return "(?:" + "|".join(map(sequence, arg[1])) + ")"
        if op in REPEATS:
            low, high, body = arg
            count = ("*" if low == 0 else "+" if low == 1 else f"{{{low},}}") if high is C.MAXREPEAT else (
                "?" if (low, high) == (0, 1) else f"{{{low}}}" if low == high else f"{{{low},{high}}}")
            return f"(?:{sequence(body)}){count}" + ("?" if op is C.MIN_REPEAT else "+" if op is C.POSSESSIVE_REPEAT else "")
        raise RegexError("", unsupported(op))

    return sequence(items)


def written_size(items: list) -> int:
    """About how many characters `write` writes for ``items`` (a shared sub-list counts each time it is met).
    Cheap: each distinct sub-list is measured once."""
    memo: dict[int, int] = {}

    def size(seq: list) -> int:
        found = memo.get(id(seq))
        if found is None:
            found = 0
            for op, arg in seq:
                if op is C.SUBPATTERN:
                    found += 4 + size(group_body(arg[3]))
                elif op is C.BRANCH:
                    found += 4 + sum(size(a) + 1 for a in arg[1])
                elif op in REPEATS:
                    found += 8 + size(arg[2])
                else:
                    found += len(arg) + 2 if op is C.IN else 2
            memo[id(seq)] = found
        return found

    return size(items)


def _char(code: int) -> str:
    """An unprintable character as an escape (a surrogate too: the text stays encodable)."""
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _in_class(code: int) -> str:
    c = chr(code)
    return "\\" + c if c in "\\]^-[" else c if c.isprintable() else _char(code)


def _class_item(op: C._NamedIntConstant, arg: object) -> str:
    if op is C.NEGATE:
        return "^"
    if op is C.LITERAL:
        return _in_class(arg)
    if op is C.RANGE:
        return f"{_in_class(arg[0])}-{_in_class(arg[1])}"
    if op is C.CATEGORY:
        return _CATEGORIES[arg]
    raise RegexError("", f"character class item {op} is not supported")
