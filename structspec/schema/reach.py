"""Keywords a regex cannot state directly, rewritten into equivalent nodes the translation can: property
counts and dependencies (one branch per allowed set of optional members), unique items (one branch per
arrangement of the item values), ``not`` (over a type, removing values from a finite set, or removing a finite
set of strings or integers from a string or integer node), and a ``oneOf`` whose branches overlap (the
values that match exactly one branch); recursive ``$ref`` is `recursion`'s. Each rewrite is exact, or a
`SchemaError` naming keyword and pointer. No input is changed (the document learns where the new nodes sit,
so errors in them name the node they came from).
"""

from __future__ import annotations

from itertools import combinations, permutations, product
from math import perm, prod
from typing import Any

from structspec.errors import SchemaError
from structspec.schema.keywords import (
    JSON_TYPES,
    VALIDATION,
    has_type,
    json_type,
    same,
    type_set,
)
from structspec.schema.merge import excludes, merge, opens
from structspec.schema.pointers import Document
from structspec.schema.validation import validator

MAX_OPTIONAL = 8
"""Property counts and dependencies are enforced by one branch per set of optional members present, so for at
most this many optional members (2**8 = 256 sets)."""

MAX_ARRANGEMENTS = 256
"""``uniqueItems`` is enforced by one branch per arrangement of distinct item values, up to this many."""

MAX_SPELLINGS = 1024
"""``not`` removes a string by each of its spellings (a slash is written ``/`` or ``\\/``), up to this many."""

_COUNTING = ("minProperties", "maxProperties", "dependentRequired", "dependencies")
# How outlines-core's string regex writes the characters it escapes (a slash either way); it writes every other
# character as itself. structspec's patterns match no backslash, so they write a value in at most one of these.
_ESCAPES = {'"': ['\\"'], "\\": ["\\\\"], "/": ["/", "\\/"], "\b": ["\\b"], "\f": ["\\f"], "\n": ["\\n"],
            "\r": ["\\r"], "\t": ["\\t"]}


def counts_properties(node: dict[str, Any]) -> bool:
    """Whether ``node`` (an object with listed ``properties``) bounds which of them are present beyond
    ``required``: counts the translation would not enforce, or dependencies."""
    props, required = node.get("properties", {}), set(node.get("required", []))
    return ("dependentRequired" in node or "dependencies" in node or node.get("minProperties", 0) > len(required)
            or node.get("maxProperties", len(props)) < len(props))


def property_branches(node: dict[str, Any], ptr: str) -> dict[str, Any]:
    """``node`` as one branch per set of present members that its counts and dependencies allow, each branch
    with exactly those members required (objects are written with listed properties only, so the count of
    members is the count of properties). `SchemaError` above `MAX_OPTIONAL` optional members or when no set
    is allowed."""
    keyword = next(k for k in _COUNTING if k in node) if any(k in node for k in _COUNTING) else "properties"
    props, required = node["properties"], set(node.get("required", []))
    depends = {**_dependencies(node, ptr), **node.get("dependentRequired", {})}
    optional = [n for n in props if n not in required]
    if len(optional) > MAX_OPTIONAL:
        raise SchemaError(keyword, ptr, f"{len(optional)} optional properties: counts and dependencies are "
                          f"enforced by listing each set of present members, for at most {MAX_OPTIONAL} optional "
                          "ones; make more of them required or split the object")
    low, high = node.get("minProperties", 0), node.get("maxProperties", len(props))
    rest = {k: v for k, v in node.items() if k not in _COUNTING}
    branches = []
    for size in range(len(optional) + 1):
        for chosen in combinations(optional, size):
            present = required | set(chosen)
            if low <= len(present) <= high and all(set(needs) <= present for n, needs in depends.items()
                                                   if n in present):
                names = [n for n in props if n in present]
                branches.append(rest | {"properties": {n: props[n] for n in names}, "required": names})
    if not branches:
        raise SchemaError(keyword, ptr, "no set of the listed properties satisfies the property counts and "
                          "dependencies together")
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def _dependencies(node: dict[str, Any], ptr: str) -> dict[str, list[str]]:
    """The property-presence form of draft 7's ``dependencies``; `SchemaError` for its schema form."""
    found = node.get("dependencies", {})
    if not all(isinstance(v, list) for v in found.values()):
        raise SchemaError("dependencies", ptr, "a schema dependency (a subschema applied when a property is "
                          "present) is not supported; only lists of property names (dependentRequired)")
    return found


def unique_arrays(node: dict[str, Any], document: Document, ptr: str) -> dict[str, Any]:
    """An array node with ``uniqueItems: true`` as one branch per arrangement of distinct item values (items
    an enum, a const or a boolean). `SchemaError` for other items, other array keywords, or more than
    `MAX_ARRANGEMENTS` arrangements: a regex cannot remember which items came before."""
    others = [k for k in node if k in VALIDATION and k not in ("type", "items", "uniqueItems", "minItems",
                                                                "maxItems")]
    items = document.resolve(node["items"]) if isinstance(node.get("items"), dict) else None
    values = None if items is None or others else _finite_values(items)
    if values is None:
        raise SchemaError("uniqueItems", ptr, "enforced only for arrays whose items are an enum, a const or a "
                          "boolean (with type, minItems and maxItems beside it): a regex cannot remember which "
                          "items came before")
    choices = _distinct(values)
    low, high = node.get("minItems", 0), min(node.get("maxItems", len(choices)), len(choices))
    if low > high:
        raise SchemaError("uniqueItems", ptr, f"minItems {low} is more than the {len(choices)} distinct values "
                          "the items can take")
    count = sum(perm(len(choices), k) for k in range(low, high + 1))
    if count > MAX_ARRANGEMENTS:
        raise SchemaError("uniqueItems", ptr, f"{count} arrangements of {len(choices)} distinct values: enforced "
                          f"by listing each, for at most {MAX_ARRANGEMENTS}; lower maxItems or shorten the enum")
    branches = [{"type": "array", "maxItems": 0} if not k else
                {"type": "array", "prefixItems": [{"const": v} for v in arrangement], "items": False}
                for k in range(low, high + 1) for arrangement in permutations(choices, k)]
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite_values(node: dict[str, Any]) -> list[Any] | None:
    """Every value ``node`` admits, when it is a scalar enum, const, boolean or null; None otherwise."""
    keys, types = {k for k in node if k in VALIDATION}, type_set(node.get("type", JSON_TYPES))
    if keys <= {"enum", "type"} and "enum" in node or keys <= {"const", "type"} and "const" in node:
        values = node.get("enum", [node.get("const")])
        if any(isinstance(v, (dict, list)) for v in values):
            return None
    elif keys == {"type"} and types <= {"boolean", "null"}:
        values = [True, False, None]
    else:
        return None
    return [v for v in values if any(has_type(v, t) for t in types)]


def without_not(node: dict[str, Any], document: Document, ptr: str) -> dict[str, Any]:
    """``node`` with its ``not`` folded in: the values of a finite node (enum, const, boolean, null) that the
    ``not`` schema rejects, a ``type`` less the excluded types (``not`` over a type alone), or, where ``not``
    admits finitely many values and ``node`` several types, one branch per type with the values of that type
    excluded. A string or integer node that loses values is `excluded_texts`' case. `SchemaError` otherwise:
    the regex layer has no complement, and a number has too many spellings to remove them."""
    sub = _not_of(node, document)
    rest = {k: v for k, v in node.items() if k != "not"}
    if sub is True or sub is False:
        if sub is True:
            raise SchemaError("not", ptr, "not: true admits no value")
        return rest or {"anyOf": [{"type": t} for t in JSON_TYPES]}
    values = _finite_values(rest)
    if values is not None:
        keep = [v for v in values if not _matches(document, sub, v)]
        if not keep:
            raise SchemaError("not", ptr, "every value the node admits is excluded")
        return {"enum": keep}
    if {k for k in sub if k in VALIDATION} == {"type"}:
        excluded = type_set(sub["type"]) | ({"integer"} if "number" in type_set(sub["type"]) else set())
        kept = [t for t in (type_set(node["type"]) if "type" in node else JSON_TYPES) if t not in excluded]
        if "integer" in excluded and "number" in kept:
            raise SchemaError("not", ptr, "numbers that are not integers cannot be told apart by the regex layer; "
                              "use type: integer or type: number")
        if not kept:
            raise SchemaError("not", ptr, "no type is left once the excluded types are removed")
        return rest | {"type": kept[0] if len(kept) == 1 else kept}
    excluded = _finite_values(sub)
    types = list(type_set(rest["type"]) if "type" in rest else JSON_TYPES)
    if excluded is not None and len(types) > 1:
        branches = []
        for t in types:
            hit = [v for v in excluded if has_type(v, t)]
            values = _finite_values(rest | {"type": t})
            if values is not None and all(_matches(document, {"enum": hit}, v) for v in values):
                continue  # (a boolean or null branch with every value excluded)
            branches.append(rest | {"type": t} | ({"not": {"enum": hit}} if hit else {}))
            document.adopt(branches[-1], node)
        return {"anyOf": branches}
    if excluded is not None and not any(has_type(v, types[0]) for v in excluded):
        return rest
    if excluded is not None and types[0] == "number":
        raise SchemaError("not", ptr, "a number has many spellings (1, 1.0, 10e-1), so 'not' removes values from "
                          "strings and integers only; use type: integer, or list the allowed values with enum")
    raise SchemaError("not", ptr, "the regex layer (Python's re syntax) has no complement or lookahead, so "
                      "'not' is enforced over a type alone, on an enum, const, boolean or null node, or as a finite "
                      "set of values (enum, const) removed from a node; list the allowed values with enum instead")


def excluded_texts(node: dict[str, Any], document: Document, ptr: str) -> list[str] | None:
    """The JSON texts the ``not`` of a string or integer ``node`` removes when it admits finitely many values
    (enum, const): every spelling the translation has for each excluded value of the node's type. None for
    other nodes, or when ``not`` excludes no value of that type. `SchemaError` for a string of more than
    `MAX_SPELLINGS` spellings."""
    sub = _not_of(node, document)
    rest = {k: v for k, v in node.items() if k != "not"}
    values = _finite_values(sub) if isinstance(sub, dict) else None
    if values is None or _finite_values(rest) is not None or rest.get("type") not in ("string", "integer"):
        return None
    kind = rest["type"]
    hit = [v for v in values if has_type(v, kind)]
    return [text for v in hit for text in _spellings(v, kind, ptr)] or None


def _spellings(value: Any, kind: str, ptr: str) -> list[str]:
    """The JSON texts of ``value`` (a string or an integer) that a string or integer regex may match."""
    if kind == "integer":
        return [str(int(value))] + (["-0"] if value == 0 else [])
    ways = [_ESCAPES.get(c, [c]) for c in value]
    if (count := prod(map(len, ways))) > MAX_SPELLINGS:
        raise SchemaError("not", ptr, f"{value!r} has {count} spellings (each slash may be written \\/), more "
                          f"than the {MAX_SPELLINGS} removed one by one; list the allowed values with enum instead")
    return ['"' + "".join(spelling) + '"' for spelling in product(*ways)]


def exactly_one(node: dict[str, Any], document: Document, ptr: str, open_objects: bool = False) -> dict[str, Any]:
    """``node``'s ``oneOf`` as the values that match exactly one branch: each value of a finite branch (enum,
    const, boolean, null) that no other branch matches, and each other branch less the finite branches'
    values it matches (a string or integer node loses them as `excluded_texts` says). `SchemaError` where two
    infinite branches may overlap (they must differ by type, by value or by a required property's value), or
    where a branch cannot lose a value it shares (a number, a branch with a ``not`` of its own)."""
    branches = [(i, b) for i, b in enumerate(node["oneOf"]) if b is not False]
    if any(b is True for _, b in branches):
        raise SchemaError("oneOf", ptr, "a branch true matches every value, so the others match none alone")
    finite = {i: _finite_values(document.resolve(b)) for i, b in branches}
    infinite = [(i, b) for i, b in branches if finite[i] is None]
    if len(infinite) == len(branches) and (by_presence := _by_required([b for _, b in branches], document, ptr,
                                                                        open_objects)):
        return by_presence
    for i, x in infinite:
        for j, y in infinite:
            if i != j and not excludes(x, y, document, open_objects):
                raise SchemaError("oneOf", ptr, f"branches {i} and {j} may overlap (a value must match exactly "
                                  "one), and only values of enum, const, boolean or null branches are removed "
                                  "from the others; make them differ by type, by value or by a required "
                                  "property's value, or use anyOf if any branch will do")
    values = _distinct([v for i, _ in branches for v in finite[i] or []])
    matched = {_key(v): sum(_matches(document, b, v) for _, b in branches) for v in values}
    out = []
    for i, b in branches:
        if finite[i] is not None:
            if keep := [v for v in _distinct(finite[i]) if matched[_key(v)] == 1]:
                out.append({"enum": keep})
                document.adopt(out[-1], b)
            continue
        shared = [v for v in values if _matches(document, b, v)]
        types = type_set(document.resolve(b).get("type", JSON_TYPES))
        lost = next((v for v in shared if json_type(v) == "number" or json_type(v) == "integer" and "number" in types),
                    None)
        less = merge(b, {"not": {"enum": shared}}, document) if shared else b
        if lost is not None or less is None:
            why = (f"a number has too many spellings (1, 1.0, 10e-1) to remove {lost!r}" if lost is not None
                   else "its own 'not' cannot take the shared values too")
            raise SchemaError("oneOf", ptr, f"branch {i} overlaps an enum, const, boolean or null branch, and {why}; "
                              "list that branch's values with enum, or use anyOf if any branch will do")
        out.append(less)
        document.adopt(less, b)
    if not out:
        raise SchemaError("oneOf", ptr, "no value matches exactly one branch")
    return out[0] if len(out) == 1 else {"anyOf": out}


def _by_required(branches: list[Any], document: Document, ptr: str, open_objects: bool) -> dict[str, Any] | None:
    """``oneOf`` branches that are one object schema but for ``required`` (``{"oneOf": [{"required": ["radius"]},
    {"required": ["width", "height"]}]}`` beside ``properties``) as one branch per set of the names some branch
    requires that completes exactly one branch's names, those present and the rest of them left out (listed
    with the schema false where an open object (`opens`) would let them back in as unlisted members). None if the
    branches differ otherwise, or more than `MAX_OPTIONAL` names decide; `SchemaError` if no set completes
    exactly one branch."""
    nodes = [document.resolve(b) for b in branches]
    if not all(isinstance(n, dict) and isinstance(n.get("properties"), dict) for n in nodes):
        return None
    base = {k: v for k, v in nodes[0].items() if k != "required"}
    if any(k in base for k in (*_COUNTING, "patternProperties")) or not all(
            _shallow_same({k: v for k, v in n.items() if k != "required"}, base) for n in nodes[1:]):
        return None
    needs = [set(n.get("required", [])) for n in nodes]
    always = set.intersection(*needs)
    deciding = [n for n in base["properties"] if n not in always and any(n in need for need in needs)]
    if not set.union(*needs) <= set(base["properties"]) or len(deciding) > MAX_OPTIONAL:
        return None
    out = []
    for size in range(len(deciding) + 1):
        for chosen in combinations(deciding, size):
            present = always | set(chosen)
            if sum(need <= present for need in needs) == 1:
                left_out = set(deciding) - present
                kept = {n: False if n in left_out else v for n, v in base["properties"].items()
                        if opens(base, open_objects) or n not in left_out}
                out.append(base | {"properties": kept, "required": [n for n in kept if n in present]})
    if not out:
        raise SchemaError("oneOf", ptr, "no set of present properties completes exactly one branch's required ones")
    return out[0] if len(out) == 1 else {"anyOf": out}


def _shallow_same(a: Any, b: Any, depth: int = 0) -> bool:
    """Whether ``a`` and ``b`` are the same schema by their keys and, below those of a node and of its
    ``properties``, by identity (branches merged from one node share their subschemas): cheap on an unrolled
    DAG, which JSON equality would walk as a tree. False may be wrong (the caller then treats them as
    different); True is not."""
    if a is b:
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return depth < 2 and a.keys() == b.keys() and all(_shallow_same(a[k], b[k], depth + 1) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(not isinstance(x, (dict, list)) and same(x, y) for x, y in zip(a, b))
    return not isinstance(a, (dict, list)) and same(a, b)


def _not_of(node: dict[str, Any], document: Document) -> Any:
    return document.resolve(node["not"]) if isinstance(node["not"], dict) else node["not"]


def _matches(document: Document, schema: Any, value: Any) -> bool:
    """Whether ``value`` is valid against ``schema``, a node of ``document`` (its references resolved there)."""
    return validator(document.root).evolve(schema=schema).is_valid(value)


def _key(value: Any) -> tuple[str, Any]:
    """``value`` as jsonschema compares it: 1 and 1.0 are one value, 1 and true are two."""
    return ("number", value) if _is_number(value) else (type(value).__name__, value)


def _distinct(values: list[Any]) -> list[Any]:
    """``values`` without repeats (by `_key`), in order."""
    first: dict[tuple[str, Any], Any] = {}
    for v in values:
        first.setdefault(_key(v), v)
    return list(first.values())
