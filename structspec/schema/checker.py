"""The keyword checker: every validation keyword outlines-core's translator would ignore is rejected
(``strict=False``: dropped), so a compiled constraint is never looser than the schema.

outlines-core silently ignores the keywords it does not implement. The checker walks
a schema the way that translator dispatches and raises `SchemaError`, naming the
keyword and the JSON pointer of its node, for each one it would drop. On the way it
plans `Rewrites` into equivalent or narrower nodes that outlines-core gets right
(``allOf`` and the siblings of ``$ref``, ``anyOf`` and ``oneOf`` merged, keywords of
excluded types dropped) and the regexes structspec writes itself (numeric bounds in
`numbers`, formats and patterns in `strings`, objects with ``patternProperties`` in `objects`);
``enum`` and ``const`` values are checked in `literals`.
"""

from __future__ import annotations

import json
import warnings
from functools import lru_cache
from typing import Any

from structspec.errors import SchemaError, StructspecWarning
from structspec.schema import reach
from structspec.schema.bounds import Digits
from structspec.schema.difference import difference
from structspec.schema.emit import Rewrites
from structspec.schema.keywords import (
    BOUNDS,
    COUNTS,
    JSON_TYPES,
    KEYWORD_TYPES,
    TYPE_KEYWORDS,
    VALIDATION,
    is_annotation,
    misspelled,
    overlap,
    type_set,
)
from structspec.schema.literals import check_literals
from structspec.schema.merge import excludes, merge, opens
from structspec.schema.numbers import check_number
from structspec.schema.objects import UNLISTED, check_object
from structspec.schema.pointers import Document, join
from structspec.schema.recursion import MAX_RECURSION_DEPTH
from structspec.schema.strings import check_string

# The keywords outlines-core dispatches on, in its order.
_DISPATCH = ("properties", "patternProperties", "anyOf", "oneOf", "prefixItems", "enum", "const", "$ref", "type")

# A node whose one validation keyword is one of these types: its regex is the type's, nothing to check or rewrite.
_PLAIN = ("string", "boolean", "null")  # (a tuple: a type may be a list, which no set can look up)

# The validation keywords a node of one type may hold with nothing for `_rewritten` to do (no other type's keyword
# to drop, no sibling to merge into subschemas, no count or dependency to split by): most nodes that hold more than
# 'type'. A node holding others, or whose counts are floats, array items or required names missing from its
# properties, takes the full test.
_QUIET = {kind: frozenset({"type", "enum", "const", *extra}) for kind, extra in (
    ("string", ("minLength", "maxLength", "pattern", "format")), ("number", BOUNDS), ("integer", BOUNDS),
    ("boolean", ()), ("null", ()), ("array", ("items", "minItems", "maxItems")),
    ("object", ("properties", "required", "additionalProperties", "patternProperties")))}
_COUNT_KEYWORDS = frozenset(k for pair in COUNTS for k in pair)


# The fix a keyword structspec cannot enforce ends in (the CLI names its own flag instead: `tools.extract`).
STRICT_FIX = "; or pass strict=False to compile without it (a warning lists each keyword dropped)"


@lru_cache(maxsize=None)
def _type_keywords(types: tuple[str, ...]) -> frozenset[str]:
    """The keywords that apply to values of ``types``, 'type' included (a few type lists: computed once)."""
    return frozenset().union(*(TYPE_KEYWORDS[t] for t in types)) | {"type"}


def _quiet(node: dict[str, Any], keys: list[str]) -> bool:
    """Whether `_Checker._rewritten` certainly leaves ``node`` (its validation keywords ``keys``) as it is: a
    quick answer for most nodes (see `_QUIET`); False where it may not."""
    quiet = _QUIET.get(node["type"]) if type(node.get("type")) is str else None
    if quiet is None or not quiet.issuperset(keys) or type(node.get("items")) is list:
        return False
    if any(type(node[k]) is float for k in keys if k in _COUNT_KEYWORDS):
        return False
    properties = node.get("properties", {})
    return all(name in properties for name in node.get("required", ()))


def check(document: Document, strict: bool, whitespace_pattern: str, digits: Digits = Digits(),
          open_objects: bool = False, nesting: int = MAX_RECURSION_DEPTH) -> Rewrites:
    """The rewrites that emit ``document``'s schema exactly, or narrowed as listed in ``narrowings`` (``digits``
    bounds the numbers the schema leaves unbounded; ``open_objects`` also writes the members an absent
    ``additionalProperties`` allows beside listed ``properties``; values no schema describes nest ``nesting``
    levels); raises `SchemaError` if it admits no value or uses a keyword that would not be enforced
    (``strict=False``: drops it, listed in ``dropped``). The schema is a valid JSON Schema (`check_json`,
    `check_metaschema`), or one `recursion.unroll` made of one (which returns its document).

    Does not change the schema.
    """
    checker = _Checker(Rewrites(document, whitespace_pattern, digits, open_objects, nesting), strict)
    checker.walk(document.root, "", ())
    if checker.rewrites.misspelled:
        # JSON Schema ignores keywords it does not define (jsonschema does too), so a schema with a typo
        # compiles: said, not refused
        warnings.warn("these keywords are not JSON Schema keywords, so they constrain nothing (as for every JSON "
                      "Schema validator), and look misspelled: " + ", ".join(
                          f"{key!r} at {ptr or '/'} (did you mean {meant!r}?)"
                          for (key, ptr), meant in checker.rewrites.misspelled.items())
                      + "; fix the spelling, or name an extension x-…", StructspecWarning, stacklevel=4)
    return checker.rewrites


class _Checker:
    """One walk over one schema document, recording what it decides in ``rewrites``."""

    def __init__(self, rewrites: Rewrites, strict: bool) -> None:
        self.rewrites = rewrites
        self.document = rewrites.document
        self.strict = strict
        self._walked: set[int] = set()  # id(node) of nodes checked without error
        # Rewritten nodes entered and not yet left: inside one, a node may come from elsewhere in the document (a
        # merge takes subschemas from its parts), so its pointer is looked up; elsewhere the walk's path is it.
        self._rewritten_depth = 0

    @property
    def located(self) -> bool:
        """Whether a rewritten node is being walked (see `Walk.located`). Does not change the walk."""
        return self._rewritten_depth > 0

    def walk(self, node: Any, ptr: str, refs: tuple[str, ...]) -> None:
        """Check ``node``: ``ptr`` is where it sits if it is no node of the document (a merged copy),
        ``refs`` the references followed to reach it."""
        if node is True or id(node) in self._walked:
            return  # (a definition met again: checked once, and without a cycle, so it stays checked)
        self._note_misspellings(node, ptr)
        keys = [k for k in node if k in VALIDATION]
        if keys == ["type"] and node["type"] in _PLAIN:  # most of a schema's nodes
            self._walked.add(id(node))
            return
        if self._rewritten_depth:
            ptr = self.document.pointer(node, ptr)
        # (a node whose one validation keyword is 'type' has nothing to rewrite)
        rewritten = self._rewritten(node, ptr, refs) if keys and keys != ["type"] and not _quiet(node, keys) else None
        kind = None
        if rewritten is not None:
            self.rewrites.replace(node, rewritten[0])
            self._rewritten_depth += 1
            try:
                self.walk(*rewritten)
            finally:
                self._rewritten_depth -= 1
        elif keys:
            kind = self._kind(node)
            if kind is None:
                for key in keys:
                    self.unenforced(node, key, ptr, "keyword without 'type' is not supported")
            elif kind in ("properties", "patternProperties"):
                check_object(self, node, ptr, refs)
            else:
                getattr(self, "_" + kind.strip("$"))(node, ptr, refs)
        if id(node) not in self.rewrites.replaced and (kind is None or id(node) in self.rewrites.drops) and (
                self._kind(node) is None):  # (dropping a keyword may have left the node without one to dispatch on)
            self._reject_unknown(node, ptr)
        self._walked.add(id(node))

    def _kind(self, node: dict[str, Any]) -> str | None:
        """The first keyword of `_DISPATCH` that ``node`` holds and that was not dropped, or None."""
        dropped = self.rewrites.dropped_in(node)
        return next((k for k in _DISPATCH if k in node and k not in dropped), None)

    def _note_misspellings(self, node: dict[str, Any], ptr: str) -> None:
        """Record the keywords of ``node`` that JSON Schema does not define and that likely misspell one it does
        (`keywords.misspelled`), for the warning `check` gives."""
        for key in node:
            if key not in VALIDATION and not is_annotation(key):
                meant = misspelled(key)
                if meant is not None:
                    where = self.document.pointer(node, ptr) if self._rewritten_depth else ptr
                    self.rewrites.misspelled[(key, where)] = meant

    def _reject_unknown(self, node: dict[str, Any], ptr: str) -> None:
        """A node whose only keywords are unknown admits any value, as JSON Schema ignores them: likely a
        misspelling, so refused, unless the keywords are vendor extensions (``x-…``), annotations by name."""
        unknown = next((k for k in node if k not in VALIDATION and not is_annotation(k)), None)
        if unknown is not None:
            meant = misspelled(unknown)
            guess = f"did you mean {meant!r}?" if meant else "a misspelling, like 'ref' for '$ref'?"
            raise SchemaError(unknown, ptr, f"not a JSON Schema keyword ({guess}), in a node with no other: it "
                              "would admit any value (fix the spelling, or name a vendor extension x-…)")

    def sub(self, node: Any, ptr: str, refs: tuple[str, ...], keyword: str, *names: Any) -> None:
        """Check the subschema of ``keyword`` (under ``names``) of the node at ``ptr``."""
        if node is False:
            raise SchemaError(keyword, ptr, f"the schema at {join(ptr, keyword, *names)} is false, "
                              "which admits no value")
        if node is True and keyword != "additionalProperties":  # the one place outlines-core reads true
            raise SchemaError(keyword, ptr, f"the schema at {join(ptr, keyword, *names)} is true, which "
                              "outlines-core cannot translate; write {} for any value")
        self.walk(node, join(ptr, keyword, *names), refs)

    def _rewritten(self, node: dict[str, Any], ptr: str, refs: tuple[str, ...]) -> tuple[Any, str, tuple] | None:
        """An equivalent or narrower node that outlines-core can translate (to walk with its pointer
        and references), or None to keep ``node``.

        Keywords of types the node excludes go; the array form of ``items`` becomes
        ``prefixItems`` (exactly that many items); required names missing from
        ``properties`` join it with the ``additionalProperties`` schema; the siblings
        of ``allOf``, ``$ref``, ``anyOf`` and ``oneOf`` merge into their subschemas,
        as a value must match both.
        """
        integral = {k: int(node[k]) for pair in COUNTS for k in pair if type(node.get(k)) is float}
        if integral:  # JSON Schema reads 2.0 as the integer 2 (the metaschema let only integral ones through)
            return node | integral, ptr, refs
        if "type" not in node and any(k in KEYWORD_TYPES for k in node) and self._kind(node) is None and not (
                self.has(node, "not")):
            # JSON Schema applies a type's keywords to values of that type and lets the others through
            return node | {"type": list(JSON_TYPES)}, ptr, refs
        types = type_set(node["type"]) if "type" in node else None
        if types is not None and len(types - {"integer"}) > 1 and any(
                k in node for k in ("properties", "patternProperties", "prefixItems")):
            # those keywords dispatch to an object or array alone: one branch per type keeps the others
            return {"anyOf": [node | {"type": t} for t in sorted(types)]}, ptr, refs
        inapplicable = {k for k in node if types is not None and k in KEYWORD_TYPES
                        and not overlap(KEYWORD_TYPES[k], types)}
        if "additionalItems" in node and not isinstance(node.get("items"), list):
            inapplicable.add("additionalItems")  # it only follows the array form of items
        if inapplicable:
            return {k: v for k, v in node.items() if k not in inapplicable}, ptr, refs
        if isinstance(node.get("items"), list) and "prefixItems" not in node:
            rest = {k: v for k, v in node.items() if k not in ("items", "additionalItems")}
            return rest | {"prefixItems": node["items"]}, ptr, refs
        missing = [n for n in node.get("required", []) if n not in node.get("properties", {})]
        if missing and "patternProperties" not in node:
            extra = node.get("additionalProperties", True)
            if extra is False:
                raise SchemaError("required", ptr, f"required property {missing[0]!r} is neither in 'properties' "
                                  "nor allowed by additionalProperties")
            added = {n: {} if extra is True else extra for n in missing}
            return node | {"properties": node.get("properties", {}) | added}, ptr, refs
        siblings = [k for k in node if k in VALIDATION and k not in ("allOf", "$ref", "anyOf", "oneOf")]
        if "allOf" in node:
            merged: Any = {k: v for k, v in node.items() if k != "allOf"}
            for sub in node["allOf"]:
                merged = None if merged is None else merge(merged, sub, self.document)
            return self._merged(node, "allOf", ptr, merged, refs)
        if "$ref" in node and (siblings or "anyOf" in node or "oneOf" in node):
            if node["$ref"] in refs:
                raise SchemaError("$ref", ptr, f"recursive reference {node['$ref']!r} is not supported")
            rest = {k: v for k, v in node.items() if k != "$ref"}
            merged = merge(rest, self.document.resolve(node), self.document)
            return self._merged(node, "$ref", ptr, merged, refs + (node["$ref"],))
        for key in ("anyOf", "oneOf"):
            if key in node and len(siblings) + ("anyOf" in node) + ("oneOf" in node) > 1:
                rest = {k: v for k, v in node.items() if k != key}
                branches = [merge(rest, sub, self.document) for sub in node[key]]
                if any(b is None for b in branches):
                    self.unenforced(node, key, ptr, "its branches cannot be merged with the keywords beside it")
                    return None
                if not any(branches):
                    raise SchemaError(key, ptr, "no branch admits a value that matches the keywords beside it")
                return {key: [b for b in branches if b is not False]}, ptr, refs
        return self._reached(node, ptr, refs)

    def _reached(self, node: dict[str, Any], ptr: str, refs: tuple[str, ...]) -> tuple[Any, str, tuple] | None:
        """The rewrite of `reach` for ``not``, a ``oneOf`` whose branches may overlap, unique items, or property
        counts and dependencies; None if the node has none of them. Under ``strict=False`` a keyword that
        cannot be rewritten is dropped."""
        try:
            if self.has(node, "not"):
                texts = reach.excluded_texts(node, self.document, ptr)
                if texts is not None:
                    return self._without_texts(node, ptr, refs, texts), ptr, refs
                return reach.without_not(node, self.document, ptr), ptr, refs
            wide = self.rewrites.open_objects
            if self.has(node, "oneOf") and not all(excludes(x, y, self.document, wide)
                                                   for i, x in enumerate(node["oneOf"])
                                                   for j, y in enumerate(node["oneOf"]) if i != j):
                return reach.exactly_one(node, self.document, ptr, wide), ptr, refs
            if node.get("uniqueItems") is False:
                return {k: v for k, v in node.items() if k != "uniqueItems"}, ptr, refs
            if self.has(node, "uniqueItems"):
                return reach.unique_arrays(node, self.document, ptr), ptr, refs
            if isinstance(node.get("properties"), dict) and "patternProperties" not in node and (
                    reach.counts_properties(node)):
                branches = reach.property_branches(node, ptr)
                if opens(node, self.rewrites.open_objects):
                    # each branch counts listed members only: an unlisted one would go uncounted
                    self.rewrites.narrow(ptr, UNLISTED + " (with property counts or dependencies)")
                    branches = {"anyOf": [b | {"additionalProperties": False}
                                          for b in branches.get("anyOf", [branches])]}
                return branches, ptr, refs
        except SchemaError as e:
            self.unenforced(node, e.keyword, ptr, e.reason)
        return None

    def _without_texts(self, node: dict[str, Any], ptr: str, refs: tuple[str, ...], texts: list[str]) -> dict[str, Any]:
        """``node`` less its ``not`` (checked here), less ``texts``: the hole's node that stands for it."""
        rest = {k: v for k, v in node.items() if k != "not"}
        self.walk(rest, ptr, refs)
        kept = self.rewrites.items(rest, ptr)
        try:
            items = difference(kept, texts)
        except ValueError as e:
            raise SchemaError("not", ptr, f"the values cannot be removed from the node's regex: {e}") from None
        if items is None:
            raise SchemaError("not", ptr, "every value the node admits is excluded")
        return self.rewrites.hole(node, items)

    def _merged(self, node: dict[str, Any], key: str, ptr: str, merged: Any, refs: tuple[str, ...]) -> Any:
        if merged is False:
            raise SchemaError(key, ptr, "no value matches all of its subschemas")
        if merged is None:
            self.unenforced(node, key, ptr, "its subschemas set the same keyword differently "
                            "or interact (additionalProperties, items)")
            return None
        return merged, ptr, refs

    def unenforced(self, node: dict[str, Any], key: str, ptr: str, reason: str) -> None:
        if self.strict:
            raise SchemaError(key, ptr, reason + STRICT_FIX)
        self.rewrites.drop(node, key, ptr)

    def has(self, node: dict[str, Any], key: str) -> bool:
        return self.rewrites.has(node, key)

    def reject_others(self, node: dict[str, Any], ptr: str, allowed: set[str]) -> None:
        for key in node:
            if key in VALIDATION and key not in allowed:
                self.unenforced(node, key, ptr, "not enforced by the regex translation")

    def _anyOf(self, node: dict[str, Any], ptr: str, refs: tuple[str, ...]) -> None:
        self._branches(node, ptr, refs, "anyOf")

    def _oneOf(self, node: dict[str, Any], ptr: str, refs: tuple[str, ...]) -> None:
        self._branches(node, ptr, refs, "oneOf")  # no value matches two: `_reached` rewrote overlapping ones

    def _branches(self, node: dict[str, Any], ptr: str, refs: tuple[str, ...], key: str) -> None:
        self.reject_others(node, ptr, {key})
        for i, sub in enumerate(node[key]):
            self.sub(sub, ptr, refs, key, i)

    def _prefixItems(self, node: dict[str, Any], ptr: str, refs: tuple[str, ...]) -> None:
        self.reject_others(node, ptr, {"prefixItems", "type", "items", "minItems", "maxItems"})
        n = len(node["prefixItems"])
        if node.get("minItems", 0) > n or node.get("maxItems", n) < n:
            raise SchemaError("minItems" if node.get("minItems", 0) > n else "maxItems", ptr,
                              "item count bounds that exclude exactly the prefix items")
        for i, sub in enumerate(node["prefixItems"]):
            self.sub(sub, ptr, refs, "prefixItems", i)

    def _enum(self, node: dict[str, Any], ptr: str, refs: tuple[str, ...]) -> None:
        check_literals(self, node, ptr, "enum", node["enum"])

    def _const(self, node: dict[str, Any], ptr: str, refs: tuple[str, ...]) -> None:
        check_literals(self, node, ptr, "const", [node["const"]])

    def _ref(self, node: dict[str, Any], ptr: str, refs: tuple[str, ...]) -> None:
        self.reject_others(node, ptr, {"$ref"})
        ref = node["$ref"]
        if ref in refs:
            raise SchemaError("$ref", ptr, f"recursive reference {ref!r} is not supported")
        target = self.document.resolve(node)
        if not isinstance(target, dict):  # outlines-core cannot translate true either
            raise SchemaError("$ref", ptr, f"reference {ref!r} leads to {json.dumps(target)[:60]}, not to a "
                              "schema object; point it at one ({} for any value)")
        self.walk(target, ref.lstrip("#"), refs + (ref,))

    def _type(self, node: dict[str, Any], ptr: str, refs: tuple[str, ...]) -> None:
        types = [node["type"]] if isinstance(node["type"], str) else list(node["type"])
        allowed = _type_keywords(tuple(types))
        for key in node:  # (keywords of the types not listed are gone: see _rewritten)
            if key in VALIDATION and key not in allowed:
                self.unenforced(node, key, ptr, f"not enforced for type {node['type']!r}")
        numbers = self.rewrites.digits.bounded and {"integer", "number"} & set(types)
        if len(types) > 1 and (numbers or any(k in KEYWORD_TYPES and self.has(node, k) for k in node)):
            # rewrites (holes, patterns) are per type: split the node into one branch per type
            branches = [{k: v for k, v in node.items() if t in KEYWORD_TYPES.get(k, {t}) and self.has(node, k)}
                        | {"type": t} for t in types]
            self.rewrites.replace(node, {"anyOf": branches})
            for branch in branches:
                self.walk(branch, ptr, refs)
            return
        for low, high in COUNTS:  # outlines-core would reject or loosen the contradiction
            if self.has(node, low) and self.has(node, high) and node[low] > node[high]:
                raise SchemaError(low, ptr, f"{low} {node[low]} is greater than {high} {node[high]}: "
                                  "no value has both")
        if types[0] in ("integer", "number"):
            check_number(self, node, ptr, types[0])
        if "string" in types:
            check_string(self, node, ptr)
        if "array" in types and "items" in node:
            self.sub(node["items"], ptr, refs, "items")
        if "object" in types:
            # outlines-core tells only "no property" from "some": any other count goes unchecked
            if self.has(node, "minProperties") and node["minProperties"] > 1:
                self.unenforced(node, "minProperties", ptr, "only 0 or 1 is enforced without 'properties'")
            if self.has(node, "maxProperties") and node["maxProperties"] > 0:
                self.unenforced(node, "maxProperties", ptr, "only 0 is enforced without 'properties'")
            extra = node.get("additionalProperties", True)
            if extra is not False:
                self.sub(extra, ptr, refs, "additionalProperties")
