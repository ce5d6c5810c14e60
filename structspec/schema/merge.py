"""Two schema nodes read together: one node for "matches both" (`merge`), and whether nothing a node
yields can match the other (`excludes`, which lets ``oneOf`` work as ``anyOf``)."""

from __future__ import annotations

from typing import Any

from structspec.schema.keywords import BOUNDS, LITERALS, VALIDATION, overlap, same, type_set, types_of
from structspec.schema.pointers import Document


def merge(a: Any, b: Any, document: Document) -> Any:
    """One node for "matches ``a`` and ``b``": a dict, False if nothing matches both, None if not mergeable.

    Builds a new node; ``a`` and ``b`` are not changed (a copy of one of them takes its place in
    ``document``).
    """
    a, b = ({} if s is True else s for s in (a, b))
    if a is False or b is False:
        return False
    if not isinstance(a, dict) or not isinstance(b, dict):
        return None
    if "$ref" in a and "$ref" in b and a["$ref"] != b["$ref"]:
        target = document.resolve(b)
        if not isinstance(target, dict):
            return None
        b = target | {k: v for k, v in b.items() if k != "$ref"}
    for one, other in ((a, b), (b, a)):  # these keywords judge what their own node lists
        if one.get("additionalProperties", True) is not True and (
            not set(other.get("properties", {})) <= set(one.get("properties", {}))
            or other.get("patternProperties", {}) not in ({}, one.get("patternProperties"))
        ):
            return None
        if isinstance(one.get("items"), list) and "items" in other and not same(one["items"], other["items"]):
            return None
    out = {k: v for k, v in a.items() if k in VALIDATION}
    for key, value in b.items():
        if key not in VALIDATION or key in LITERALS:
            continue
        if key not in out or same(out[key], value):
            out[key] = value
            continue
        mine = out[key]
        if key == "type":
            both = type_set(mine) & type_set(value)
            if {"integer", "number"} <= type_set(mine) | type_set(value) and not both & {"integer", "number"}:
                both.add("integer")  # an integer is a number
            if not both:
                return False
            out[key] = sorted(both)
        elif key == "required":
            out[key] = mine + [n for n in value if n not in mine]
        elif key in ("properties", "patternProperties"):
            out[key] = {**mine, **value}
            for name in mine.keys() & value.keys():
                out[key][name] = merge(mine[name], value[name], document)
                if out[key][name] is None:
                    return None
        elif key in ("items", "additionalProperties", "propertyNames"):
            out[key] = merge(mine, value, document)
            if out[key] is None:
                return None
        elif key == "allOf":
            out[key] = mine + value
        elif key in ("minLength", "minItems", "minProperties", "maxLength", "maxItems", "maxProperties"):
            out[key] = (max if key.startswith("min") else min)(mine, value)
        elif key in BOUNDS and not any(isinstance(s.get(k), bool) for s in (a, b) for k in BOUNDS):
            out[key] = (max if "inimum" in key else min)(mine, value)
        else:
            return None
    literals = [s["enum"] if "enum" in s else [s["const"]] for s in (a, b) if "enum" in s or "const" in s]
    if literals:
        out.pop("const", None)
        out["enum"] = [v for v in literals[0] if all(any(same(v, w) for w in other) for other in literals[1:])]
        if not out["enum"]:
            return False
    for one, other in ((a, b), (b, a)):
        if not set(other) & VALIDATION:  # a copy of one side: errors in it point where that side is written
            document.adopt(out, one)
            break
    return out


def opens(node: dict[str, Any], open_objects: bool) -> bool:
    """Whether the object schema ``node`` is translated with the unlisted members ``additionalProperties``
    allows: where it names them (true or a schema), or where it is absent and ``open_objects`` reads it as JSON
    Schema does (true); a read of the schema only."""
    extra = node.get("additionalProperties")
    return extra is not False and (extra is not None or open_objects)


def excludes(x: Any, y: Any, document: Document, open_objects: bool = False, depth: int = 0) -> bool:
    """Whether no value translated from ``x`` (objects open as `opens` says) matches ``y``, so oneOf
    of the two works as anyOf."""
    x, y = _target(x, document), _target(y, document)
    if not isinstance(x, dict) or not isinstance(y, dict) or depth > 10:
        return False
    made, allowed = types_of(x, made=True), types_of(y, made=False)
    if made is not None and allowed is not None and not overlap(made, allowed):
        return True
    if ("enum" in x or "const" in x) and ("enum" in y or "const" in y):
        values = y.get("enum", [y.get("const")])
        return not any(same(v, w) for v in x.get("enum", [x.get("const")]) for w in values)
    if made != {"object"} or "properties" not in x:
        return False
    # x yields objects that always hold its required properties, each valued as x's schema for it says
    props, other = x["properties"], y.get("properties", {})
    for name in x.get("required", []):
        if name in props and name in other and excludes(props[name], other[name], document, open_objects,
                                                        depth + 1):
            return True
        if name not in other and y.get("additionalProperties", True) is False and not y.get("patternProperties"):
            return True
    plain = not any(k in x for k in ("allOf", "anyOf", "oneOf", "$ref", "patternProperties"))  # or more names
    closed = not opens(x, open_objects)  # no unlisted names either
    return plain and closed and any(n not in props and n not in x.get("required", []) for n in y.get("required", []))


def _target(node: Any, document: Document) -> Any:
    """``node``, or the schema a bare ``$ref`` (or chain of them) leads to."""
    for _ in range(10):
        if not (isinstance(node, dict) and set(node) & VALIDATION == {"$ref"}):
            break
        node = document.resolve(node)
    return node
