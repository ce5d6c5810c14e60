"""Emitting a checked schema as a regex: the checker's rewrites applied, outlines-core's translator called,
and the regexes structspec writes itself (holes, objects with ``patternProperties``) put in place."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from outlines_core.json_schema import INTEGER, NUMBER, build_regex_from_schema

from structspec.errors import SchemaError
from structspec.schema.bounds import EXPONENT_DIGITS, Digits
from structspec.schema.keywords import ANNOTATIONS, LITERALS, NAMED
from structspec.schema.patterns import ecma_classes
from structspec.schema.pointers import Document

# Any JSON value, as outlines-core translates it in a group: its own form for {} is an
# alternation without one, which binds looser than the text around it ("a":x|y).
_ANY = {"anyOf": [{"type": t} for t in ("boolean", "null", "number", "string", "array", "object")]}
# outlines-core's errors by how their message starts, with the keyword each is about (one that
# quotes its keyword names it itself). The checker lets none of them through.
_OUTLINES_ERRORS = (("maxLength", "maxLength"), ("Format", "format"), ("External", "$ref"),
                    ("Invalid reference", "$ref"), ("Ref recusion", "$ref"), ("Unsupported data type in enum", "enum"),
                    ("Unsupported data type in const", "const"))


@dataclass
class Rewrites:
    """What the checker decided for the nodes of one schema document, keyed by node identity.

    The checker fills it as it walks (`replace`, `drop`, `hole`, `narrow` change it); `normalized`,
    `standalone`, `pruned` and `regex` read it (`regex` records the digit bounds it applies).
    """

    document: Document
    whitespace: str
    digits: Digits = Digits()
    replaced: dict[int, Any] = field(default_factory=dict)  # id(node) → the node outlines-core gets instead
    drops: dict[int, set[str]] = field(default_factory=dict)  # id(node) → keywords dropped there
    holes: dict[str, str] = field(default_factory=dict)  # marker → regex
    dropped: dict[tuple[str, str], None] = field(default_factory=dict)  # (keyword, pointer), in order
    narrowings: dict[str, None] = field(default_factory=dict)  # "pointer: what", in order

    def narrow(self, pointer: str, what: str) -> None:
        """Record that the regex of the node at ``pointer`` admits less than the schema: ``what``."""
        self.narrowings[f"{pointer or '/'}: {what}"] = None

    def narrow_digits(self, pointer: str, integer: bool, fraction: bool, exponent: bool) -> None:
        """Record the digit bounds applied at ``pointer`` (those switched on)."""
        if integer and self.digits.integer is not None:
            self.narrow(pointer, f"at most {self.digits.integer} integer digits (max_integer_digits)")
        if fraction and self.digits.fraction is not None:
            self.narrow(pointer, f"at most {self.digits.fraction} fraction digits (max_fraction_digits)")
        if exponent and self.digits.integer is not None:
            self.narrow(pointer, f"at most {EXPONENT_DIGITS} exponent digits (with max_integer_digits)")

    def replace(self, node: dict[str, Any], other: Any) -> None:
        """Emit ``other`` wherever ``node`` is."""
        self.replaced[id(node)] = other

    def drop(self, node: dict[str, Any], keyword: str, pointer: str) -> None:
        """Leave ``keyword`` of ``node`` (at ``pointer``) out of the regex and of the parser's validation."""
        self.drops.setdefault(id(node), set()).add(keyword)
        self.dropped[(keyword, pointer)] = None

    def hole(self, node: dict[str, Any], regex: str) -> None:
        """Emit ``regex`` for ``node``: outlines-core translates a string with a marker pattern, replaced after."""
        marker = f"structspecHole{len(self.holes)}x{id(self):x}"
        self.holes[marker] = regex
        self.replace(node, {"type": "string", "pattern": marker})

    def has(self, node: dict[str, Any], keyword: str) -> bool:
        """Whether ``node`` holds ``keyword`` and it was not dropped."""
        return keyword in node and keyword not in self.drops.get(id(node), ())

    def normalized(self, node: Any) -> Any:
        """``node`` as outlines-core gets it: annotations and dropped keywords removed, rewrites in place."""
        if isinstance(node, list):
            return [self.normalized(n) for n in node]
        if not isinstance(node, dict):
            return node
        if id(node) in self.replaced:
            return self.normalized(self.replaced[id(node)])
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in LITERALS:
                out[key] = value
            elif not self.has(node, key):
                continue
            elif key in NAMED:  # keys here are names
                out[key] = {k: self.normalized(v) for k, v in value.items()}
            elif key not in ANNOTATIONS:
                out[key] = self.normalized(value)
        if node.get("type") == "object" and node.get("additionalProperties") is False and "properties" not in node:
            out = {"type": "object", "maxProperties": 0}  # outlines-core has no form for "no properties"
        return out or _ANY

    def standalone(self, node: Any, refs: tuple[str, ...] = ()) -> Any:
        """``node`` as outlines-core gets it (see `normalized`), each ``$ref`` replaced by its target:
        rewritten nodes no longer sit where the references point."""
        return self._inlined(self.normalized(node), refs)

    def _inlined(self, node: Any, refs: tuple[str, ...]) -> Any:
        if isinstance(node, list):
            return [self._inlined(n, refs) for n in node]
        if not isinstance(node, dict) or set(node) & set(LITERALS):
            return node
        if "$ref" in node:
            # the walk rejects cycles where outlines-core reads; one left sits in a keyword it ignores
            if node["$ref"] in refs:
                return node
            return self.standalone(self.document.resolve(node), refs + (node["$ref"],))
        return {k: {n: self._inlined(v, refs) for n, v in value.items()} if k in ("properties", "patternProperties")
                else self._inlined(value, refs) for k, value in node.items() if k not in ("$defs", "definitions")}

    def pruned(self, node: Any) -> Any:
        """``node`` less the dropped keywords, for validating what is enforced."""
        if isinstance(node, list):
            return [self.pruned(n) for n in node]
        if not isinstance(node, dict):
            return node
        dropped = self.drops.get(id(node), set())
        return {k: v if k in LITERALS else self.pruned(v) for k, v in node.items() if k not in dropped}

    def regex(self, node: Any, pointer: str) -> str:
        """The regex of ``node`` (already checked, at ``pointer``), translated on its own."""
        standalone = self.standalone(node)
        size = _text_size(standalone, {})
        if size > MAX_REGEX_CHARS:  # outlines-core would abort the process on the allocation
            keyword = "items" if '"items"' in json.dumps(standalone) else "properties"
            raise SchemaError(keyword, pointer, f"its regex would be about {size:.1e} characters: outlines-core's "
                              "translator writes an array's items twice and an object's optional properties up to "
                              "once per property, level after level; nest fewer arrays or optional objects")
        try:
            regex = build_regex_from_schema(json.dumps(standalone), self.whitespace)
        except ValueError as e:  # the checker should have caught it; never fall back to looser
            raise SchemaError(_keyword_of(str(e)), pointer, f"outlines-core cannot translate it: {e}") from None
        regex = ecma_classes(regex)  # before the holes: their regexes are structspec's own, ASCII
        # Numbers left to outlines-core (in values of any type; typed ones are holes) get the digit bounds.
        # Schema patterns are holes too, so this text is outlines-core's own.
        if self.digits != Digits(None, None) and (NUMBER in regex or INTEGER in regex):
            regex = regex.replace(NUMBER, self.digits.number_regex()).replace(INTEGER, self.digits.integer_regex())
            self.narrow_digits(pointer, integer=True, fraction=True, exponent=True)
        for marker, hole in self.holes.items():
            regex = regex.replace(f'"{marker}"', f"({hole})")
        return regex

    def object_regex(self, fields: list[tuple[str, Any, bool]], patterns: list[tuple[str, Any]],
                     pointer: str) -> str:
        """The regex of an object: ``fields`` (name, schema, required) in order, then any number of
        members whose names match a key regex of ``patterns`` (key regex, schema)."""
        ws = self.whitespace
        items = [(f"{_literal(json.dumps(name, ensure_ascii=False))}{ws}:{ws}({self._value(sub, pointer)})", required)
                 for name, sub, required in fields]
        extra = "|".join(f'("{key}"{ws}:{ws}({self._value(sub, pointer)}))' for key, sub in patterns)
        return rf"\{{{ws}{_members(items, extra, ws)}{ws}\}}"

    def _value(self, node: Any, pointer: str) -> str:
        return self.regex(node, self.document.pointer(node, pointer))


MAX_REGEX_CHARS = 20_000_000
"""The longest regex text outlines-core is asked to write (its translator copies subschemas, so nesting
multiplies the text; past some gigabytes it aborts the whole process)."""


def _text_size(node: Any, memo: dict[int, int]) -> int:
    """About how many characters outlines-core writes for ``node`` (a `Rewrites.standalone` result):
    items count twice, each optional property's value up to once per property, any value ~15,000."""
    if isinstance(node, list):
        return sum(_text_size(n, memo) for n in node)
    if not isinstance(node, dict):
        return len(json.dumps(node))
    if id(node) in memo:
        return memo[id(node)]
    size = 15_000 if not node or node == _ANY else 40
    for key, value in node.items():
        if key in LITERALS:
            size += len(json.dumps(value))
        elif key in ("properties", "patternProperties"):
            optional = max(1, len(set(value) - set(node.get("required", []))))
            size += sum(_text_size(v, memo) for v in value.values()) * optional
        elif key == "items":
            size += 2 * _text_size(value, memo)
        elif isinstance(value, (dict, list)):
            size += _text_size(value, memo)
    memo[id(node)] = size
    return size


def _keyword_of(message: str) -> str:
    """The keyword an outlines-core error is about; "type" for a node it has no translation for."""
    quoted = re.match(r"'(\$?\w+)'", message)
    if quoted:
        return quoted[1]
    return next((keyword for start, keyword in _OUTLINES_ERRORS if message.startswith(start)), "type")


def _literal(text: str) -> str:
    """``text`` as a regex matching exactly it."""
    return re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", text)


def _members(items: list[tuple[str, bool]], extra: str, ws: str) -> str:
    """Object members: ``items`` in order (required or not), then any number of ``extra``, comma-separated."""
    sep = f"{ws},{ws}"

    def rest(i: int, started: bool) -> str:
        if i == len(items):
            return (f"({sep}({extra}))*" if started else f"(({extra})({sep}({extra}))*)?") if extra else ""
        item, required = items[i]
        if started:
            return (f"{sep}{item}" if required else f"({sep}{item})?") + rest(i + 1, True)
        first = item + rest(i + 1, True)
        return first if required else f"({first}|{rest(i + 1, False)})"

    return rest(0, False)
