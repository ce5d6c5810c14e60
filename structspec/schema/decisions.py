"""What the checker decided for one schema document (`Decisions`): nodes replaced, keywords dropped, holes of
structspec's own regex, narrowings. The floor the translation reads and `emit.Rewrites` builds on."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from structspec.schema.bounds import EXPONENT_DIGITS, LARGEST_EXPONENT, Digits
from structspec.schema.items import Items
from structspec.schema.keywords import LITERALS, NAMED, is_annotation
from structspec.schema.pointers import Document
from structspec.schema.recursion import MAX_RECURSION_DEPTH

# Any JSON value, as outlines-core translates it in a group (its own form for {} binds looser).
ANY = {"anyOf": [{"type": t} for t in ("boolean", "null", "number", "string", "array", "object")]}


@dataclass
class Decisions:
    """What the checker decided for the nodes of one schema document, keyed by node identity.

    The checker fills it as it walks (`replace`, `drop`, `narrow` change it; `emit.Rewrites.hole` too);
    `normalized`, `standalone` and `pruned` only read it.
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
    misspelled: dict[tuple[str, str], str] = field(default_factory=dict)  # (keyword, pointer) → the one it misspells

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
            self.narrow(pointer, f"at most {EXPONENT_DIGITS} exponent digits (with max_integer_digits), every number "
                        f"below 1e308 (a positive exponent of at most {LARGEST_EXPONENT - self.digits.integer}, "
                        f"or {LARGEST_EXPONENT - 1} after one integer digit: a larger number parses to inf)")

    def replace(self, node: dict[str, Any], other: Any) -> None:
        """Emit ``other`` wherever ``node`` is."""
        self.replaced[id(node)] = other

    def drop(self, node: dict[str, Any], keyword: str, pointer: str) -> None:
        """Leave ``keyword`` of ``node`` (at ``pointer``) out of the regex and of the parser's validation."""
        self.drops.setdefault(id(node), set()).add(keyword)
        self.dropped[(keyword, pointer)] = None

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
