"""Object nodes: listed ``properties`` (outlines-core's object, or structspec's where unlisted members are
written) and ``patternProperties`` (structspec's object: listed members, then pattern-named ones). Records
its rewrites in the walk; changes no schema."""

from __future__ import annotations

from typing import Any

from structspec.errors import SchemaError
from structspec.schema.keywords import same
from structspec.schema.merge import opens
from structspec.schema.patterns import (
    ASCII_CLASSES,
    ascii_classes,
    disjoint_patterns,
    key_regex,
    search,
    unbuildable,
)
from structspec.schema.walk import Walk

UNLISTED = "members 'properties' does not list are not written"
"""The narrowing of an object whose ``additionalProperties`` allows members its ``properties`` do not list."""


def check_object(walk: Walk, node: dict[str, Any], ptr: str, refs: tuple[str, ...]) -> None:
    """Check an object node of listed ``properties`` or of ``patternProperties``."""
    if "patternProperties" in node:
        _pattern_properties(walk, node, ptr, refs)
        return
    allowed = {"properties", "required", "type", "additionalProperties"}
    # outlines-core writes each listed property at most once, the required ones always, and no others
    if node.get("minProperties", 0) <= len(set(node.get("required", []))):
        allowed.add("minProperties")
    if node.get("maxProperties", len(node["properties"])) >= len(node["properties"]):
        allowed.add("maxProperties")
    walk.reject_others(node, ptr, allowed)
    required = set(node.get("required", []))
    for name in required:
        if name not in node["properties"]:
            raise SchemaError("required", ptr, f"required property {name!r} is not in 'properties'")
        if node["properties"][name] is False:
            raise SchemaError("properties", ptr, f"required property {name!r} has the schema false, which "
                              "admits no value")
    extra = node.get("additionalProperties", True)
    wide = opens(node, walk.rewrites.open_objects)
    opened = wide and not walk.has(node, "maxProperties")
    why = " (with maxProperties)" if wide else " (open_objects=False)"
    if opened:
        try:
            walk.sub(extra, ptr, refs, "additionalProperties")
        except SchemaError as e:  # members it cannot describe are left out: narrower, and listed
            opened, why = False, f" (additionalProperties: {e})"
    forbidden = [name for name, sub in node["properties"].items() if sub is False]  # names never written
    if forbidden and not opened:  # listed properties only: leaving them out is exact
        rest = node | {"properties": {n: sub for n, sub in node["properties"].items() if sub is not False}}
        walk.rewrites.replace(node, rest)
        walk.walk(rest, ptr, refs)
        return
    for name, sub in node["properties"].items():
        if sub is not False:
            walk.sub(sub, ptr, refs, "properties", name)
    if extra is False:
        return
    if not opened:
        walk.rewrites.narrow(ptr, UNLISTED + why)
        return
    fields = [(name, sub, name in required) for name, sub in node["properties"].items() if sub is not False]
    located = walk.located
    walk.rewrites.hole(node, walk.rewrites.object_regex(fields, [], ptr, extra, forbidden, located))


def _pattern_properties(walk: Walk, node: dict[str, Any], ptr: str, refs: tuple[str, ...]) -> None:
    """Translate the object itself: listed properties in order, then any number of pattern-named ones.

    Names that match no pattern are left out even where additionalProperties
    would allow them (narrower: a regex cannot say "matches none of these").
    """
    props, patterns = node.get("properties", {}), node["patternProperties"]
    required = list(dict.fromkeys(node.get("required", [])))
    extra = node.get("additionalProperties", True)
    walk.reject_others(node, ptr, {"properties", "patternProperties", "additionalProperties", "required", "type"}
                       | ({"minProperties"} if node.get("minProperties", 0) <= len(required) else set()))
    keys = {p: key_regex(p) for p in patterns}
    clash = next((f"pattern {p!r} cannot be read as a JSON-safe, anchored-or-not regular expression"
                  for p, key in keys.items() if key is None), None)
    clash = clash or next((f"pattern {p!r} cannot be built: {reason}" for p, key in keys.items()
                           if (reason := unbuildable(key)) and not reason.startswith("it matches no string")),
                          None)
    clash = clash or next((f"patterns {p!r} and {q!r} may match the same name with different schemas"
                           for p in patterns for q in patterns if p < q and not same(patterns[p], patterns[q])
                           and not disjoint_patterns(p, q)), None)
    fields = []  # the listed properties, then the required names only patterns or additionalProperties give
    for name, sub in props.items():
        matching = [p for p in patterns if search(p, name)]
        if any(patterns[p] is False for p in matching):  # the name is forbidden: never written
            if name in required:
                raise SchemaError("patternProperties", ptr, f"required property {name!r} matches a pattern "
                                  "whose schema is false")
            continue
        # a value must match both schemas: accepted where the pattern's adds nothing (no merge: it would copy
        # an unrolled DAG as a tree)
        clash = clash or next((f"pattern {p!r} also matches property {name!r}, whose value would need both "
                               "schemas" for p in matching if patterns[p] not in (True, {}) and patterns[p] is
                               not sub), None)
        fields.append((name, sub, name in required))
    listed = len(fields)
    takes_extra = False  # whether a required name no pattern matches takes the additionalProperties schema
    for name in (n for n in required if n not in props):
        matching = [p for p in patterns if search(p, name)]
        if len(matching) > 1 or (not matching and extra is False):
            clash = clash or f"required property {name!r} matches {len(matching)} patterns"
        if matching and patterns[matching[0]] is False:
            raise SchemaError("patternProperties", ptr, f"required property {name!r} matches pattern "
                              f"{matching[0]!r}, whose schema is false")
        takes_extra = takes_extra or not matching
        fields.append((name, patterns[matching[0]] if matching else {} if extra is True else extra, True))
    if clash:
        walk.unenforced(node, "patternProperties", ptr, clash)
        rest = {k: v for k, v in node.items() if k != "patternProperties"}
        walk.rewrites.replace(node, rest)
        walk.walk(rest, ptr, refs)
        return
    if extra is not False:
        walk.rewrites.narrow(ptr, "members no listed property or pattern names are not written")
    for p in (p for p, sub in patterns.items() if sub is not False and ascii_classes(p)):
        walk.rewrites.narrow(ptr, f"patternProperties pattern {p!r} {ASCII_CLASSES}")
    for name, sub, _ in fields[:listed]:
        walk.sub(sub, ptr, refs, "properties", name)
    if takes_extra:
        walk.sub(extra, ptr, refs, "additionalProperties")
    allowed = {p: sub for p, sub in patterns.items() if sub is not False}  # names matching the others: never
    for p, sub in allowed.items():
        walk.sub(sub, ptr, refs, "patternProperties", p)
    walk.rewrites.hole(node, walk.rewrites.object_regex(
        fields, [(keys[p], sub, p) for p, sub in allowed.items()], ptr, located=walk.located))
