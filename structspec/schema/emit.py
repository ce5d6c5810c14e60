"""What the checker decided for one schema document (`Rewrites`), and the regex it emits: the structure
translated by `translate` into parsed items, written out as text only when asked for (other engines)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from structspec.automaton.parse import ParsedRegex
from structspec.errors import SchemaError
from structspec.schema.bounds import EXPONENT_DIGITS, Digits
from structspec.schema.difference import names_except
from structspec.schema.keywords import LITERALS, NAMED, is_annotation
from structspec.schema.pointers import Document, join
from structspec.schema.reach import MAX_RECURSION_DEPTH
from structspec.schema.translate import ANY, Items, Translator, json_string

_ANY_VALUE: dict[str, Any] = {}  # the schema of any value

# Bumped when the translation changes its output for the same schema: names the compile-cache entries.
_TRANSLATION = "structspec-translate-3"


@dataclass
class Rewrites:
    """What the checker decided for the nodes of one schema document, keyed by node identity.

    The checker fills it as it walks (`replace`, `drop`, `hole`, `narrow` change it); `items`, `regex`,
    `normalized`, `standalone` and `pruned` read it (`items` and `regex` record the digit bounds they apply).
    """

    document: Document
    whitespace: str
    digits: Digits = Digits()
    open_objects: bool = False  # listed properties' objects also take the members additionalProperties allows
    nesting: int = MAX_RECURSION_DEPTH  # levels of arrays and objects a value no schema describes nests
    replaced: dict[int, Any] = field(default_factory=dict)  # id(node) → the node outlines-core gets instead
    drops: dict[int, set[str]] = field(default_factory=dict)  # id(node) → keywords dropped there
    holes: dict[str, Items] = field(default_factory=dict)  # marker → the hole's items
    dropped: dict[tuple[str, str], None] = field(default_factory=dict)  # (keyword, pointer), in order
    narrowings: dict[str, None] = field(default_factory=dict)  # "pointer: what", in order
    unknown_formats: dict[tuple[str, str], None] = field(default_factory=dict)  # (format, pointer), not enforced
    translator: Translator = field(init=False)

    def __post_init__(self) -> None:
        self.translator = Translator(self)

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

    def hole(self, node: dict[str, Any], regex: str | Items) -> dict[str, Any]:
        """Emit ``regex`` (structspec's own regex text, or items) for ``node``: it stands as a string node whose
        pattern is a marker (`standalone` hands that to outlines-core in the cross-check). Returns that node."""
        marker = f"structspecHole{len(self.holes)}x{id(self):x}"
        self.holes[marker] = self.translator.text(regex) if isinstance(regex, str) else regex
        self.replace(node, {"type": "string", "pattern": marker})
        return self.replaced[id(node)]

    def has(self, node: dict[str, Any], keyword: str) -> bool:
        """Whether ``node`` holds ``keyword`` and it was not dropped."""
        return keyword in node and keyword not in self.dropped_in(node)

    def dropped_in(self, node: Any) -> Collection[str]:
        """The keywords dropped from ``node`` (empty if none)."""
        return self.drops.get(id(node), ())

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
            elif not is_annotation(key):
                out[key] = self.normalized(value)
        if node.get("type") == "object" and node.get("additionalProperties") is False and "properties" not in node:
            out = {"type": "object", "maxProperties": 0}  # outlines-core has no form for "no properties"
        return out or ANY

    def standalone(self, node: Any, refs: tuple[str, ...] = ()) -> Any:
        """``node`` as outlines-core would get it (see `normalized`), each ``$ref`` replaced by its target
        (rewritten nodes no longer sit where the references point): what tests hand outlines-core's translator
        to cross-check `items`."""
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
        """``node`` less the dropped keywords, for validating what is enforced; a subtree shared in ``node`` (an
        unrolled recursive schema shares them) is pruned once and shared."""
        done: dict[int, Any] = {}

        def prune(node: Any) -> Any:
            if not isinstance(node, (dict, list)):
                return node
            if id(node) not in done:
                dropped = self.dropped_in(node)
                done[id(node)] = [prune(n) for n in node] if isinstance(node, list) else {
                    k: v if k in LITERALS else prune(v) for k, v in node.items() if k not in dropped}
            return done[id(node)]

        return prune(node)

    def items(self, node: Any, pointer: str) -> Items:
        """The parsed items of ``node`` (already checked, at ``pointer``), translated on its own."""
        return self.translator.items(node, pointer)

    def regex(self, node: Any, pointer: str, source: str) -> ParsedRegex:
        """The regex of ``node`` (already checked, at ``pointer``): its items, the key naming its language, and
        its text written only when asked for. ``source`` is the JSON text of the schema `reach.unroll` read the
        document from (`check_json`): with the options it names the language, and it is short where the
        unrolled copy's would not be (that copy shares its subtrees, which JSON would write out once per place)."""
        items = self.items(node, pointer)
        options = json.dumps([_TRANSLATION, self.nesting, self.whitespace, self.digits.integer, self.digits.fraction,
                              self.open_objects, pointer], ensure_ascii=False)
        key = f"{options}\0{source}".encode("utf-8", "surrogatepass")
        return ParsedRegex(items, hashlib.sha256(key).hexdigest())

    def object_regex(self, fields: list[tuple[str, Any, bool]], patterns: list[tuple[str, Any, str]],
                     pointer: str, others: Any = None, forbidden: list[str] | tuple[str, ...] = (),
                     located: bool = False) -> Items:
        """The items of the object at ``pointer``: ``fields`` (name, schema, required) in order, then any number
        of members whose names match a key regex of ``patterns`` (key regex, schema, the pattern it is read from),
        or (``others``, a schema or True for any value) are any name no field has and not ``forbidden``.
        ``located``: the schemas may sit elsewhere in the document than under ``pointer`` (the object is a merged
        copy), so their pointers are looked up."""
        t = self.translator

        def value(node: Any, *path: str) -> Items:
            where = join(pointer, *path)
            return self.items(node, self.document.pointer(node, where) if located else where)

        listed = [(t.member(json_string(name), value(sub, "properties", name)), required)
                  for name, sub, required in fields]
        extra = [t.text(f'"{key}"') + t.member("", value(sub, "patternProperties", p)) for key, sub, p in patterns]
        if others is not None:
            names = [*(name for name, _, _ in fields), *forbidden]
            # any value (additionalProperties true or absent): one node, whose items the translator shares
            other = (self.items(_ANY_VALUE, pointer) if others is True
                     else value(others, "additionalProperties"))
            extra.append(names_except(names) + t.member("", other))
            t.strings = True  # (the names; see STRINGS)
        return t.object_items(listed, extra)
