"""The JSON Schema of a Pydantic model or type as the model validates: Pydantic's own, but for the types whose
schema admits strings the model rejects (a ``Decimal`` takes any string, a ``timedelta`` any ISO 8601
duration, however large), which are written in a language the model reads. Each such node says its narrowing
(`NARROWING`), which `narrowings` lists with its pointer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from structspec.errors import SpecError
from structspec.schema.bounds import MAX_INTEGER_DIGITS

NARROWING = "x-structspec-narrowing"
"""The key (an annotation to every validator: ``x-…``) under which a node states how it narrows the type."""

DURATION = (r"^-?P([0-9]{1,6}D(T([0-9]{1,2}H)?([0-9]{1,2}M)?([0-9]{1,2}(\.[0-9]{1,6})?S)?)?"
            r"|T([0-9]{1,2}H([0-9]{1,2}M)?([0-9]{1,2}(\.[0-9]{1,6})?S)?|[0-9]{1,2}M([0-9]{1,2}(\.[0-9]{1,6})?S)?"
            r"|[0-9]{1,2}(\.[0-9]{1,6})?S))$")
"""ISO 8601 durations as Pydantic writes a ``timedelta`` (``P1DT2H3M4.5S``), each part of a few digits:
Pydantic refuses larger ones (more than 999,999,999 days)."""


class ValidatedJsonSchema(GenerateJsonSchema):
    """Pydantic's JSON Schema generator, with ``Decimal`` and ``timedelta`` written as the model validates."""

    def decimal_schema(self, schema: core_schema.DecimalSchema) -> JsonSchemaValue:
        """A JSON number with the bounds (Pydantic reads a number exactly); with ``max_digits`` or
        ``decimal_places``, a string of at most that many digits."""
        number = super().decimal_schema(schema)["anyOf"][0]
        digits, places = schema.get("max_digits"), schema.get("decimal_places")
        if digits is None and places is None:
            return number | {NARROWING: "a Decimal is written as a JSON number (Pydantic also reads a string)"}
        if any(schema.get(k) is not None for k in ("gt", "ge", "lt", "le", "multiple_of")):
            raise SpecError("a Decimal with both bounds (gt, ge, lt, le, multiple_of) and max_digits/decimal_places "
                            "cannot be written exactly: structspec writes its digits as a string pattern, which "
                            "holds no bound; drop one of them, or use a float field with the bounds")
        return {"type": "string", "pattern": decimal_pattern(digits, places),
                NARROWING: "a Decimal with max_digits/decimal_places is written as a string of plain decimal "
                           "digits (no exponent)"}

    def timedelta_schema(self, schema: core_schema.TimedeltaSchema) -> JsonSchemaValue:
        """A duration as Pydantic writes one, of a size Pydantic reads."""
        return {"type": "string", "pattern": DURATION,
                NARROWING: "a timedelta is written as days, hours, minutes and seconds (P1DT2H3M4.5S), at most "
                           "999,999 days"}


def decimal_pattern(digits: int | None, places: int | None) -> str:
    """Pattern of the plain decimals (``-12.50``) of at most ``digits`` digits in all and ``places`` after the
    point (None: no bound; the integer digits then at most `MAX_INTEGER_DIGITS`)."""
    whole = MAX_INTEGER_DIGITS if digits is None else digits - (places or 0)
    parts = []
    for n in range(whole + 1):  # n integer digits ("0" has none)
        room = min(x for x in (places, None if digits is None else digits - n) if x is not None)
        head = "0" if n == 0 else "[1-9]" + (f"[0-9]{{{n - 1}}}" if n > 1 else "")
        parts.append(head + (rf"(\.[0-9]{{1,{room}}})?" if room > 0 else ""))
    return "^-?(" + "|".join(parts) + ")$"


def narrowings(schema: Any, pointer: str = "") -> Iterator[str]:
    """The narrowings the nodes of ``schema`` state (`NARROWING`), as ``"pointer: what"``."""
    if isinstance(schema, dict):
        if isinstance(schema.get(NARROWING), str):
            yield f"{pointer or '/'}: {schema[NARROWING]}"
        for key, value in schema.items():
            yield from narrowings(value, f"{pointer}/{str(key).replace('~', '~0').replace('/', '~1')}")
    elif isinstance(schema, list):
        for i, value in enumerate(schema):
            yield from narrowings(value, f"{pointer}/{i}")
