"""Output specs → regex: Pydantic models, JSON Schemas, regexes and Python types.

JSON Schemas are translated by ``outlines_core.json_schema.build_regex_from_schema``,
which silently ignores keywords it does not implement. `check_schema` walks the
schema the way that translator dispatches and raises `SchemaError` for every
validation keyword it would drop, so a compiled constraint is never looser than
the schema. Before that it rewrites nodes into equivalent or narrower ones that
outlines-core gets right (``allOf`` and the siblings of ``$ref``, ``anyOf`` and
``oneOf`` merged, keywords of excluded types dropped), and it translates objects
with ``patternProperties`` itself.

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

from structspec.schema import grammars
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
    translation = _translate(schema, strict, whitespace_pattern)
    try:
        regex = build_regex_from_schema(json.dumps(translation.schema), whitespace_pattern)
    except ValueError as e:  # the checker should have caught it; never fall back to looser
        raise SchemaError("(schema)", "/", f"outlines-core cannot translate it: {e}") from None
    regex = _with_holes(ecma_classes(regex), translation.holes)  # after: hole regexes are structspec's own, ASCII
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


def _translate(schema: Any, strict: bool, whitespace_pattern: str = COMPACT) -> _Translation:
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
    checker = _Checker(schema, strict, whitespace_pattern)
    checker.walk(schema, "", ())
    if checker.dropped:
        warnings.warn(
            "strict=False: these schema keywords are not enforced: "
            + ", ".join(f"{key!r} at {ptr or '/'}" for key, ptr in checker.dropped),
            stacklevel=4,
        )
    return _Translation(checker.standalone(schema), checker.holes, checker.pruned(schema))


def _type_set(types: Any) -> set[str]:
    return {types} if isinstance(types, str) else set(types)


def _overlap(a: set[str], b: set[str]) -> bool:
    """Whether a value can have a type of ``a`` and one of ``b`` (integers are numbers)."""
    return bool(a & b) or ("integer" in a and "number" in b) or ("number" in a and "integer" in b)


def _types_of(node: dict[str, Any], made: bool) -> set[str] | None:
    """The JSON types of the values ``node`` admits (``made``: that its translation yields); None: any."""
    if "type" in node:
        return _type_set(node["type"])
    if "enum" in node or "const" in node:
        return {_json_type(v) for v in node.get("enum", [node.get("const")])}
    return {"object"} if made and "properties" in node else None  # outlines-core makes objects from it


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "integer" if float(value).is_integer() else "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), "null")


def _same(a: Any, b: Any) -> bool:
    """JSON equality (``1`` and ``true`` differ, unlike in Python)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


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
# ECMA-262 counts U+FEFF as \s, and . stops at the line terminators U+2028 and U+2029.
_NEGATED = {"\\S": "\\s\ufeff", "\\W": "a-zA-Z0-9_", "\\D": "0-9", ".": "\u2028\u2029"}


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
            j = _class_end(pattern, i)
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


def _with_holes(regex: str, holes: dict[str, str]) -> str:
    """``regex`` with each hole's regex in place of its quoted marker."""
    for marker, hole in holes.items():
        regex = regex.replace(f'"{marker}"', f"({hole})")
    return regex


_KEY_CHAR = f"[^{_JSON_UNSAFE}]"
# Any JSON value, as outlines-core translates it in a group: its own form for {} is an
# alternation without one, which binds looser than the text around it ("a":x|y).
_ANY = {"anyOf": [{"type": t} for t in ("boolean", "null", "number", "string", "array", "object")]}


def _key_regex(pattern: str) -> str | None:
    """The property names (unescaped JSON string content) in which ``pattern`` finds a match, or None.

    JSON Schema patterns search: an unanchored side may extend by any characters.
    Anchors anywhere but at the ends of a top-level branch get None, as do patterns
    that need characters a name holds only escaped (narrowing would leave names out).
    """
    out = []
    for branch in _branches(pattern):
        head, tail = branch.startswith("^"), branch.endswith("$") and not branch.endswith("\\$")
        body = branch[head : len(branch) - tail]
        if _branches(body, "^$") != [body]:  # an anchor left inside
            return None
        safe = json_safe_pattern(ecma_classes(body))
        if safe is None:
            return None
        out.append(("" if head else f"{_KEY_CHAR}*") + safe + ("" if tail else f"{_KEY_CHAR}*"))
    return "(" + "|".join(out) + ")"


def _branches(pattern: str, at: str = "|") -> list[str]:
    """``pattern`` split at the characters ``at`` outside groups, classes and escapes."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 1
        elif c == "[":
            i = _class_end(pattern, i)
        elif c in "()":
            depth += 1 if c == "(" else -1
        elif c in at and (depth == 0 or at != "|"):
            parts.append(pattern[start:i])
            start = i + 1
        i += 1
    return parts + [pattern[start:]]


def _class_end(pattern: str, i: int) -> int:
    """The index of the ``]`` closing the character class that opens at ``i``."""
    j = i + 1 + (pattern[i + 1 : i + 2] == "^")
    j += pattern[j : j + 1] == "]"
    while j < len(pattern) and pattern[j] != "]":
        j += 2 if pattern[j] == "\\" else 1
    return j


def _search(pattern: str, name: str) -> bool:
    """Whether ``pattern`` finds a match in ``name`` (an unreadable pattern counts as a match)."""
    try:
        return re.search(ecma_classes(pattern), name) is not None
    except re.error:
        return True


def _disjoint_patterns(p: str, q: str) -> bool:
    """Whether no name matches both: anchored at the start on literal prefixes that part ways,
    or on first characters from disjoint sets."""
    a, b = _literal_prefix(p), _literal_prefix(q)
    if a is not None and b is not None and not a.startswith(b) and not b.startswith(a):
        return True
    first_p, first_q = _first_chars(p), _first_chars(q)
    return first_p is not None and first_q is not None and not first_p & first_q


def _literal_prefix(pattern: str) -> str | None:
    """The text every match of a ``^``-anchored pattern without top-level ``|`` starts with (None: unknown)."""
    if not pattern.startswith("^") or len(_branches(pattern)) > 1:
        return None
    prefix = re.match(r"[A-Za-z0-9_/:@ -]*", pattern[1:])[0]
    return prefix[:-1] if pattern[1 + len(prefix) : 2 + len(prefix)] in ("?", "*", "{") else prefix


def _first_chars(pattern: str) -> set[str] | None:
    """The characters a match of a ``^``-anchored pattern can start with, where its first atom is
    a mandatory ASCII character or class (None: unknown)."""
    if not pattern.startswith("^") or len(_branches(pattern)) > 1 or pattern[1:2] in ("", "(", "^", "."):
        return None
    end = _class_end(pattern, 1) + 1 if pattern[1] == "[" else 2 + (pattern[1] == "\\")
    atom = ecma_classes(pattern[1:end])
    if atom.startswith("[^") or not atom.isascii() or pattern[end : end + 1] in ("?", "*", "{"):
        return None
    try:
        return {chr(c) for c in range(128) if re.fullmatch(atom, chr(c))}
    except re.error:
        return None


def _literal(text: str) -> str:
    """``text`` as a regex matching exactly it."""
    return re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", text)


def _members(items: list[tuple[str, bool]], extra: str, ws: str) -> str:
    """Object members: ``items`` in order (required or not), then any number of ``extra``, comma-separated."""
    sep = f"{ws},{ws}"

    def rest(i: int, started: bool) -> str:
        if i == len(items):
            return (f"({sep}({extra}))*" if started else f"(({extra})({sep}({extra}))*)?") if extra else ""
        item, required = items[i]
        if started:
            return (f"{sep}{item}" if required else f"({sep}{item})?") + rest(i + 1, True)
        first = item + rest(i + 1, True)
        return first if required else f"({first}|{rest(i + 1, False)})"

    return rest(0, False)


class _Checker:
    """Walks a schema in outlines-core's dispatch order, rejecting (or, not strict, dropping) what it would ignore.

    It also plans the rewrites `normalized` applies: nodes structspec translates
    itself (numeric bounds) become holes, keyed by the id of the node they replace.
    """

    _DISPATCH = ("properties", "patternProperties", "anyOf", "oneOf", "prefixItems", "enum", "const", "$ref",
                 "type")

    def __init__(self, root: dict[str, Any], strict: bool, whitespace_pattern: str) -> None:
        self.root = root
        self.strict = strict
        self.whitespace = whitespace_pattern
        self.dropped: dict[tuple[str, str], None] = {}  # (keyword, pointer), in order
        self.holes: dict[str, str] = {}  # marker → regex
        self._drops: dict[int, set[str]] = {}  # id(node) → keywords dropped there
        self._replaced: dict[int, Any] = {}  # id(node) → the node outlines-core gets instead
        self._walked: set[int] = set()  # id(node) of nodes checked without error

    def walk(self, node: Any, ptr: str, refs: tuple[str, ...]) -> None:
        if node is True:
            return
        if node is False or not isinstance(node, dict):
            raise SchemaError("(schema)", ptr, "a 'false' schema admits no value")
        if id(node) in self._walked:
            return  # a definition met again: checked once, and without a cycle, so it stays checked
        keys = [k for k in node if k in _VALIDATION]
        rewritten = self._rewritten(node, ptr, refs) if keys else None
        if rewritten is not None:
            self._replaced[id(node)] = rewritten[0]
            self.walk(*rewritten)
        elif keys:
            kind = next((k for k in self._DISPATCH if self._has(node, k)), None)
            if kind is None:
                for key in keys:
                    self._unenforced(node, key, ptr, "keyword without 'type' is not supported")
            else:
                getattr(self, "_" + kind.strip("$"))(node, ptr, refs)
        self._walked.add(id(node))

    def _rewritten(self, node: dict[str, Any], ptr: str, refs: tuple[str, ...]) -> tuple[Any, str, tuple] | None:
        """An equivalent or narrower node that outlines-core can translate (to walk with its pointer
        and references), or None to keep ``node``.

        Keywords of types the node excludes go; the array form of ``items`` becomes
        ``prefixItems`` (exactly that many items); required names missing from
        ``properties`` join it with the ``additionalProperties`` schema; the siblings
        of ``allOf``, ``$ref``, ``anyOf`` and ``oneOf`` merge into their subschemas,
        as a value must match both.
        """
        types = _type_set(node["type"]) if "type" in node else None
        inapplicable = {k for k in node if types is not None and k in _KEYWORD_TYPES
                        and not _overlap(_KEYWORD_TYPES[k], types)}
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
        siblings = [k for k in node if k in _VALIDATION and k not in ("allOf", "$ref", "anyOf", "oneOf")]
        if "allOf" in node:
            merged: Any = {k: v for k, v in node.items() if k != "allOf"}
            for sub in node["allOf"]:
                merged = None if merged is None else self._merge(merged, sub)
            return self._merged(node, "allOf", ptr, merged, refs)
        if "$ref" in node and (siblings or "anyOf" in node or "oneOf" in node):
            if node["$ref"] in refs:
                raise SchemaError("$ref", ptr, f"recursive reference {node['$ref']!r} is not supported")
            merged = self._merge({k: v for k, v in node.items() if k != "$ref"}, self._resolve(node))
            return self._merged(node, "$ref", ptr, merged, refs + (node["$ref"],))
        for key in ("anyOf", "oneOf"):
            if key in node and len(siblings) + ("anyOf" in node) + ("oneOf" in node) > 1:
                rest = {k: v for k, v in node.items() if k != key}
                branches = [self._merge(rest, sub) for sub in node[key]]
                if any(b is None for b in branches):
                    self._unenforced(node, key, ptr, "its branches cannot be merged with the keywords beside it")
                    return None
                if not any(branches):
                    raise SchemaError(key, ptr, "no branch admits a value that matches the keywords beside it")
                return {key: [b for b in branches if b is not False]}, ptr, refs
        return None

    def _merged(self, node: dict[str, Any], key: str, ptr: str, merged: Any, refs: tuple[str, ...]) -> Any:
        if merged is False:
            raise SchemaError(key, ptr, "no value matches all of its subschemas")
        if merged is None:
            self._unenforced(node, key, ptr, "its subschemas set the same keyword differently "
                             "or interact (additionalProperties, items)")
            return None
        return merged, ptr, refs

    def _merge(self, a: Any, b: Any) -> Any:
        """One node for "matches ``a`` and ``b``": a dict, False if nothing matches both, None if not mergeable."""
        a, b = ({} if s is True else s for s in (a, b))
        if a is False or b is False:
            return False
        if not isinstance(a, dict) or not isinstance(b, dict):
            return None
        if "$ref" in a and "$ref" in b and a["$ref"] != b["$ref"]:
            target = self._resolve(b)
            if not isinstance(target, dict):
                return None
            b = target | {k: v for k, v in b.items() if k != "$ref"}
        for one, other in ((a, b), (b, a)):  # these keywords judge what their own node lists
            if one.get("additionalProperties", True) is not True and (
                not set(other.get("properties", {})) <= set(one.get("properties", {}))
                or other.get("patternProperties", {}) not in ({}, one.get("patternProperties"))
            ):
                return None
            if isinstance(one.get("items"), list) and "items" in other and not _same(one["items"], other["items"]):
                return None
        out = {k: v for k, v in a.items() if k in _VALIDATION}
        for key, value in b.items():
            if key not in _VALIDATION or key in ("enum", "const"):
                continue
            if key not in out or _same(out[key], value):
                out[key] = value
                continue
            mine = out[key]
            if key == "type":
                both = _type_set(mine) & _type_set(value)
                if {"integer", "number"} <= _type_set(mine) | _type_set(value) and not both & {"integer", "number"}:
                    both.add("integer")  # an integer is a number
                if not both:
                    return False
                out[key] = sorted(both)
            elif key == "required":
                out[key] = mine + [n for n in value if n not in mine]
            elif key in ("properties", "patternProperties"):
                out[key] = {**mine, **value}
                for name in mine.keys() & value.keys():
                    out[key][name] = self._merge(mine[name], value[name])
                    if out[key][name] is None:
                        return None
            elif key in ("items", "additionalProperties", "propertyNames"):
                out[key] = self._merge(mine, value)
                if out[key] is None:
                    return None
            elif key == "allOf":
                out[key] = mine + value
            elif key in ("minLength", "minItems", "minProperties", "maxLength", "maxItems", "maxProperties"):
                out[key] = (max if key.startswith("min") else min)(mine, value)
            elif key in _BOUNDS and not any(isinstance(s.get(k), bool) for s in (a, b) for k in _BOUNDS):
                out[key] = (max if "inimum" in key else min)(mine, value)
            else:
                return None
        literals = [s["enum"] if "enum" in s else [s["const"]] for s in (a, b) if "enum" in s or "const" in s]
        if literals:
            out.pop("const", None)
            out["enum"] = [v for v in literals[0] if all(any(_same(v, w) for w in other) for other in literals[1:])]
            if not out["enum"]:
                return False
        return out

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
        return out or _ANY

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
        if "patternProperties" in node:
            self._patternProperties(node, ptr, refs)
            return
        allowed = {"properties", "required", "type", "additionalProperties"}
        # outlines-core writes each listed property at most once, the required ones always, and no others
        if node.get("minProperties", 0) <= len(set(node.get("required", []))):
            allowed.add("minProperties")
        if node.get("maxProperties", len(node["properties"])) >= len(node["properties"]):
            allowed.add("maxProperties")
        self._reject_others(node, ptr, allowed)
        for name in node.get("required", []):
            if name not in node["properties"]:
                raise SchemaError("required", ptr, f"required property {name!r} is not in 'properties'")
        for name, sub in node["properties"].items():
            self.walk(sub, f"{ptr}/properties/{_escape(name)}", refs)

    def _patternProperties(self, node: dict[str, Any], ptr: str, refs: tuple[str, ...]) -> None:
        """Translate the object itself: listed properties in order, then any number of pattern-named ones.

        Names that match no pattern are left out even where additionalProperties
        would allow them (narrower: a regex cannot say "matches none of these").
        """
        props, patterns = node.get("properties", {}), node["patternProperties"]
        required = list(dict.fromkeys(node.get("required", [])))
        self._reject_others(node, ptr, {"properties", "patternProperties", "additionalProperties", "required", "type"}
                            | ({"minProperties"} if node.get("minProperties", 0) <= len(required) else set()))
        keys = {p: _key_regex(p) for p in patterns}
        clash = next((f"pattern {p!r} cannot be read as a JSON-safe, anchored-or-not regular expression"
                      for p, key in keys.items() if key is None), None)
        clash = clash or next((f"pattern {p!r} also matches property {n!r}, whose value would need both schemas"
                               for p in patterns for n in props if _search(p, n)), None)
        clash = clash or next((f"patterns {p!r} and {q!r} may match the same name with different schemas"
                               for p in patterns for q in patterns if p < q and not _same(patterns[p], patterns[q])
                               and not _disjoint_patterns(p, q)), None)
        fields = {n: (props[n], n in required) for n in props}
        for name in (n for n in required if n not in props):
            matching = [p for p in patterns if _search(p, name)]
            extra = node.get("additionalProperties", True)
            if len(matching) > 1 or (not matching and extra is False):
                clash = clash or f"required property {name!r} matches {len(matching)} patterns"
            fields[name] = (patterns[matching[0]] if matching else {} if extra is True else extra, True)
        if clash:
            self._unenforced(node, "patternProperties", ptr, clash)
            self._replaced[id(node)] = rest = {k: v for k, v in node.items() if k != "patternProperties"}
            self.walk(rest, ptr, refs)
            return
        for name, (sub, _) in fields.items():
            self.walk(sub, f"{ptr}/properties/{_escape(name)}", refs)
        for p, sub in patterns.items():
            self.walk(sub, f"{ptr}/patternProperties/{_escape(p)}", refs)
        ws = self.whitespace
        items = [(f"{_literal(json.dumps(n, ensure_ascii=False))}{ws}:{ws}({self._value_regex(sub)})", req)
                 for n, (sub, req) in fields.items()]
        extra = "|".join(f'("{keys[p]}"{ws}:{ws}({self._value_regex(sub)}))' for p, sub in patterns.items())
        self._hole(node, rf"\{{{ws}{_members(items, extra, ws)}{ws}\}}")

    def _value_regex(self, node: Any) -> str:
        """The regex of an already walked subschema, translated on its own."""
        try:
            regex = build_regex_from_schema(json.dumps(self.standalone(node)), self.whitespace)
        except ValueError as e:
            raise SchemaError("(schema)", "/", f"outlines-core cannot translate it: {e}") from None
        return _with_holes(ecma_classes(regex), self.holes)

    def standalone(self, node: Any, refs: tuple[str, ...] = ()) -> Any:
        """``node`` as outlines-core gets it (see `normalized`), each ``$ref`` replaced by its target:
        rewritten nodes no longer sit where the references point."""
        return self._inlined(self.normalized(node), refs)

    def _inlined(self, node: Any, refs: tuple[str, ...]) -> Any:
        if isinstance(node, list):
            return [self._inlined(n, refs) for n in node]
        if not isinstance(node, dict) or set(node) & {"enum", "const"}:
            return node
        if "$ref" in node:
            # the walk rejects cycles where outlines-core reads; one left sits in a keyword it ignores
            return node if node["$ref"] in refs else self.standalone(self._resolve(node), refs + (node["$ref"],))
        return {k: {n: self._inlined(v, refs) for n, v in value.items()} if k in ("properties", "patternProperties")
                else self._inlined(value, refs) for k, value in node.items() if k not in ("$defs", "definitions")}

    def _anyOf(self, node: dict[str, Any], ptr: str, refs: tuple[str, ...]) -> None:
        self._reject_others(node, ptr, {"anyOf"})
        for i, sub in enumerate(node["anyOf"]):
            self.walk(sub, f"{ptr}/anyOf/{i}", refs)

    def _oneOf(self, node: dict[str, Any], ptr: str, refs: tuple[str, ...]) -> None:
        self._reject_others(node, ptr, {"oneOf"})
        subs = node["oneOf"]
        if not all(self._excludes(x, y) for i, x in enumerate(subs) for j, y in enumerate(subs) if i != j):
            self._unenforced(node, "oneOf", ptr, "branches may overlap (a value must match exactly one): they "
                             "differ neither by type, nor by value, nor by a required property's value; "
                             "use anyOf if any branch will do")
            return
        for i, sub in enumerate(subs):
            self.walk(sub, f"{ptr}/oneOf/{i}", refs)

    def _excludes(self, x: Any, y: Any, depth: int = 0) -> bool:
        """Whether no value translated from ``x`` matches ``y``, so oneOf of the two works as anyOf."""
        x, y = self._target(x), self._target(y)
        if not isinstance(x, dict) or not isinstance(y, dict) or depth > 10:
            return False
        made, allowed = _types_of(x, made=True), _types_of(y, made=False)
        if made is not None and allowed is not None and not _overlap(made, allowed):
            return True
        if ("enum" in x or "const" in x) and ("enum" in y or "const" in y):
            values = y.get("enum", [y.get("const")])
            return not any(_same(v, w) for v in x.get("enum", [x.get("const")]) for w in values)
        if made != {"object"} or "properties" not in x:
            return False
        # x yields objects that always hold its required properties, each valued as x's schema for it says
        props, other = x["properties"], y.get("properties", {})
        for name in x.get("required", []):
            if name in props and name in other and self._excludes(props[name], other[name], depth + 1):
                return True
            if name not in other and y.get("additionalProperties", True) is False and not y.get("patternProperties"):
                return True
        plain = not any(k in x for k in ("allOf", "anyOf", "oneOf", "$ref", "patternProperties"))  # or more names
        return plain and any(n not in props and n not in x.get("required", []) for n in y.get("required", []))

    def _target(self, node: Any) -> Any:
        """``node``, or the schema a bare ``$ref`` (or chain of them) leads to."""
        for _ in range(10):
            if not (isinstance(node, dict) and set(node) & _VALIDATION == {"$ref"}):
                break
            node = self._resolve(node)
        return node

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
        for key in node:  # (keywords of the types not listed are gone: see _rewritten)
            if key in _VALIDATION and key not in allowed:
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
            self.walk(node.get("items", True), f"{ptr}/items", refs)
        if "object" in types:
            # outlines-core tells only "no property" from "some": any other count goes unchecked
            if self._has(node, "minProperties") and node["minProperties"] > 1:
                self._unenforced(node, "minProperties", ptr, "only 0 or 1 is enforced without 'properties'")
            if self._has(node, "maxProperties") and node["maxProperties"] > 0:
                self._unenforced(node, "maxProperties", ptr, "only 0 is enforced without 'properties'")
            extra = node.get("additionalProperties", True)
            if extra is not False:
                self.walk(extra, f"{ptr}/additionalProperties", refs)
