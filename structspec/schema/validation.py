"""A schema's own draft (its ``$schema``, else the latest) as jsonschema reads it: the metaschema check and
the validator outputs are checked with."""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

import jsonschema
from jsonschema.protocols import Validator
from jsonschema_specifications import REGISTRY

from structspec.errors import SchemaError
from structspec.schema.keywords import NAMED
from structspec.schema.pointers import join

if TYPE_CHECKING:
    from referencing._core import Resolver  # (referencing exports no name for it)


def validator(schema: Any) -> Validator:
    """A validator for ``schema`` under its own draft, checking formats with that draft's format checker.

    A bare ``FormatChecker()`` mixes the drafts' checkers (draft 3's ``time``
    rejects the ``Z`` that RFC 3339 allows).
    """
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def check_metaschema(schema: Any) -> None:
    """Raise `SchemaError` (the metaschema keyword that fails, at the pointer of the bad value) if ``schema``
    is not a valid JSON Schema of its draft."""
    cls = jsonschema.validators.validator_for(schema)
    if _metaschema_validator(cls).is_valid(schema):
        return
    try:  # the error jsonschema's own check reports
        cls.check_schema(schema)
    except jsonschema.SchemaError as e:
        raise SchemaError(*_keyword_at(schema, e), f"not a valid JSON Schema: {e.message}") from None


@functools.cache
def _metaschema_validator(cls: type[Validator]) -> Validator:
    """What ``cls.check_schema`` validates with (the metaschema's validator, its format checker), over
    `flat_metaschema`."""
    meta = cls.META_SCHEMA
    checker = jsonschema.validators.validator_for(meta, default=cls)
    return checker(flat_metaschema(meta), format_checker=checker.FORMAT_CHECKER)


# The keywords of a vocabulary metaschema's root that name or describe it rather than constrain a schema.
_VOCABULARY_ROOT = frozenset(("$schema", "$id", "$vocabulary", "$dynamicAnchor", "$recursiveAnchor", "$defs",
                              "title", "$comment"))


def flat_metaschema(meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` as one schema of the same language: the vocabulary metaschemas its ``allOf`` names merged into
    its root, every ``$ref`` inlined, and the recursive reference (2019-09's ``$recursiveRef``, 2020-12's
    ``$dynamicRef``) a ``$ref`` to the root. ``meta`` itself where it has no ``allOf`` (drafts 3 to 7), or
    where its vocabularies disagree on a keyword.

    Drafts 2019-09 and 2020-12 resolve eight references per subschema of a checked schema (a ``$dynamicRef``,
    then an ``allOf`` of seven vocabularies): five times the cost of one schema's ``properties`` and a ``$ref``.
    """
    if "allOf" not in meta:
        return meta
    resolver = REGISTRY.resolver(base_uri=meta["$id"])
    vocabularies = [resolver.lookup(part["$ref"]) for part in meta["allOf"]]
    parts = [_inlined(found.contents, found.resolver) for found in vocabularies]
    parts.append(_inlined({k: v for k, v in meta.items() if k != "allOf"}, resolver))
    flat: dict[str, Any] = {"$schema": meta["$schema"], "properties": {}}
    for part in parts:
        for key, value in part.items():
            if key == "properties" and not set(value) & set(flat["properties"]):
                flat["properties"].update(value)
            elif key not in _VOCABULARY_ROOT and flat.setdefault(key, value) != value:
                return meta
    return flat


def _inlined(node: Any, resolver: Resolver) -> Any:
    """The metaschema ``node`` with each ``$ref`` replaced by its target (looked up with ``resolver``) and the
    recursive reference by ``{"$ref": "#"}``."""
    if isinstance(node, list):
        return [_inlined(n, resolver) for n in node]
    if not isinstance(node, dict):
        return node
    if node.get("$dynamicRef") == "#meta" or node.get("$recursiveRef") == "#":
        rest = {k: v for k, v in node.items() if k not in ("$dynamicRef", "$recursiveRef")}
        return {"$ref": "#"} if not rest else {**_inlined(rest, resolver), "allOf": [{"$ref": "#"}]}
    # (a name map such as "properties" may name a "$ref": its value is a subschema, never a str)
    out = {k: _inlined(v, resolver) for k, v in node.items() if k != "$ref" or not isinstance(v, str)}
    if isinstance(node.get("$ref"), str):
        found = resolver.lookup(node["$ref"])
        target = _inlined(found.contents, found.resolver)
        return {**target, **out} if not set(target) & set(out) else {**out, "allOf": [*out.get("allOf", []), target]}
    return out


def check_json(node: Any, path: tuple[Any, ...] = ()) -> None:
    """Raise `SchemaError` (the keyword holding it, at its node's pointer) at the first value of ``node`` that
    JSON cannot hold: an infinity, a NaN, a non-string key, or a Python object."""
    if isinstance(node, dict):
        for key, value in node.items():
            if not isinstance(key, str):
                _not_json(path, key, f"the key {key!r} is not a string")
            check_json(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            check_json(value, (*path, i))
    elif isinstance(node, float) and not math.isfinite(node):
        _not_json(path, None, f"{node} is not a JSON number (JSON has no infinities or NaN)")
    elif node is not None and not isinstance(node, (str, int, float, bool)):
        _not_json(path, None, f"a {type(node).__name__} is not a JSON value")


def _not_json(path: tuple[Any, ...], key: Any, reason: str) -> None:
    """Name the innermost string key of ``path`` (a keyword, or the name it maps) at the pointer before it."""
    names = [i for i, p in enumerate(path) if isinstance(p, str)]
    if not names:
        raise SchemaError(str(key), "", reason)
    at = names[-1]
    raise SchemaError(path[at], join("", *path[:at]), reason)


def _keyword_at(schema: dict[str, Any], error: jsonschema.SchemaError) -> tuple[str, str]:
    """The keyword of ``schema`` whose value the metaschema rejects, and the pointer of the node holding it."""
    path = list(error.path)
    if error.validator in ("dependencies", "dependentRequired") and isinstance(error.instance, dict):
        # a keyword that needs another beside it (draft 4's exclusiveMinimum needs minimum)
        needy = next((k for k, needs in error.validator_value.items() if k in error.instance
                      and isinstance(needs, list) and not set(needs) <= set(error.instance)), None)
        if needy is not None:
            return needy, join("", *path)
    node: Any = schema
    pointer = holder = ""
    keyword = str(error.validator)  # (the metaschema's, where the path names none of the schema's)
    while path and isinstance(node, dict):
        keyword, holder = path.pop(0), pointer
        node, pointer = node.get(keyword), join(pointer, keyword)
        if path and (keyword in NAMED or isinstance(node, list)):  # then a name or an index
            node, pointer = node[path[0]], join(pointer, path.pop(0))
    return keyword, holder
