"""Output specs → regex: Pydantic models, JSON Schemas, regexes and Python types.

JSON Schemas are translated by ``outlines_core.json_schema.build_regex_from_schema``,
which silently ignores keywords it does not implement. `check_schema` walks the
schema the way that translator dispatches and raises `SchemaError` for every
validation keyword it would drop, so a compiled constraint is never looser than
the schema.

The default JSON layout is compact (``{"a":1,"b":[2,3]}``, no whitespace
anywhere): one fixed form means no runaway whitespace and long forced spans.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_origin

import jsonschema
import pydantic
from outlines_core.json_schema import build_regex_from_schema

from structspec.errors import SchemaError, SpecError

COMPACT = ""
"""The default whitespace pattern: no whitespace between JSON tokens."""

# Keywords that never constrain an instance; removed before translation.
_ANNOTATIONS = frozenset(
    "title description examples default $schema $id $comment $anchor deprecated readOnly "
    "writeOnly contentEncoding contentMediaType discriminator $defs definitions".split()
)
# Every validation keyword of JSON Schema drafts 4 to 2020-12. Keywords outside this
# set (vendor extensions) do not constrain instances for jsonschema either.
_VALIDATION = frozenset(
    "type enum const multipleOf maximum exclusiveMaximum minimum exclusiveMinimum maxLength "
    "minLength pattern format maxItems minItems uniqueItems maxContains minContains "
    "maxProperties minProperties required dependentRequired dependencies properties "
    "patternProperties additionalProperties propertyNames items prefixItems additionalItems "
    "contains unevaluatedItems unevaluatedProperties allOf anyOf oneOf not if then else "
    "dependentSchemas $ref $dynamicRef $recursiveRef".split()
)
_FORMATS = frozenset({"date-time", "date", "time", "uuid", "uri", "email"})
# outlines-core's regexes for these can break the JSON string around them (an escaped
# backslash before any character in "time", raw quotes and control characters in "email"
# and "uri"), so structspec uses its own, JSON-safe and never looser than the format.
_URI_CHARS = r"[a-zA-Z0-9._~%!$&'()*+,;=:@/-]"
_FORMAT_PATTERNS = {
    "time": r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])",
    "email": r"[a-zA-Z0-9._%+-]+@[a-zA-Z0-9-]+(\.[a-zA-Z0-9-]+)*\.[a-zA-Z]{2,}",
    "uri": rf"(https?|ftp)://[a-zA-Z0-9.-]+(:[0-9]+)?(/{_URI_CHARS}*)?(\?{_URI_CHARS}*)?(#{_URI_CHARS}*)?",
}
# The keywords outlines-core honours for each JSON type (besides "type").
_TYPE_KEYWORDS = {
    "string": {"minLength", "maxLength", "pattern", "format"},
    "number": set(),
    "integer": set(),
    "boolean": set(),
    "null": set(),
    "array": {"items", "minItems", "maxItems"},
    "object": {"additionalProperties", "minProperties", "maxProperties"},
}
# The JSON types each validation keyword applies to (keywords absent here apply to all).
_KEYWORD_TYPES: dict[str, set[str]] = {
    **{k: {"string"} for k in ("minLength", "maxLength", "pattern", "format")},
    **{k: {"number", "integer"} for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                           "multipleOf")},
    **{k: {"array"} for k in ("items", "minItems", "maxItems", "uniqueItems", "contains", "minContains",
                               "maxContains", "prefixItems", "additionalItems", "unevaluatedItems")},
    **{k: {"object"} for k in ("additionalProperties", "minProperties", "maxProperties", "required",
                                "properties", "patternProperties", "propertyNames", "dependentRequired",
                                "dependencies", "dependentSchemas", "unevaluatedProperties")},
}


@dataclass(frozen=True)
class Regex:
    """A regular expression as output spec: ``generate`` returns the matched ``str``."""

    pattern: str


@dataclass(frozen=True)
class Constraint:
    """A spec resolved to the regex that constrains decoding and the parser of its output."""

    regex: str
    parse: Callable[[str], Any]
    json_schema: dict[str, Any] | None  # None for a plain regex


def to_regex(spec: Any, whitespace_pattern: str = COMPACT) -> str:
    """The regex structspec constrains decoding with, for handing the same constraint to another engine."""
    return constraint_of(spec, whitespace_pattern).regex


def constraint_of(spec: Any, whitespace_pattern: str = COMPACT) -> Constraint:
    """Resolve any supported spec: `Regex`, Pydantic model class, JSON Schema (dict or str), or type."""
    if isinstance(spec, Regex):
        return Constraint(spec.pattern, lambda text: text, None)
    if isinstance(spec, type) and issubclass(spec, pydantic.BaseModel):
        return _json_constraint(spec.model_json_schema(), whitespace_pattern, spec.model_validate_json)
    if isinstance(spec, str):
        try:
            loaded = json.loads(spec)
        except json.JSONDecodeError as e:
            raise SpecError(
                f"a str spec must be a JSON Schema document, and this one is not valid JSON ({e}); "
                "wrap a regex in structspec.Regex(...)"
            ) from None
        return _json_constraint(loaded, whitespace_pattern, lambda text: _validated(json.loads(text), loaded))
    if isinstance(spec, dict):
        schema = spec
        return _json_constraint(schema, whitespace_pattern, lambda text: _validated(json.loads(text), schema))
    if isinstance(spec, (type, enum.EnumMeta)) or get_origin(spec) is not None:
        try:
            adapter = pydantic.TypeAdapter(spec)
            schema = adapter.json_schema()
        except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError, TypeError) as e:
            raise SpecError(f"cannot derive a JSON Schema from {spec!r}: {e}") from None
        return _json_constraint(schema, whitespace_pattern, adapter.validate_json)
    raise SpecError(
        f"unsupported output spec {spec!r} ({type(spec).__name__}); pass a Pydantic model class, "
        "a JSON Schema (dict or str), structspec.Regex(...), a Literal/Enum, or int/float/bool/str"
    )


def _validated(value: Any, schema: dict[str, Any]) -> Any:
    jsonschema.validate(value, schema)
    return value


def _json_constraint(schema: Any, whitespace_pattern: str, parse: Callable[[str], Any]) -> Constraint:
    normalized = check_schema(schema)
    try:
        regex = ecma_classes(build_regex_from_schema(json.dumps(normalized), whitespace_pattern))
    except ValueError as e:  # check_schema should have caught it; never fall back to looser
        raise SchemaError("(schema)", "/", f"outlines-core cannot translate it: {e}") from None
    return Constraint(regex, parse, schema)


def check_schema(schema: Any) -> dict[str, Any]:
    """Raise `SchemaError` if ``schema`` is invalid or uses a keyword that would not be enforced.

    Returns the schema with annotations removed, ready for outlines-core.
    """
    if not isinstance(schema, dict):
        raise SchemaError("(schema)", "/", f"a JSON Schema must be an object, got {type(schema).__name__}")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        pointer = "".join(f"/{_escape(p)}" for p in e.path)
        raise SchemaError(str(e.validator), pointer, f"not a valid JSON Schema: {e.message}") from None
    _Checker(schema).walk(schema, "", ())
    return _strip_annotations(schema)


def _escape(part: Any) -> str:
    return str(part).replace("~", "~0").replace("/", "~1")


def _strip_annotations(node: Any) -> Any:
    if isinstance(node, list):
        return [_strip_annotations(n) for n in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("$defs", "definitions"):  # $ref targets must stay
            out[key] = {k: _strip_annotations(v) for k, v in value.items()}
        elif key in ("properties", "patternProperties"):  # keys here are names, not keywords
            out[key] = {k: _strip_annotations(v) for k, v in value.items()}
        elif key in ("enum", "const"):
            out[key] = value
        elif key not in _ANNOTATIONS:
            out[key] = _strip_annotations(value)
    if out.get("format") in _FORMAT_PATTERNS:
        out["pattern"] = _FORMAT_PATTERNS[out.pop("format")]
    if node.get("type") == "object" and node.get("additionalProperties") is False and "properties" not in node:
        out = {"type": "object", "maxProperties": 0}  # outlines-core has no form for "no properties"
    return out


_ECMA = {"d": "0-9", "w": "a-zA-Z0-9_"}


def ecma_classes(pattern: str) -> str:
    """Give ``\\d`` and ``\\w`` their JSON Schema (ECMA-262) meaning: ASCII only.

    outlines-core's regex engine reads them as Unicode classes (``\\d`` matches
    ``۴``), which would make schema patterns and formats (``date``: ``\\d{4}-…``)
    looser than JSON Schema says.
    """
    out, in_class, i = [], False, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            esc = pattern[i + 1]
            if esc in _ECMA:
                out.append(_ECMA[esc] if in_class else f"[{_ECMA[esc]}]")
            else:
                out.append(c + esc)
            i += 2
            continue
        in_class = (in_class and c != "]") or c == "["
        out.append(c)
        i += 1
    return "".join(out)


class _Checker:
    """Walks a schema in outlines-core's dispatch order, rejecting what it would ignore."""

    _DISPATCH = ("properties", "allOf", "anyOf", "oneOf", "prefixItems", "enum", "const", "$ref", "type")

    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root

    def walk(self, node: Any, ptr: str, refs: tuple[str, ...]) -> None:
        if node is True:
            return
        if node is False or not isinstance(node, dict):
            raise SchemaError("(schema)", ptr, "a 'false' schema admits no value")
        keys = [k for k in node if k in _VALIDATION]
        if not keys:
            return  # {}: any JSON value
        kind = next((k for k in self._DISPATCH if k in node), None)
        if kind is None:
            raise SchemaError(keys[0], ptr, "keyword without 'type' is not supported")
        getattr(self, "_" + kind.strip("$"))(node, ptr, refs)

    def _reject_others(self, node: dict[str, Any], ptr: str, allowed: set[str]) -> None:
        for key in node:
            if key in _VALIDATION and key not in allowed:
                raise SchemaError(key, ptr, "not enforced by the regex translation")

    def _properties(self, node: dict[str, Any], ptr: str, refs: tuple[str, ...]) -> None:
        self._reject_others(node, ptr, {"properties", "required", "type", "additionalProperties"})
        types = node.get("type", "object")
        if "object" not in ([types] if isinstance(types, str) else types):
            raise SchemaError("type", ptr, "'properties' with a non-object type")
        for name in node.get("required", []):
            if name not in node["properties"]:
                raise SchemaError("required", ptr, f"required property {name!r} is not in 'properties'")
        for name, sub in node["properties"].items():
            self.walk(sub, f"{ptr}/properties/{_escape(name)}", refs)

    def _allOf(self, node: dict[str, Any], ptr: str, refs: tuple[str, ...]) -> None:
        self._reject_others(node, ptr, {"allOf"})
        if len(node["allOf"]) != 1:
            raise SchemaError("allOf", ptr, "allOf with more than one subschema is not supported")
        self.walk(node["allOf"][0], f"{ptr}/allOf/0", refs)

    def _anyOf(self, node: dict[str, Any], ptr: str, refs: tuple[str, ...]) -> None:
        self._reject_others(node, ptr, {"anyOf"})
        for i, sub in enumerate(node["anyOf"]):
            self.walk(sub, f"{ptr}/anyOf/{i}", refs)

    def _oneOf(self, node: dict[str, Any], ptr: str, refs: tuple[str, ...]) -> None:
        self._reject_others(node, ptr, {"oneOf"})
        kinds = [self._resolve(sub).get("type") for sub in node["oneOf"]]
        if not all(isinstance(k, str) for k in kinds) or len(set(kinds)) != len(kinds):
            raise SchemaError("oneOf", ptr, "branches may overlap (a value must match exactly one); "
                              "use anyOf if any branch will do")
        for i, sub in enumerate(node["oneOf"]):
            self.walk(sub, f"{ptr}/oneOf/{i}", refs)

    def _prefixItems(self, node: dict[str, Any], ptr: str, refs: tuple[str, ...]) -> None:
        self._reject_others(node, ptr, {"prefixItems", "type", "items", "minItems", "maxItems"})
        n = len(node["prefixItems"])
        if node.get("minItems", 0) > n or node.get("maxItems", n) < n:
            raise SchemaError("minItems" if node.get("minItems", 0) > n else "maxItems", ptr,
                              "item count bounds that exclude exactly the prefix items")
        for i, sub in enumerate(node["prefixItems"]):
            self.walk(sub, f"{ptr}/prefixItems/{i}", refs)

    def _enum(self, node: dict[str, Any], ptr: str, refs: tuple[str, ...]) -> None:
        self._check_literals(node, ptr, "enum", node["enum"])

    def _const(self, node: dict[str, Any], ptr: str, refs: tuple[str, ...]) -> None:
        self._check_literals(node, ptr, "const", [node["const"]])

    def _check_literals(self, node: dict[str, Any], ptr: str, keyword: str, values: list[Any]) -> None:
        self._reject_others(node, ptr, {keyword, "type"})
        for v in values:
            if isinstance(v, (dict, list)):
                raise SchemaError(keyword, ptr, "object and array values are not supported")
            if "type" in node and not jsonschema.Draft202012Validator({"type": node["type"]}).is_valid(v):
                raise SchemaError(keyword, ptr, f"value {v!r} does not have the node's type")

    def _ref(self, node: dict[str, Any], ptr: str, refs: tuple[str, ...]) -> None:
        self._reject_others(node, ptr, {"$ref"})
        ref = node["$ref"]
        if ref in refs:
            raise SchemaError("$ref", ptr, f"recursive reference {ref!r} is not supported")
        target = self._resolve(node)
        self.walk(target, ref.lstrip("#"), refs + (ref,))

    def _resolve(self, node: dict[str, Any]) -> Any:
        ref = node.get("$ref")
        if ref is None:
            return node
        if not ref.startswith("#"):
            raise SchemaError("$ref", "", f"external reference {ref!r} is not supported")
        target: Any = self.root
        for part in filter(None, ref[1:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise SchemaError("$ref", "", f"reference {ref!r} does not resolve")
            target = target[part]
        return target

    def _type(self, node: dict[str, Any], ptr: str, refs: tuple[str, ...]) -> None:
        types = [node["type"]] if isinstance(node["type"], str) else list(node["type"])
        allowed = set().union(*(_TYPE_KEYWORDS[t] for t in types)) | {"type"}
        for key in node:  # keywords of a type not listed constrain nothing here
            applies = _KEYWORD_TYPES.get(key)
            if key in _VALIDATION and key not in allowed and (applies is None or applies & set(types)):
                raise SchemaError(key, ptr, f"not enforced for type {node['type']!r}")
        if "string" in types:
            if ("minLength" in node or "maxLength" in node) and ("pattern" in node or "format" in node):
                raise SchemaError("pattern" if "pattern" in node else "format", ptr,
                                  "cannot be combined with minLength/maxLength")
            if "pattern" in node and "format" in node:
                raise SchemaError("format", ptr, "cannot be combined with pattern")
            if "format" in node and node["format"] not in _FORMATS:
                raise SchemaError("format", ptr, f"format {node['format']!r} is not supported "
                                  f"(supported: {', '.join(sorted(_FORMATS))})")
        if "array" in types:
            items = node.get("items", True)
            if isinstance(items, list):
                raise SchemaError("items", ptr, "the array form of 'items' is not supported; use prefixItems")
            self.walk(items, f"{ptr}/items", refs)
        if "object" in types:
            extra = node.get("additionalProperties", True)
            if extra is not False:
                self.walk(extra, f"{ptr}/additionalProperties", refs)
