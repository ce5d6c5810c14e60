"""JSON Schema keyword tables (which keywords constrain, which types each applies to, what structspec
enforces) and the JSON types of values."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

ANNOTATIONS = frozenset(
    "title description examples default $schema $id $comment $anchor deprecated readOnly "
    "writeOnly contentEncoding contentMediaType discriminator $defs definitions".split()
)
"""Keywords that never constrain an instance; removed before translation."""


def is_annotation(keyword: str) -> bool:
    """Whether ``keyword`` never constrains an instance: one of `ANNOTATIONS`, or a vendor extension (``x-…``)."""
    return keyword in ANNOTATIONS or keyword.startswith("x-")

VALIDATION = frozenset(
    "type enum const multipleOf maximum exclusiveMaximum minimum exclusiveMinimum maxLength "
    "minLength pattern format maxItems minItems uniqueItems maxContains minContains "
    "maxProperties minProperties required dependentRequired dependencies properties "
    "patternProperties additionalProperties propertyNames items prefixItems additionalItems "
    "contains unevaluatedItems unevaluatedProperties allOf anyOf oneOf not if then else "
    "dependentSchemas $ref $dynamicRef $recursiveRef".split()
)
"""Every validation keyword of JSON Schema drafts 4 to 2020-12. Keywords outside this set (vendor
extensions) do not constrain instances for jsonschema either."""

LITERALS = ("enum", "const")
"""Keywords whose values are JSON data, not subschemas."""

NAMED = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies",
                   "dependentRequired"})
"""Keywords whose value maps names (of properties, patterns, definitions) to subschemas or lists of names."""

FORMATS = frozenset({"date-time", "date", "time", "duration", "email", "hostname", "ipv4", "ipv6", "uri", "uuid"})
"""The formats structspec enforces, each by the catalogue grammar of the same name (outlines-core's own
regexes can break the JSON string around them and read \\d as Unicode)."""

DEFINED_FORMATS = FORMATS | {
    "idn-email", "idn-hostname", "uri-reference", "iri", "iri-reference", "uri-template", "json-pointer",
    "relative-json-pointer", "regex",  # JSON Schema 2020-12
    "color", "host-name", "ip-address", "utc-millisec",  # draft 3
}
"""The formats a JSON Schema draft defines, which a validator may assert: one structspec does not enforce is a
`SchemaError`. Any other name is an annotation to every validator, so structspec does not enforce it either."""

BOUNDS = ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")
"""Numeric bounds, which structspec translates itself (outlines-core ignores them)."""

COUNTS = (("minLength", "maxLength"), ("minItems", "maxItems"), ("minProperties", "maxProperties"))
"""The lower and upper bounds of a count (of characters, items, properties) that structspec enforces."""

JSON_TYPES = ("null", "boolean", "object", "array", "number", "string")
"""JSON's value types (``integer`` is a kind of number)."""

TYPE_KEYWORDS = {
    "string": {"minLength", "maxLength", "pattern", "format"},
    "number": set(BOUNDS),
    "integer": set(BOUNDS),
    "boolean": set(),
    "null": set(),
    "array": {"items", "minItems", "maxItems"},
    "object": {"additionalProperties", "minProperties", "maxProperties"},
}
"""The keywords outlines-core (or structspec) honours for each JSON type (besides "type")."""

KEYWORD_TYPES: dict[str, set[str]] = {
    **{k: {"string"} for k in ("minLength", "maxLength", "pattern", "format")},
    **{k: {"number", "integer"} for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                           "multipleOf")},
    **{k: {"array"} for k in ("items", "minItems", "maxItems", "uniqueItems", "contains", "minContains",
                               "maxContains", "prefixItems", "additionalItems", "unevaluatedItems")},
    **{k: {"object"} for k in ("additionalProperties", "minProperties", "maxProperties", "required",
                                "properties", "patternProperties", "propertyNames", "dependentRequired",
                                "dependencies", "dependentSchemas", "unevaluatedProperties")},
}
"""The JSON types each validation keyword applies to (keywords absent here apply to all)."""


def type_set(types: Any) -> set[str]:
    """The value of ``type`` as a set."""
    return {types} if isinstance(types, str) else set(types)


def overlap(a: set[str], b: set[str]) -> bool:
    """Whether a value can have a type of ``a`` and one of ``b`` (integers are numbers)."""
    return bool(a & b) or ("integer" in a and "number" in b) or ("number" in a and "integer" in b)


def types_of(node: dict[str, Any], made: bool) -> set[str] | None:
    """The JSON types of the values ``node`` admits (``made``: that its translation yields); None: any."""
    if "type" in node:
        return type_set(node["type"])
    if "enum" in node or "const" in node:
        return {json_type(v) for v in node.get("enum", [node.get("const")])}
    return {"object"} if made and "properties" in node else None  # outlines-core makes objects from it


def json_type(value: Any) -> str:
    """The JSON type of a value (``1.0`` is an integer, as JSON Schema says)."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), "null")


def has_type(value: Any, kind: str) -> bool:
    """Whether ``value`` has the JSON type ``kind`` (``1.0`` is an integer, every integer a number, ``true``
    none)."""
    found = json_type(value)
    return found == kind or (kind == "number" and found == "integer")


def same(a: Any, b: Any) -> bool:
    """JSON equality (``1`` and ``true`` differ, unlike in Python)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@lru_cache(maxsize=1024)
def misspelled(keyword: str) -> str | None:
    """The validation keyword that ``keyword``, which JSON Schema does not define, likely misspells (``requried``:
    ``required``, ``maxlength``: ``maxLength``), or None. A name that opens with ``_`` (a keyword switched off),
    an annotation or an extension (``x-…``) misspells none; a keyword shorter than 5 letters only by case or
    two letters swapped (``tpye``), since short names (``note``, ``href``) are one edit from several."""
    if keyword in VALIDATION or is_annotation(keyword) or keyword.startswith("_"):
        return None
    key = keyword.lower().rstrip(":")
    edits, known = min((_edits(key, known.lower()), known) for known in VALIDATION)
    close = edits == 0 or (edits == 1 and (len(known) >= 5 or sorted(key) == sorted(known.lower()))) or (
        edits == 2 and len(known) >= 9)
    return known if close else None


def _edits(a: str, b: str) -> int:
    """Edits (insert, delete, replace a character, or swap two neighbours) that make ``a`` into ``b``, counted up to
    3 (a longer distance reads as 3)."""
    if abs(len(a) - len(b)) > 2:
        return 3
    before, row = None, list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            cost = min(row[j] + 1, current[j - 1] + 1, row[j - 1] + (x != y))
            if before is not None and i > 1 and j > 1 and x == b[j - 2] and a[i - 2] == y:
                cost = min(cost, before[j - 2] + 1)
            current.append(cost)
        before, row = row, current
    return min(row[-1], 3)
