"""A schema's own draft (its ``$schema``, else the latest) as jsonschema reads it: the metaschema check and
the validator outputs are checked with."""

from __future__ import annotations

import difflib
import functools
import json
import math
from typing import Any

import jsonschema
import jsonschema_rs
from jsonschema.protocols import Validator

from structspec.errors import InvalidSchemaError, SchemaError
from structspec.schema.keywords import NAMED
from structspec.schema.pointers import join


def validator(schema: Any) -> Validator:
    """A validator for ``schema`` under its own draft, checking formats with that draft's format checker.

    A bare ``FormatChecker()`` mixes the drafts' checkers (draft 3's ``time``
    rejects the ``Z`` that RFC 3339 allows).
    """
    cls = _draft(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def _draft(schema: Any) -> type[Validator]:
    """jsonschema's validator class for ``schema``'s draft; `SchemaError` if its ``$schema`` is no string
    (jsonschema would fail reading it)."""
    if isinstance(schema, dict) and not isinstance(schema.get("$schema", ""), str):
        raise SchemaError("$schema", "", f"must be a string, the URI of a draft's metaschema, not "
                          f"{json.dumps(schema['$schema'])[:60]}")
    return jsonschema.validators.validator_for(schema)


def check_metaschema(schema: Any) -> None:
    """Raise `SchemaError` (the metaschema keyword that fails, at the pointer of the bad value) if ``schema``
    is not a valid JSON Schema of its draft.

    jsonschema-rs decides first (a Kubernetes schema: 0.1 ms instead of 30): formats checked, it accepts
    no schema jsonschema rejects (tested on mutated schemas of every draft), so its yes is final. Where it
    says no, jsonschema's own check decides, and words the error.
    """
    cls = _draft(schema)
    fast = _fast_validator(cls)
    try:
        if fast is not None and fast.is_valid(schema):
            return
    except ValueError:  # a string it cannot read (a lone surrogate has no UTF-8): jsonschema decides
        pass
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as e:
        raise InvalidSchemaError(*_keyword_at(schema, e), e.message + _suggestion(e)) from None


def _suggestion(error: jsonschema.ValidationError) -> str:
    """How to fix the value the metaschema rejects: the nearest of the values it allows there (the enums and
    consts of the failing subschema and its branches), or those values, or the metaschema's words."""
    allowed: list[str] = []
    todo = [error]
    while todo:
        e = todo.pop()
        if e.validator == "enum":
            allowed += [json.dumps(v) for v in e.validator_value]
        elif e.validator == "const":
            allowed.append(json.dumps(e.validator_value))
        todo += e.context or []
    allowed = list(dict.fromkeys(allowed))
    written = [error.instance, *(error.instance if isinstance(error.instance, list) else [])]  # (a type list's)
    for value in map(json.dumps, written):
        near = difflib.get_close_matches(value, allowed, n=1, cutoff=0.6) if value not in allowed else None
        if near:
            return f"; did you mean {near[0]}" + ("?" if value == json.dumps(error.instance) else f" for {value}?")
    if allowed:
        return f"; use one of {', '.join(allowed)}"
    wanted = json.dumps(error.validator_value)[:80]
    return f"; make the value match the draft's metaschema ({error.validator}: {wanted})"


@functools.cache
def _fast_validator(cls: type[Validator]) -> jsonschema_rs.Validator | None:
    """jsonschema-rs's validator of ``cls``'s metaschema, checking formats as ``cls.check_schema`` does; None
    for a draft it does not know (draft 3)."""
    try:
        return jsonschema_rs.validator_for(cls.META_SCHEMA, validate_formats=True)
    except ValueError:
        return None


def check_json(node: Any) -> str:
    """``node``'s JSON text; `SchemaError` (the keyword holding it, at its node's pointer) at the first value of
    ``node`` that JSON cannot hold: an infinity, a NaN, a non-string key, or a Python object."""
    try:  # (the C codec reads a whole schema in a fraction of the walk's time; the walk names what it refused)
        text = json.dumps(node, allow_nan=False, ensure_ascii=False)
        if json.loads(text) == node:  # (a non-string key or a tuple comes back changed)
            return text
        refused = "it reads back changed"
    except (TypeError, ValueError) as e:
        if str(e).startswith("Circular reference"):  # (the walk would never end)
            raise SchemaError("", "", "the schema holds itself (a cycle of Python objects, which JSON cannot "
                              "write); refer to a subschema with $ref instead") from None
        refused = str(e)
    _find_non_json(node, ())
    raise SchemaError("", "", f"the JSON codec refused the schema ({refused})")  # (the walk found no culprit)


def _find_non_json(node: Any, path: tuple[Any, ...]) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if not isinstance(key, str):
                _not_json(path, key, f"the key {key!r} is not a string")
            _find_non_json(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _find_non_json(value, (*path, i))
    elif isinstance(node, float) and not math.isfinite(node):
        _not_json(path, None, f"{node} is not a JSON number (JSON has no infinities or NaN)")
    elif node is not None and not isinstance(node, (str, int, float, bool)):
        _not_json(path, None, f"a {type(node).__name__} is not a JSON value")


def _not_json(path: tuple[Any, ...], key: Any, reason: str) -> None:
    raise SchemaError(*_keyword_at_path(path, key), reason)


def _keyword_at_path(path: tuple[Any, ...], key: Any) -> tuple[str, str]:
    """The innermost string key of ``path`` (a keyword, or the name it maps) and the pointer before it; ``key``
    at the root where ``path`` has none."""
    names = [i for i, p in enumerate(path) if isinstance(p, str)]
    if not names:
        return str(key), ""
    at = names[-1]
    return path[at], join("", *path[:at])


def too_deep(schema: Any) -> SchemaError:
    """The error for a schema nested deeper than structspec's readers recurse, naming its deepest value. (Walks
    ``schema`` without recursing, each shared container once.)"""
    deepest: tuple[Any, ...] = ()
    stack, seen = [(schema, deepest)], set()
    while stack:
        node, path = stack.pop()
        if len(path) > len(deepest):
            deepest = path
        if isinstance(node, (dict, list)) and id(node) not in seen:
            seen.add(id(node))
            stack.extend((value, (*path, key)) for key, value in (node.items() if isinstance(node, dict)
                                                                    else enumerate(node)))
    return SchemaError(*_keyword_at_path(deepest[:-1], ""),
                       f"the schema nests {len(deepest)} levels deep, deeper than structspec's readers recurse "
                       "(Python's recursion limit); flatten it")


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
