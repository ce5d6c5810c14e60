"""A checked schema → parsed regex items (the `re._parser` form the automaton builds from), node by node.

The structure (objects, arrays, alternatives, ``$ref`` targets) is translated here, once per node, and a
node met again is the same sub-list: the automaton hash-conses by structure, so a shared node costs its
size once where its continuation is the same. k optional properties are k alternatives that share their
prefixes (``(a,)?(b,)?c``), O(k) items where outlines-core writes O(k²) text. The language is outlines-core's
translation of `Decisions.standalone` (the cross-check in tests/schema/test_translate.py). Leaves (strings, numbers,
booleans, null, enums, consts) keep outlines-core's regex text, parsed once per distinct text.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from outlines_core.json_schema import INTEGER, NUMBER, STRING, build_regex_from_schema

from structspec.automaton.parse import parse
from structspec.errors import RegexError, SchemaError
from structspec.schema.bounds import Digits
from structspec.schema.decisions import ANY, Decisions
from structspec.schema.items import (
    ASCII,
    Items,
    branch,
    group,
    json_string,
    literal,
    repeat,
)
from structspec.schema.keywords import LITERALS, is_annotation
from structspec.schema.patterns import ecma_classes

_LEAF_TYPES = ("string", "number", "integer", "boolean", "null")
# outlines-core's errors by how their message starts, with the keyword each is about (one that
# quotes its keyword names it itself). The checker lets none of them through.
_OUTLINES_ERRORS = (("maxLength", "maxLength"), ("Format", "format"), ("External", "$ref"),
                    ("Invalid reference", "$ref"), ("Ref recusion", "$ref"), ("Unsupported data type in enum", "enum"),
                    ("Unsupported data type in const", "const"))


STRINGS = ("strings hold no characters U+0000-U+001F but those written \\b \\f \\n \\r \\t, and none of U+007F-U+009F "
           "(outlines-core's string writes no \\u escapes)")
"""The narrowing of every string of outlines-core's form (a string type, a name, a value no schema describes)."""


class _Untranslatable(Exception):
    """A node outlines-core would not translate either (keyword, reason): the checker lets none through."""


class Translator:
    """Translates the nodes of one checked schema document as ``decisions`` says; remembers each node's items.

    `items` changes only the memo and the narrowings of ``decisions`` (digit bounds it applies).
    """

    def __init__(self, decisions: Decisions) -> None:
        self.decisions = decisions
        self.ws = parse(decisions.whitespace) if decisions.whitespace else []
        self._memo: dict[int, tuple[Any, Items, bool]] = {}  # id(node) → (node, its items, uses numbers)
        self._holes: dict[str, Items] = {}  # a hole's regex text → its items
        self._any_values: dict[tuple[str, int], tuple[Items, bool]] = {}  # (type, levels below) → its items
        self._bare: dict[str, tuple[Items, bool]] = {}  # leaf type → the items of a node with no other keyword
        self._refs: list[str] = []  # the $ref chain being translated
        self._nested = self._nesting_said = False  # whether a value without schema was translated; and said so
        self.strings = self._strings_said = False  # whether a string of outlines-core's form was; and said so

    def items(self, node: Any, pointer: str) -> Items:
        """The items of ``node`` (checked, at ``pointer``); records the digit bounds on the numbers of any value."""
        try:
            items, numbers = self._node(node)
        except _Untranslatable as e:
            raise SchemaError(*e.args[:1], pointer, *e.args[1:]) from None
        if numbers and self.decisions.digits.bounded:
            self.decisions.narrow_digits(pointer, integer=True, fraction=True, exponent=True)
        if self._nested and not self._nesting_said:  # where it first shows; said once
            self._nesting_said = True
            self.decisions.narrow(pointer, f"values no schema describes nest at most {self.decisions.nesting} levels "
                                 "of arrays and objects (max_recursion_depth)")
        if self.strings and not self._strings_said:  # likewise
            self._strings_said = True
            self.decisions.narrow(pointer, STRINGS)
        return items

    def text(self, regex: str) -> Items:
        """The items of structspec's own regex text (a hole), as one group: one list per distinct text (the
        automaton measures a list once)."""
        found = self._holes.get(regex)
        if found is None:
            found = self._holes[regex] = [group(_items_of(regex))]
        return found

    def _node(self, node: Any) -> tuple[Items, bool]:
        found = self._memo.get(id(node))
        if found is not None:
            return found[1], found[2]
        if not isinstance(node, dict):
            raise _Untranslatable("type", f"outlines-core cannot translate {json.dumps(node)[:60]}")
        replaced = self.decisions.replaced.get(id(node))
        items, numbers = self._node(replaced) if replaced is not None else self._dispatch(self._view(node))
        self._memo[id(node)] = (node, items, numbers)
        return items, numbers

    def _view(self, node: dict[str, Any]) -> dict[str, Any]:
        """``node``'s own keywords as outlines-core gets them (see `Decisions.normalized`); children stay nodes."""
        dropped = self.decisions.dropped_in(node)
        out = {k: v for k, v in node.items() if k in LITERALS or (k not in dropped and not is_annotation(k))}
        if node.get("type") == "object" and node.get("additionalProperties") is False and "properties" not in node:
            return {"type": "object", "maxProperties": 0}  # outlines-core has no form for "no properties"
        return out or ANY

    def _dispatch(self, v: dict[str, Any]) -> tuple[Items, bool]:
        """outlines-core's dispatch, in its order (a ``$ref`` first: `Decisions.standalone` inlines it)."""
        if "$ref" in v and not set(v) & set(LITERALS):
            return self._ref(v)
        if "properties" in v:
            return self._properties(v)
        if "allOf" in v:
            return self._sequence([self._node(sub) for sub in v["allOf"]])
        if "anyOf" in v or "oneOf" in v:
            return self._union([self._node(sub) for sub in v["anyOf" if "anyOf" in v else "oneOf"]])
        if "prefixItems" in v:
            subs = [self._node(sub) for sub in v["prefixItems"]]
            sep = [*self.ws, ASCII[","], *self.ws]
            inner: Items = []
            for i, (items, _) in enumerate(subs):
                inner += [*(sep if i else []), group(items)]
            return [*literal("["), *self.ws, *inner, *self.ws, *literal("]")], any(n for _, n in subs)
        if "enum" in v or "const" in v:
            key = "enum" if "enum" in v else "const"
            values = v["enum"] if key == "enum" else [v["const"]]
            if all(x is None or isinstance(x, (str, int, float)) for x in values):
                # each value's JSON text as Python writes it: ints exact, floats the shortest text that reads back
                # (outlines-core reads numbers as 64-bit floats: 10**30 became 1e30)
                texts = dict.fromkeys(json.dumps(x, ensure_ascii=False) for x in values)
                return [branch([literal(t) for t in texts])], False
            return self._leaf({key: v[key]})
        if isinstance(v.get("type"), list):
            return self._union([self._typed(t, v) for t in v["type"]])
        if isinstance(v.get("type"), str):
            return self._typed(v["type"], v)
        raise _Untranslatable("type", f"outlines-core cannot translate {json.dumps(v)[:60]}")

    def _union(self, subs: list[tuple[Items, bool]]) -> tuple[Items, bool]:
        """One of ``subs`` (each alternative the node's own items: shared, measured once)."""
        return [branch([items for items, _ in subs])], any(n for _, n in subs)

    def _sequence(self, subs: list[tuple[Items, bool]]) -> tuple[Items, bool]:
        return [group(items) for items, _ in subs], any(n for _, n in subs)

    def _ref(self, v: dict[str, Any]) -> tuple[Items, bool]:
        ref = v["$ref"]
        if ref in self._refs:  # the checker rejects cycles where outlines-core reads
            raise _Untranslatable("$ref", f"recursive reference {ref!r} is not supported")
        self._refs.append(ref)
        try:
            return self._node(self.decisions.document.resolve(v))
        finally:
            self._refs.pop()

    def _typed(self, kind: str, v: dict[str, Any]) -> tuple[Items, bool]:
        if kind in _LEAF_TYPES:
            hole = self.decisions.holes.get(v.get("pattern")) if kind == "string" else None
            if hole is not None:
                return hole, False
            self.strings = self.strings or kind == "string"
            if len(v) == 1:  # the type alone (most leaves): translated once
                found = self._bare.get(kind)
                if found is None:
                    found = self._bare[kind] = self._leaf({"type": kind})
                return found
            return self._leaf({k: x for k, x in v.items() if k != "type"} | {"type": kind})
        depth = self.decisions.nesting - 1  # levels below this container's, for values no schema describes
        if kind == "array":
            return self._array(v, depth)
        if kind == "object":
            return self._object(v, depth)
        raise _Untranslatable("type", f"unsupported type {kind!r}")

    def _leaf(self, node: dict[str, Any]) -> tuple[Items, bool]:
        return _leaf_items(json.dumps(node), self.decisions.whitespace, self.decisions.digits)

    def _any(self, kind: str, depth: int) -> tuple[Items, bool]:
        """A value of type ``kind`` nesting at most ``depth`` levels, as outlines-core writes it for ``{}``."""
        found = self._any_values.get((kind, depth))
        if found is None:  # built once per level and shared: the automaton's hash-consing sees one item
            found = self._any_values[kind, depth] = (self._array if kind == "array" else self._object)({}, depth)
        return found

    def _untyped(self, leaves: tuple[str, ...], depth: int) -> list[tuple[Items, bool]]:
        """The alternatives of a value with no schema, as outlines-core orders them: ``leaves``, then (while
        ``depth`` allows nesting) an object and an array."""
        self._nested = self.strings = True  # (every such value may be a string)
        subs = [self._leaf({"type": t}) for t in leaves]
        if depth > 0:
            subs += [self._any("object", depth - 1), self._any("array", depth - 1)]
        return subs

    def _array(self, v: dict[str, Any], depth: int) -> tuple[Items, bool]:
        low, high = _u64(v.get("minItems")), _u64(v.get("maxItems"))
        if high is not None and high < 1:
            return [*literal("["), *self.ws, *literal("]")], False
        if "items" in v:
            body, numbers = self._node(v["items"])
        else:  # outlines-core's unconstrained items: one of the types (itself a leaf's alternatives)
            subs = self._untyped(("boolean", "null", "number", "integer", "string"), depth)
            body, numbers = [branch([items for items, _ in subs])], any(n for _, n in subs)
        low = max((low or 0) - 1, 0)
        more = repeat(low, None if high is None else high - 1, [ASCII[","], *self.ws, group(body)])
        some = [group(body), more]
        items = [repeat(0, 1, some)] if (_u64(v.get("minItems")) or 0) == 0 else [group(some)]
        return [*literal("["), *self.ws, *items, *self.ws, *literal("]")], numbers

    def _object(self, v: dict[str, Any], depth: int) -> tuple[Items, bool]:
        low, high = _u64(v.get("minProperties")), _u64(v.get("maxProperties"))
        if high is not None and high < 1:
            return [*literal("{"), *self.ws, *literal("}")], False
        self.strings = True  # (the names)
        extra = v.get("additionalProperties")
        if extra is None or extra is True:
            subs = self._untyped(("string", "number", "boolean", "null"), depth)
            value, numbers = [group([branch([items for items, _ in subs])])], any(n for _, n in subs)
        else:
            value, numbers = self._node(extra)
        member = [*_leaf_text(STRING, self.decisions.digits)[0], *self.ws, ASCII[":"], *self.ws, group(value)]
        more = repeat(0, None, [*self.ws, ASCII[","], *self.ws, *member])
        some = [group(member), more]
        items = [repeat(0, 1, some)] if (low or 0) == 0 else [group(some)]
        return [*literal("{"), *self.ws, *items, *self.ws, *literal("}")], numbers

    def _properties(self, v: dict[str, Any]) -> tuple[Items, bool]:
        """outlines-core's object of listed properties: in order, the required ones always, no others."""
        required = {r for r in v.get("required", []) if isinstance(r, str)}
        names = list(v["properties"])
        values = [self._node(v["properties"][n]) for n in names]
        members = [[*self.ws, *self.member(json_string(n), items)]
                   for n, (items, _) in zip(names, values)]
        comma = [*self.ws, ASCII[","]]
        flags = [n in required for n in names]
        body: Items = []
        if any(flags):
            last = max(i for i, f in enumerate(flags) if f)
            for i, (m, req) in enumerate(zip(members, flags)):
                m = [*m, *comma] if i < last else [*comma, *m] if i > last else m
                body += m if req else [repeat(0, 1, m)]
        elif members:  # the first present member is m_i: (m_0,)?…(m_{i-1},)? m_i, prefixes shared
            alternatives, prefix = [], []
            for m in members:
                alternatives.append([*prefix, group(m)])
                prefix = [*prefix, repeat(0, 1, [*m, *comma])]
            body = [repeat(0, 1, [branch(alternatives)])]
        return [*literal("{"), *body, *self.ws, *literal("}")], any(n for _, n in values)

    def member(self, name: str, value: Items) -> Items:
        """``name: value`` with the whitespace around the colon (``name`` is JSON text)."""
        return [*literal(name), *self.ws, ASCII[":"], *self.ws, group(value)]

    def object_items(self, fields: list[tuple[Items, bool]], extra: list[Items]) -> Items:
        """An object of ``fields`` (members' items, required) in order, then any number of members of ``extra``
        (their alternatives), comma-separated: one alternative per last listed member, prefixes shared."""
        comma = [*self.ws, ASCII[","], *self.ws]
        more = [repeat(0, None, [*comma, branch(extra)])] if extra else []
        last = max((i for i, (_, required) in enumerate(fields) if required), default=-1)  # last required member
        alternatives, prefix = [], []
        for i, (m, required) in enumerate(fields):
            if i >= last:  # m may be the last listed member: only optional ones follow it
                alternatives.append([*prefix, group(m), *more])
            prefix = [*prefix, group([*m, *comma]) if required else repeat(0, 1, [*m, *comma])]
        if extra:
            alternatives.append([*prefix, branch(extra), *more])
        if last < 0:
            alternatives.append([])
        return [*literal("{"), *self.ws, branch(alternatives), *self.ws, *literal("}")]


@lru_cache(maxsize=4096)
def _leaf_items(schema: str, whitespace: str, digits: Digits) -> tuple[Items, bool]:
    """A leaf's items (its schema as JSON text) as outlines-core writes it, and whether they hold its numbers.
    Memoized per process, and shared: the same leaves recur in schema after schema."""
    try:
        regex = build_regex_from_schema(schema, whitespace)
    except ValueError as e:  # the checker should have caught it; never fall back to looser
        raise _Untranslatable(_keyword_of(str(e)), f"outlines-core cannot translate it: {e}") from None
    return _leaf_text(regex, digits)


@lru_cache(maxsize=4096)
def _leaf_text(regex: str, digits: Digits) -> tuple[Items, bool]:
    """The items of outlines-core's regex for a leaf (\\d and \\w made ASCII, ``digits`` bounding its numbers,
    which take an exponent without sign too), and whether it holds outlines-core's numbers."""
    text = ecma_classes(regex)
    numbers = NUMBER in text or INTEGER in text
    text = text.replace(NUMBER, digits.number_regex())  # (outlines-core's exponent needs a sign: 1e+5, not 1e5)
    if numbers and digits.bounded:
        text = text.replace(INTEGER, digits.integer_regex())
    return _items_of(text), numbers


def _items_of(regex: str) -> Items:
    try:
        return list(parse(regex))
    except RegexError as e:
        raise _Untranslatable("pattern", f"its regex cannot be read: {e.reason}") from None


def _u64(value: Any) -> int | None:
    """``value`` if outlines-core reads it as a count (a non-negative JSON integer), else None."""
    return value if type(value) is int and value >= 0 else None


def _keyword_of(message: str) -> str:
    """The keyword an outlines-core error is about; "type" for a node it has no translation for."""
    quoted = re.match(r"'(\$?\w+)'", message)
    if quoted:
        return quoted[1]
    return next((keyword for start, keyword in _OUTLINES_ERRORS if message.startswith(start)), "type")
