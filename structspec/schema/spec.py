"""Output specs → `Constraint`: Pydantic models, JSON Schemas (dict, bool or str), `Regex`, and types
(``int``, ``Literal[...]``, an ``Enum``) through the JSON Schema Pydantic derives for them."""

from __future__ import annotations

import enum
import json
import warnings
from collections.abc import Callable
from functools import lru_cache
from typing import Any, get_origin

import pydantic

from structspec.automaton.chars import characters
from structspec.automaton.nfa import gc_paused
from structspec.automaton.utf8 import normalize
from structspec.errors import DROPPED_WARNING, OptionError, RegexError, SpecError, StructspecWarning
from structspec.schema.bounds import MAX_FRACTION_DIGITS, MAX_INTEGER_DIGITS, Digits
from structspec.schema.checker import check
from structspec.schema.constraint import COMPACT, Constraint, Regex
from structspec.schema.keywords import FORMATS
from structspec.schema.recursion import MAX_RECURSION_DEPTH, unroll
from structspec.schema.validated import ValidatedJsonSchema, narrowings
from structspec.schema.validation import check_json, check_metaschema, too_deep, validator


def to_regex(spec: Any, whitespace_pattern: str = COMPACT, strict: bool = True,
             max_integer_digits: int | None = MAX_INTEGER_DIGITS,
             max_fraction_digits: int | None = MAX_FRACTION_DIGITS,
             max_recursion_depth: int = MAX_RECURSION_DEPTH, open_objects: bool | None = None) -> str:
    """The regex text structspec constrains decoding with, for handing the same constraint to another engine."""
    return constraint_of(spec, whitespace_pattern, strict, max_integer_digits, max_fraction_digits,
                         max_recursion_depth, open_objects).regex


def constraint_of(spec: Any, whitespace_pattern: str = COMPACT, strict: bool = True,
                  max_integer_digits: int | None = MAX_INTEGER_DIGITS,
                  max_fraction_digits: int | None = MAX_FRACTION_DIGITS,
                  max_recursion_depth: int = MAX_RECURSION_DEPTH, open_objects: bool | None = None) -> Constraint:
    """Resolve any supported spec: `Regex`, Pydantic model class, JSON Schema (dict, bool or str), or type.

    ``strict=False`` drops the schema keywords structspec cannot enforce, with a
    warning that lists each keyword and its JSON pointer, instead of raising
    `SchemaError`; the parser then validates only what was kept (a Pydantic model
    still validates everything). Numbers the schema leaves unbounded get at most
    ``max_integer_digits`` integer and ``max_fraction_digits`` fraction digits (None
    lifts a bound), so a model cannot write digits until its budget runs out; every
    such narrowing is listed in ``Constraint.narrowings``. A recursive ``$ref`` (a tree of nodes) nests at
    most ``max_recursion_depth`` levels; at the deepest level the member that would recurse is not offered
    (listed in the narrowings too). Objects read ``additionalProperties`` as JSON Schema does: the members it
    allows (an absent one: any) follow the listed ones (not beside property counts). ``open_objects=None``
    (the default) reads an absent one so in a JSON Schema, and as false in a Pydantic model's or type's schema
    (Pydantic ignores members its model does not declare, so writing them buys nothing; a narrowing, listed);
    ``True`` or ``False`` reads every absent one so.
    """
    for name, value in (("max_integer_digits", max_integer_digits), ("max_fraction_digits", max_fraction_digits)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise OptionError(f"{name} must be an int >= 1 or None (no bound), got {value!r}")
    if isinstance(max_recursion_depth, bool) or not isinstance(max_recursion_depth, int) or max_recursion_depth < 1:
        raise OptionError(f"max_recursion_depth must be an int >= 1, got {max_recursion_depth!r}")
    if open_objects is not None and not isinstance(open_objects, bool):
        raise OptionError(f"open_objects must be a bool or None (as the spec reads it), got {open_objects!r}")
    if not isinstance(whitespace_pattern, str):
        raise OptionError(f"whitespace_pattern must be a str regex, got {whitespace_pattern!r}; {_WHITESPACE_FIX}")
    _check_whitespace(whitespace_pattern)
    digits = Digits(max_integer_digits, max_fraction_digits)
    options = (digits, max_recursion_depth, open_objects is not False)  # a JSON Schema's objects: open by default
    typed = (digits, max_recursion_depth, open_objects is True)  # a Pydantic schema's: closed by default
    if isinstance(spec, Regex):  # its pattern is a str: checked when the Regex was made
        return Constraint(spec.pattern, lambda text: text, None)
    if isinstance(spec, type) and issubclass(spec, pydantic.BaseModel):
        return _json_constraint(spec.model_json_schema(schema_generator=ValidatedJsonSchema), whitespace_pattern,
                                strict, *typed, spec.model_validate_json)
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as e:
            raise SpecError(
                f"a str spec must be a JSON Schema document, and this one is not valid JSON ({e}); "
                "wrap a regex in structspec.Regex(...)"
            ) from None
        if not isinstance(spec, (dict, bool)):
            raise SpecError(f"a str spec must be a JSON Schema document, an object or a boolean, and this one "
                            f"is a {type(spec).__name__}; wrap a regex in structspec.Regex(...)")
        return _json_constraint(spec, whitespace_pattern, strict, *options, None)
    if isinstance(spec, (dict, bool)):
        return _json_constraint(spec, whitespace_pattern, strict, *options, None)
    if isinstance(spec, (type, enum.EnumMeta)) or get_origin(spec) is not None:
        try:
            adapter = pydantic.TypeAdapter(spec)
            schema = adapter.json_schema(schema_generator=ValidatedJsonSchema)
        except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError, TypeError) as e:
            raise SpecError(f"cannot derive a JSON Schema from {spec!r}: {e}") from None
        return _json_constraint(schema, whitespace_pattern, strict, *typed, adapter.validate_json)
    raise SpecError(
        f"unsupported output spec {spec!r} ({type(spec).__name__}); pass a Pydantic model class, "
        "a JSON Schema (dict or str), structspec.Regex(...), a Literal/Enum, or int/float/bool/str"
    )


_JSON_WHITESPACE = normalize(((0x09, 0x0A), (0x0D, 0x0D), (0x20, 0x20)))  # JSON's own: tab, newline, return, space


_WHITESPACE_FIX = "use a pattern of JSON whitespace, such as '' (compact), ' ?' or '[ \\t\\n\\r]*'"


@lru_cache(maxsize=64)
def _check_whitespace(whitespace_pattern: str) -> None:
    """`OptionError` unless ``whitespace_pattern`` is a regex whose strings hold JSON whitespace only (anything
    else between JSON tokens makes the output no JSON). Once per process for each pattern."""
    try:
        found = characters(whitespace_pattern) if whitespace_pattern else ()
    except RegexError as e:
        raise OptionError(f"whitespace_pattern {whitespace_pattern!r} is no regex structspec reads ({e.reason}); "
                          f"{_WHITESPACE_FIX}") from None
    other = next(((lo, hi) for lo, hi in found if not any(a <= lo and hi <= b for a, b in _JSON_WHITESPACE)), None)
    if other is not None:
        shown = next(chr(c) for c in range(other[0], other[1] + 1) if normalize(((c, c),))
                     and not any(a <= c <= b for a, b in _JSON_WHITESPACE))
        raise OptionError(f"whitespace_pattern {whitespace_pattern!r} can match {shown!r}, which is not JSON "
                          f"whitespace (space, \\t, \\n, \\r): the output would not be JSON; {_WHITESPACE_FIX}")


def _json_constraint(
    schema: dict[str, Any] | bool, whitespace_pattern: str, strict: bool, digits: Digits, depth: int,
    open_objects: bool, parse: Callable[[str], Any] | None,
) -> Constraint:
    """``parse=None``: parse JSON and validate it against the schema (less any dropped keywords); ``depth``
    is ``max_recursion_depth``."""
    if schema is False:
        raise SpecError("the JSON Schema false admits no value, so there is nothing to generate; "
                        "pass a schema that some value matches")
    root = {} if schema is True else schema  # true: any JSON value
    try:
        text = check_json(root)
        check_metaschema(root)  # before unrolling: the unrolled copy of a recursive schema can be far larger
        with gc_paused():  # (these build many small objects and free few: collections would find nothing)
            document, unrolled = unroll(root, depth, text)
            rewrites = check(document, strict, whitespace_pattern, digits, open_objects, depth)
            pattern = rewrites.regex(document.root, "", text)
    except RecursionError:  # each of these walks recurses once per level of the schema
        raise too_deep(root) from None
    dropped = tuple(f"{key!r} at {ptr or '/'}" for key, ptr in rewrites.dropped)
    if dropped:
        warnings.warn(DROPPED_WARNING + ", ".join(dropped), StructspecWarning, stacklevel=3)
    if rewrites.unknown_formats:
        warnings.warn(
            f"formats structspec does not know (supported: {', '.join(sorted(FORMATS))}) are annotations, as "
            "JSON Schema validators read unknown formats, and are not enforced: "
            + ", ".join(f"{name!r} at {ptr or '/'}" for name, ptr in rewrites.unknown_formats),
            StructspecWarning, stacklevel=3,
        )
    if parse is None:
        # (nothing dropped: the document is what is enforced, and pruning would copy it)
        validate = validator(rewrites.pruned(document.root) if rewrites.drops else document.root).validate

        def parse(text: str) -> Any:
            value = json.loads(text)
            validate(value)
            return value

    return Constraint(pattern, parse, schema, (*unrolled, *narrowings(root), *rewrites.narrowings),
                      not_enforced=dropped)
