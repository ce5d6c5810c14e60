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
import math
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_origin

import jsonschema
import pydantic
from outlines_core.json_schema import build_regex_from_schema

from structspec import grammars
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
# JSON Schema formats structspec enforces, each by the catalogue grammar of the same name
# (outlines-core's own regexes can break the JSON string around them and read \\d as Unicode).
_FORMATS = frozenset({"date-time", "date", "time", "duration", "email", "hostname", "ipv4", "ipv6", "uri", "uuid"})
# Numeric bounds, which structspec translates itself (outlines-core ignores them).
_BOUNDS = ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")
# A string pattern that is one character (class) repeated: length bounds fold into it.
_REPEATED_CLASS = re.compile(r"\((?P<char>\[(?:\\.|[^\]\\])*\]|\\.|[a-zA-Z0-9 ])(?P<times>[+*])\)")
# The keywords outlines-core (or structspec) honours for each JSON type (besides "type").
_TYPE_KEYWORDS = {
    "string": {"minLength", "maxLength", "pattern", "format"},
    "number": set(_BOUNDS),
    "integer": set(_BOUNDS),
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


def to_regex(spec: Any, whitespace_pattern: str = COMPACT, strict: bool = True) -> str:
    """The regex structspec constrains decoding with, for handing the same constraint to another engine."""
    return constraint_of(spec, whitespace_pattern, strict).regex


def constraint_of(spec: Any, whitespace_pattern: str = COMPACT, strict: bool = True) -> Constraint:
    """Resolve any supported spec: `Regex`, Pydantic model class, JSON Schema (dict, bool or str), or type.

    ``strict=False`` drops the schema keywords structspec cannot enforce, with a
    warning that lists each keyword and its JSON pointer, instead of raising
    `SchemaError`; the parser then validates only what was kept (a Pydantic model
    still validates everything).
    """
    if isinstance(spec, Regex):
        return Constraint(spec.pattern, lambda text: text, None)
    if isinstance(spec, type) and issubclass(spec, pydantic.BaseModel):
        return _json_constraint(spec.model_json_schema(), whitespace_pattern, strict, spec.model_validate_json)
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as e:
            raise SpecError(
                f"a str spec must be a JSON Schema document, and this one is not valid JSON ({e}); "
                "wrap a regex in structspec.Regex(...)"
            ) from None
        return _json_constraint(spec, whitespace_pattern, strict, None)
    if isinstance(spec, (dict, bool)):
        return _json_constraint(spec, whitespace_pattern, strict, None)
    if isinstance(spec, (type, enum.EnumMeta)) or get_origin(spec) is not None:
        try:
            adapter = pydantic.TypeAdapter(spec)
            schema = adapter.json_schema()
        except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError, TypeError) as e:
            raise SpecError(f"cannot derive a JSON Schema from {spec!r}: {e}") from None
        return _json_constraint(schema, whitespace_pattern, strict, adapter.validate_json)
    raise SpecError(
        f"unsupported output spec {spec!r} ({type(spec).__name__}); pass a Pydantic model class, "
        "a JSON Schema (dict or str), structspec.Regex(...), a Literal/Enum, or int/float/bool/str"
    )


def _json_constraint(
    schema: Any, whitespace_pattern: str, strict: bool, parse: Callable[[str], Any] | None
) -> Constraint:
    """``parse=None``: parse JSON and validate it against the schema (less any dropped keywords)."""
    translation = _translate(schema, strict)
    try:
        regex = build_regex_from_schema(json.dumps(translation.schema), whitespace_pattern)
    except ValueError as e:  # the checker should have caught it; never fall back to looser
        raise SchemaError("(schema)", "/", f"outlines-core cannot translate it: {e}") from None
    regex = ecma_classes(regex)  # before the holes: their regexes are structspec's own, already ASCII
    for marker, hole in translation.holes.items():
        regex = regex.replace(f'"{marker}"', f"({hole})")
    if parse is None:
        kept = translation.kept
        cls = jsonschema.validators.validator_for(kept)
        # the draft's own format checker: a bare FormatChecker() mixes drafts (draft 3's "time" rejects "Z")
        validator = cls(kept, format_checker=cls.FORMAT_CHECKER)

        def parse(text: str) -> Any:
            value = json.loads(text)
            validator.validate(value)
            return value

    return Constraint(regex, parse, schema)


@dataclass(frozen=True)
class _Translation:
    """A schema made ready for outlines-core.

    ``schema`` is what outlines-core translates; each key of ``holes`` appears in it as a
    string pattern, and its quoted form in the regex is replaced by the hole's regex (for
    what structspec translates itself, e.g. numeric bounds). ``kept`` is the original
    schema less the keywords dropped with ``strict=False``.
    """

    schema: Any
    holes: dict[str, str]
    kept: Any


def check_schema(schema: Any, strict: bool = True) -> Any:
    """Raise `SchemaError` if ``schema`` is invalid or uses a keyword that would not be enforced.

    Returns the schema as handed to outlines-core: annotations removed, and the parts
    structspec translates itself stood in for by placeholder patterns.
    """
    return _translate(schema, strict).schema


def _translate(schema: Any, strict: bool) -> _Translation:
    if schema is True:
        schema = {}  # any JSON value
    if schema is False:
        raise SchemaError("(schema)", "/", "a 'false' schema admits no value")
    if not isinstance(schema, dict):
        raise SchemaError("(schema)", "/", f"a JSON Schema must be an object, got {type(schema).__name__}")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        pointer = "".join(f"/{_escape(p)}" for p in e.path)
        raise SchemaError(str(e.validator), pointer, f"not a valid JSON Schema: {e.message}") from None
    checker = _Checker(schema, strict)
    checker.walk(schema, "", ())
    if checker.dropped:
        warnings.warn(
            "strict=False: these schema keywords are not enforced: "
            + ", ".join(f"{key!r} at {ptr or '/'}" for key, ptr in checker.dropped),
            stacklevel=4,
        )
    return _Translation(checker.normalized(schema), checker.holes, checker.pruned(schema))


def _escape(part: Any) -> str:
    return str(part).replace("~", "~0").replace("/", "~1")


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


# Bounds beyond ±_BOUND_CAP are narrowed to it: the automaton grows with the digits of a bound.
_BOUND_CAP = 10**15
_FRACTION = r"(\.[0-9]+)?"


def integer_range_regex(lo: int | None, hi: int | None) -> str:
    """Regex of the JSON integers ``lo <= n <= hi`` (None: unbounded), without leading zeros."""
    parts = []
    if hi is None or hi >= 0:
        parts.append(_naturals(max(lo, 0) if lo is not None else 0, hi))
    if lo is None or lo < 0:
        parts.append("-(" + _naturals(-hi if hi is not None and hi < 0 else 1, -lo if lo is not None else None) + ")")
    return "|".join(f"({p})" for p in parts)


def decimal_range_regex(lo: int | None, lo_open: bool, hi: int | None, hi_open: bool) -> str:
    """Regex of the decimals (no exponent) between integer bounds; ``*_open`` excludes the bound itself."""
    parts = []
    if hi is None or hi > 0 or (hi == 0 and not hi_open):
        parts.append(_nonnegative_decimals(*((lo, lo_open) if lo is not None and lo >= 0 else (0, False)), hi, hi_open))
    if lo is None or lo < 0:  # x = -y, y > 0 (or y >= -hi when hi < 0)
        low, low_open = (-hi, hi_open) if hi is not None and hi < 0 else (0, True)
        parts.append("-(" + _nonnegative_decimals(low, low_open, None if lo is None else -lo, lo_open) + ")")
    return "|".join(f"({p})" for p in parts)


def _nonnegative_decimals(lo: int, lo_open: bool, hi: int | None, hi_open: bool) -> str:
    if hi == lo:
        return rf"{lo}(\.0+)?"
    parts = [rf"{lo}\.[0-9]*[1-9][0-9]*" if lo_open else f"{lo}{_FRACTION}"]
    if hi is None or hi - 1 >= lo + 1:
        parts.append(f"({_naturals(lo + 1, None if hi is None else hi - 1)}){_FRACTION}")
    if hi is not None and not hi_open:
        parts.append(rf"{hi}(\.0+)?")
    return "|".join(parts)


def _naturals(lo: int, hi: int | None) -> str:
    """Regex of the integers ``0 <= lo <= n <= hi`` (None: unbounded) in decimal."""
    if hi is None:
        n = len(str(lo))
        return f"{_naturals(lo, 10**n - 1)}|[1-9][0-9]{{{n},}}"
    parts = []
    for n in range(len(str(lo)), len(str(hi)) + 1):
        low, high = max(lo, 10 ** (n - 1) if n > 1 else 0), min(hi, 10**n - 1)
        parts.append(_same_length(str(low), str(high)))
    return "|".join(parts)


def _same_length(a: str, b: str) -> str:
    """Regex of the digit strings from ``a`` to ``b`` (same length, a <= b)."""
    if a == b:
        return a
    if len(a) == 1:
        return f"[{a}-{b}]"
    if a[0] == b[0]:
        return a[0] + "(" + _same_length(a[1:], b[1:]) + ")"
    rest = len(a) - 1
    if a[1:] == "0" * rest and b[1:] == "9" * rest:
        return f"[{a[0]}-{b[0]}][0-9]{{{rest}}}"
    parts = [a[0] + "(" + _same_length(a[1:], "9" * rest) + ")"]
    if int(b[0]) - int(a[0]) > 1:
        parts.append(f"[{int(a[0]) + 1}-{int(b[0]) - 1}][0-9]{{{rest}}}")
    parts.append(b[0] + "(" + _same_length("0" * rest, b[1:]) + ")")
    return "|".join(parts)


# What a JSON string holds only escaped (outlines-core's string also leaves out U+007F-U+009F).
_JSON_UNSAFE = "\"\\\\\\x00-\\x1F\\x7F-\\x9F"
_UNSAFE_CHARS = ['"', "\\"] + [chr(c) for c in (*range(0x20), *range(0x7F, 0xA0))]
_NEGATED = {"\\S": "\\s", "\\W": "a-zA-Z0-9_", "\\D": "0-9", ".": ""}


def json_safe_pattern(pattern: str) -> str | None:
    """``pattern`` narrowed to characters a JSON string holds unescaped, or None if it needs escaped ones.

    outlines-core puts a schema pattern between the quotes as it is, so ``.`` or
    ``[^a]`` would match a raw quote or newline and break the JSON. Wildcards and
    negated classes exclude those characters here, ``\\s`` means a space; a pattern
    that asks for one of them (a literal quote, ``\\n``) gets None. Anchors are left
    out (the match is always whole) and the result is a group.
    """
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "[":
            j = i + 1 + (pattern[i + 1 : i + 2] == "^")
            j += pattern[j : j + 1] == "]"
            while j < len(pattern) and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            atom, i = pattern[i : j + 1], j + 1
            if not atom.startswith("[^"):
                atom = atom.replace("\\s", " ")
        elif c == "\\":
            size = {"x": 4, "u": 6}.get(pattern[i + 1 : i + 2], 2)
            atom, i = pattern[i : i + size], i + size
        elif c == "." or c in _UNSAFE_CHARS:
            atom, i = c, i + 1
        elif c in "^$":  # the regex matches whole strings: anchors are implied
            i += 1
            continue
        else:  # a literal or an operator
            out.append(c)
            i += 1
            continue
        try:
            unsafe = any(re.fullmatch(atom, u) for u in _UNSAFE_CHARS)
        except re.error:
            return None
        if not unsafe:
            out.append(atom)
        elif atom == "\\s":
            out.append(" ")
        elif atom in _NEGATED:
            out.append(f"[^{_NEGATED[atom]}{_JSON_UNSAFE}]")
        elif atom.startswith("[^"):
            out.append(atom[:-1] + _JSON_UNSAFE + "]")
        else:
            return None
    return "(" + "".join(out) + ")"  # a group: outlines-core puts quotes around it as it is


class _Checker:
    """Walks a schema in outlines-core's dispatch order, rejecting (or, not strict, dropping) what it would ignore.

    It also plans the rewrites `normalized` applies: nodes structspec translates
    itself (numeric bounds) become holes, keyed by the id of the node they replace.
    """

    _DISPATCH = ("properties", "allOf", "anyOf", "oneOf", "prefixItems", "enum", "const", "$ref", "type")

    def __init__(self, root: dict[str, Any], strict: bool) -> None:
        self.root = root
        self.strict = strict
        self.dropped: dict[tuple[str, str], None] = {}  # (keyword, pointer), in order
        self.holes: dict[str, str] = {}  # marker → regex
        self._drops: dict[int, set[str]] = {}  # id(node) → keywords dropped there
        self._replaced: dict[int, Any] = {}  # id(node) → the node outlines-core gets instead

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
            for key in keys:
                self._unenforced(node, key, ptr, "keyword without 'type' is not supported")
            return
        getattr(self, "_" + kind.strip("$"))(node, ptr, refs)

    def _unenforced(self, node: dict[str, Any], key: str, ptr: str, reason: str) -> None:
        if self.strict:
            raise SchemaError(key, ptr, reason)
        self._drops.setdefault(id(node), set()).add(key)
        self.dropped[(key, ptr)] = None

    def _has(self, node: dict[str, Any], key: str) -> bool:
        return key in node and key not in self._drops.get(id(node), ())

    def normalized(self, node: Any) -> Any:
        """``node`` as outlines-core gets it: annotations and dropped keywords removed, holes in place."""
        if isinstance(node, list):
            return [self.normalized(n) for n in node]
        if not isinstance(node, dict):
            return node
        if id(node) in self._replaced:
            return self.normalized(self._replaced[id(node)])
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in ("$defs", "definitions", "properties", "patternProperties"):  # keys here are names
                out[key] = {k: self.normalized(v) for k, v in value.items()}
            elif key in ("enum", "const"):
                out[key] = value
            elif key not in _ANNOTATIONS and self._has(node, key):
                out[key] = self.normalized(value)
        if node.get("type") == "object" and node.get("additionalProperties") is False and "properties" not in node:
            out = {"type": "object", "maxProperties": 0}  # outlines-core has no form for "no properties"
        return out

    def pruned(self, node: Any) -> Any:
        """``node`` less the dropped keywords, for validating what is enforced."""
        if isinstance(node, list):
            return [self.pruned(n) for n in node]
        if not isinstance(node, dict):
            return node
        dropped = self._drops.get(id(node), set())
        return {k: v if k in ("enum", "const") else self.pruned(v) for k, v in node.items() if k not in dropped}

    def _hole(self, node: dict[str, Any], regex: str) -> None:
        marker = f"structspecHole{len(self.holes)}x{id(self):x}"
        self.holes[marker] = regex
        self._replaced[id(node)] = {"type": "string", "pattern": marker}

    def _reject_others(self, node: dict[str, Any], ptr: str, allowed: set[str]) -> None:
        for key in node:
            if key in _VALIDATION and key not in allowed:
                self._unenforced(node, key, ptr, "not enforced by the regex translation")

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
            self._unenforced(node, "allOf", ptr, "allOf with more than one subschema is not supported")
        else:
            self.walk(node["allOf"][0], f"{ptr}/allOf/0", refs)

    def _anyOf(self, node: dict[str, Any], ptr: str, refs: tuple[str, ...]) -> None:
        self._reject_others(node, ptr, {"anyOf"})
        for i, sub in enumerate(node["anyOf"]):
            self.walk(sub, f"{ptr}/anyOf/{i}", refs)

    def _oneOf(self, node: dict[str, Any], ptr: str, refs: tuple[str, ...]) -> None:
        self._reject_others(node, ptr, {"oneOf"})
        subs = [self._resolve(sub) for sub in node["oneOf"]]
        kinds = [sub.get("type") if isinstance(sub, dict) else None for sub in subs]
        if not all(isinstance(k, str) for k in kinds) or len(set(kinds)) != len(kinds):
            self._unenforced(node, "oneOf", ptr, "branches may overlap (a value must match exactly one); "
                             "use anyOf if any branch will do")
            return
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
        if any(isinstance(v, (dict, list)) for v in values):
            self._unenforced(node, keyword, ptr, "object and array values are not supported")
            return
        if "type" in node:  # a value must match both: keep the values of the node's type
            typed = [v for v in values if jsonschema.Draft202012Validator({"type": node["type"]}).is_valid(v)]
            if not typed:
                raise SchemaError(keyword, ptr, f"no value has the node's type {node['type']!r}")
            self._replaced[id(node)] = {"enum": typed}

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

    def _numeric_bounds(self, node: dict[str, Any], ptr: str, kind: str) -> None:
        lo, lo_open = node.get("minimum"), False
        hi, hi_open = node.get("maximum"), False
        low, high = node.get("exclusiveMinimum"), node.get("exclusiveMaximum")
        if low is True or (not isinstance(low, bool) and low is not None and (lo is None or low >= lo)):
            lo, lo_open = (lo if low is True else low), True  # draft 4: a boolean modifying "minimum"
        if high is True or (not isinstance(high, bool) and high is not None and (hi is None or high <= hi)):
            hi, hi_open = (hi if high is True else high), True
        # Beyond the cap, narrow (never widen) the range: digits of a bound cost automaton states.
        lo = None if lo is None else max(lo, -_BOUND_CAP)
        hi = None if hi is None else min(hi, _BOUND_CAP)
        keyword = "minimum" if lo is not None else "maximum"
        if kind == "integer":
            lo_int = None if lo is None else (math.floor(lo) + 1 if lo_open else math.ceil(lo))
            hi_int = None if hi is None else (math.ceil(hi) - 1 if hi_open else math.floor(hi))
            if lo_int is not None and hi_int is not None and lo_int > hi_int:
                raise SchemaError(keyword, ptr, "no integer lies within the bounds")
            self._hole(node, integer_range_regex(lo_int, hi_int))
            return
        if any(b is not None and b != int(b) for b in (lo, hi)):
            self._unenforced(node, keyword, ptr, "bounds of a number must be integers")
            return
        lo, hi = (None if b is None else int(b) for b in (lo, hi))
        if lo is not None and hi is not None and (lo > hi or (lo == hi and (lo_open or hi_open))):
            raise SchemaError(keyword, ptr, "no number lies within the bounds")
        self._hole(node, decimal_range_regex(lo, lo_open, hi, hi_open))

    def _string(self, node: dict[str, Any], ptr: str) -> None:
        """Fold format, pattern and length bounds into one JSON-safe pattern where they need it."""
        lengths = self._has(node, "minLength") or self._has(node, "maxLength")
        pattern = None
        if self._has(node, "format"):
            if node["format"] not in _FORMATS:
                self._unenforced(node, "format", ptr, f"format {node['format']!r} is not supported "
                                 f"(supported: {', '.join(sorted(_FORMATS))})")
            elif self._has(node, "pattern"):
                self._unenforced(node, "format", ptr, "cannot be combined with pattern")
            elif lengths:
                self._unenforced(node, "format", ptr, "cannot be combined with minLength/maxLength")
            else:
                pattern = f"({grammars.get(node['format']).pattern})"  # catalogue patterns are JSON-safe
        if self._has(node, "pattern"):
            pattern = json_safe_pattern(ecma_classes(node["pattern"]))
            repeated = _REPEATED_CLASS.fullmatch(pattern or "")
            if pattern is None:
                self._unenforced(node, "pattern", ptr, "it can match a quote, backslash or control character, "
                                 "which JSON strings hold only escaped")
            elif lengths and repeated is None:
                self._unenforced(node, "pattern", ptr, "cannot be combined with minLength/maxLength "
                                 "unless it is one character class repeated, like ^[a-z0-9]+$")
                pattern = None
            elif lengths:
                low = max(node.get("minLength", 0), 1 if repeated["times"] == "+" else 0)
                pattern = f"{repeated['char']}{{{low},{node.get('maxLength', '')}}}"
        if pattern is not None:
            self._replaced[id(node)] = {"type": "string", "pattern": pattern}

    def _type(self, node: dict[str, Any], ptr: str, refs: tuple[str, ...]) -> None:
        types = [node["type"]] if isinstance(node["type"], str) else list(node["type"])
        allowed = set().union(*(_TYPE_KEYWORDS[t] for t in types)) | {"type"}
        for key in node:  # keywords of a type not listed constrain nothing here
            applies = _KEYWORD_TYPES.get(key)
            if key in _VALIDATION and key not in allowed and (applies is None or applies & set(types)):
                self._unenforced(node, key, ptr, f"not enforced for type {node['type']!r}")
        if len(types) > 1 and any(k in _KEYWORD_TYPES and self._has(node, k) for k in node):
            # rewrites (holes, patterns) are per type: split the node into one branch per type
            branches = [{k: v for k, v in node.items() if t in _KEYWORD_TYPES.get(k, {t}) and self._has(node, k)}
                        | {"type": t} for t in types]
            self._replaced[id(node)] = {"anyOf": branches}
            for branch in branches:
                self.walk(branch, ptr, refs)
            return
        if types[0] in ("integer", "number") and any(self._has(node, k) for k in _BOUNDS):
            self._numeric_bounds(node, ptr, types[0])
        if "string" in types:
            self._string(node, ptr)
        if "array" in types:
            items = node.get("items", True)
            if isinstance(items, list):
                raise SchemaError("items", ptr, "the array form of 'items' is not supported; use prefixItems")
            self.walk(items, f"{ptr}/items", refs)
        if "object" in types:
            extra = node.get("additionalProperties", True)
            if extra is not False:
                self.walk(extra, f"{ptr}/additionalProperties", refs)
