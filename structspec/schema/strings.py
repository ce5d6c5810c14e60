"""String nodes: ``format``, ``pattern`` and length bounds folded into one JSON-safe pattern where they need
it (a hole of structspec's regex), or left to outlines-core's string. Records its rewrites in the walk;
changes no schema."""

from __future__ import annotations

import re._constants as C
import re._parser as parser
from typing import Any

from structspec.automaton.parse import REPEATS, unsupported
from structspec.errors import SchemaError
from structspec.schema import grammars
from structspec.schema.keywords import DEFINED_FORMATS, FORMATS
from structspec.schema.patterns import (
    ASCII_CLASSES,
    ascii_classes,
    ecma_classes,
    json_safe_pattern,
    matched_whole,
    unbuildable,
    unreadable,
    whole,
    with_lengths,
)
from structspec.schema.walk import Walk

MAX_LENGTH = 4_294_967_294
"""A ``maxLength`` above this is narrowed to it: the largest count a regex can hold (Python's parser; the
automaton counts a long repetition instead of copying it, so any count costs the same)."""


def check_string(walk: Walk, node: dict[str, Any], ptr: str) -> None:
    """Fold format, pattern and length bounds into one JSON-safe pattern where they need it."""
    lengths = walk.has(node, "minLength") or walk.has(node, "maxLength")
    pattern = None
    if walk.has(node, "format") and node["format"] not in DEFINED_FORMATS:
        # an unknown format is an annotation to JSON Schema's validators too: said (a warning), not enforced
        walk.rewrites.unknown_formats[(node["format"], ptr)] = None
        rest = {k: v for k, v in node.items() if k != "format"}
        walk.rewrites.replace(node, rest)
        walk.walk(rest, ptr, ())
        return
    if walk.has(node, "format"):
        if node["format"] not in FORMATS:
            walk.unenforced(node, "format", ptr, f"format {node['format']!r} is not supported "
                            f"(supported: {', '.join(sorted(FORMATS))})")
        elif walk.has(node, "pattern"):
            walk.unenforced(node, "format", ptr, "cannot be combined with pattern")
        else:
            if lengths:  # implied by the format, or refused (strict=False: dropped, the format kept)
                _cut_lengths(walk, node, ptr)
                lengths = False
            pattern = f"({grammars.get(node['format']).pattern})"  # catalogue patterns are JSON-safe
            # each grammar leaves out some strings the format's RFC (and a validator) accepts: it says which
            walk.rewrites.narrow(ptr, f"format {node['format']!r} is written as structspec's grammar of it: "
                                 f"{grammars.catalogue()[node['format']].description}")
    if walk.has(node, "pattern") and node["pattern"] in walk.rewrites.holes:
        return  # a hole's own node: emitted already
    if walk.has(node, "pattern"):
        safe, searched, unread = None, False, unreadable(node["pattern"])
        if unread is None and _refers_back(node["pattern"]):
            unread = unsupported(C.GROUPREF)
        if unread is not None:
            walk.unenforced(node, "pattern", ptr, unread)
        else:
            safe = json_safe_pattern(ecma_classes(node["pattern"]))
            if safe is None:
                walk.unenforced(node, "pattern", ptr, "it needs a quote, backslash or control character "
                                "(U+0000-U+001F), which JSON strings hold only escaped and structspec writes a "
                                "pattern's characters unescaped; leave them out of the pattern")
        if safe is not None and ascii_classes(node["pattern"]):
            walk.rewrites.narrow(ptr, f"pattern {node['pattern']!r} {ASCII_CLASSES}")
        if safe is not None and safe[1]:
            walk.rewrites.narrow(ptr, f"pattern {node['pattern']!r} is written without the characters a JSON "
                                 "string holds only escaped (quote, backslash, U+0000-U+001F)")
        try:
            pattern, searched = (None, False) if safe is None else matched_whole(safe[0])
        except ValueError as e:
            walk.unenforced(node, "pattern", ptr, str(e))
        if pattern is not None and lengths:
            try:
                pattern = with_lengths(pattern, node.get("minLength", 0), _max_length(walk, node, ptr))
            except ValueError as e:
                raise SchemaError("maxLength", ptr, f"no string the pattern matches is that short: {e}") from None
            if pattern is None:
                walk.unenforced(node, "pattern", ptr, "cannot be combined with minLength/maxLength "
                                "unless it is one character class repeated, like ^[a-z0-9]+$")
        if pattern is not None:
            pattern = _readable(walk, node, ptr, pattern)
        if pattern is not None and not (searched or whole(node["pattern"])):
            walk.rewrites.narrow(ptr, f"pattern {node['pattern']!r} matches whole strings only (JSON Schema "
                                 "finds it anywhere in one)")
    if pattern is not None:
        # a hole, with its quotes: the digit bounds rewrite outlines-core's number text, never a pattern
        walk.rewrites.hole(node, f'"{pattern}"')
    elif lengths and _max_length(walk, node, ptr) != node.get("maxLength"):
        walk.rewrites.replace(node, {k: v for k, v in node.items() if walk.has(node, k)}
                              | {"maxLength": MAX_LENGTH})


def _refers_back(pattern: str) -> bool:
    """Whether ``pattern`` (one Python's re reads) holds a backreference or a conditional group (``\\1``,
    ``(?P=name)``, ``(?(1)…)``): no regular language holds them."""
    todo = [parser.parse(pattern)]
    while todo:
        for op, arg in todo.pop():
            if op in (C.GROUPREF, C.GROUPREF_EXISTS):
                return True
            if op is C.SUBPATTERN:
                todo.append(arg[3])
            elif op is C.BRANCH:
                todo.extend(arg[1])
            elif op in REPEATS:
                todo.append(arg[2])
            elif op in (C.ASSERT, C.ASSERT_NOT):
                todo.append(arg[1])
    return False


def _cut_lengths(walk: Walk, node: dict[str, Any], ptr: str) -> None:
    """Each ``minLength``/``maxLength`` of ``node`` that some string of its format breaks unenforced
    (`SchemaError`, or dropped under ``strict=False``): a format's grammar cannot be cut to a length. Those
    every string of the format keeps (``AnyUrl``'s ``minLength: 1``) hold as they are."""
    shortest, longest = parser.parse(grammars.get(node["format"]).pattern).getwidth()
    for keyword, cuts in (("minLength", node.get("minLength", 0) > shortest),
                          ("maxLength", node.get("maxLength") is not None and node["maxLength"] < longest)):
        if walk.has(node, keyword) and cuts:
            walk.unenforced(node, keyword, ptr, f"format {node['format']!r} cannot be bounded in length (structspec "
                            f"writes the format's grammar whole, and cannot cut it to a count); drop {keyword}, "
                            "pass strict=False to drop it, or write a pattern of the strings you want")


def _max_length(walk: Walk, node: dict[str, Any], ptr: str) -> int | None:
    """``maxLength`` of a string node, narrowed to `MAX_LENGTH` (recorded); None if it has none."""
    if node.get("minLength", 0) > MAX_LENGTH:
        raise SchemaError("minLength", ptr, f"strings of more than {MAX_LENGTH:,} characters cannot be "
                          "enforced (the largest count a regex can hold); lower minLength")
    if node.get("maxLength") is None or node["maxLength"] <= MAX_LENGTH:
        return node.get("maxLength")
    walk.rewrites.narrow(ptr, f"maxLength {node['maxLength']} narrowed to {MAX_LENGTH} "
                         "(the largest count a regex can hold)")
    return MAX_LENGTH


def _readable(walk: Walk, node: dict[str, Any], ptr: str, pattern: str) -> str | None:
    """``pattern`` if the automaton can build it and some string matches it; None if it cannot be read
    (dropped under ``strict=False``); `SchemaError` if it matches nothing."""
    reason = unbuildable(pattern)
    if reason is None:
        return pattern
    if reason.startswith("it matches no string"):
        raise SchemaError("pattern", ptr, f"no string matches {node['pattern']!r}; "
                          "fix the pattern (an empty class like [^\\s\\S]?)")
    walk.unenforced(node, "pattern", ptr, f"it cannot be translated: {reason}")
    return None
