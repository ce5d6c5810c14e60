"""The JSON Schema of a Pydantic model or type as the model validates: Pydantic's own, but for the types whose
schema admits strings the model rejects (a ``Decimal`` takes any string, a ``timedelta`` any ISO 8601
duration, however large), which are written in a language the model reads. Each such node says its narrowing
(`NARROWING`), which `narrowings` lists with its pointer."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from structspec.errors import SpecError
from structspec.schema import grammars
from structspec.schema.bounds import MAX_INTEGER_DIGITS

NARROWING = "x-structspec-narrowing"
"""The key (an annotation to every validator: ``x-…``) under which a node states how it narrows the type."""

DURATION = (r"^-?P([0-9]{1,6}D(T([0-9]{1,2}H)?([0-9]{1,2}M)?([0-9]{1,2}(\.[0-9]{1,6})?S)?)?"
            r"|T([0-9]{1,2}H([0-9]{1,2}M)?([0-9]{1,2}(\.[0-9]{1,6})?S)?|[0-9]{1,2}M([0-9]{1,2}(\.[0-9]{1,6})?S)?"
            r"|[0-9]{1,2}(\.[0-9]{1,6})?S))$")
"""ISO 8601 durations as Pydantic writes a ``timedelta`` (``P1DT2H3M4.5S``), each part of a few digits:
Pydantic refuses larger ones (more than 999,999,999 days)."""


class ValidatedJsonSchema(GenerateJsonSchema):
    """Pydantic's JSON Schema generator, with the types whose schema is looser than their validation written as
    they validate: ``Decimal``, ``timedelta``, naive datetimes, versioned UUIDs, URLs of allowed schemes, networks
    and interfaces, Base64 strings, ``complex``; ``Json`` and dates relative to today refused (`SpecError`)."""

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

    def generate(self, schema: core_schema.CoreSchema, mode: Any = "validation") -> JsonSchemaValue:
        """Pydantic's schema, with its own formats (no validator knows them) written as `_rewritten` says."""
        return _rewritten(super().generate(schema, mode))

    def datetime_schema(self, schema: core_schema.DatetimeSchema) -> JsonSchemaValue:
        """A date-time; a naive one (``NaiveDatetime``) without an offset."""
        _now_refused(schema, "datetime")
        if schema.get("tz_constraint") != "naive":
            return super().datetime_schema(schema)
        return {"type": "string", "pattern": f"^({grammars.catalogue()['date'].pattern})[Tt]{_CLOCK}$",
                NARROWING: "a naive datetime is written as an RFC 3339 date and time without an offset"}

    def date_schema(self, schema: core_schema.DateSchema) -> JsonSchemaValue:
        """A date (never one relative to today: refused)."""
        _now_refused(schema, "date")
        return super().date_schema(schema)

    def uuid_schema(self, schema: core_schema.UuidSchema) -> JsonSchemaValue:
        """A UUID; one of a version (``UUID4``) with that version's digit and the RFC 4122 variant."""
        version = schema.get("version")
        if version is None:
            return super().uuid_schema(schema)
        return {"type": "string", "pattern": f"^[0-9a-f]{{8}}-[0-9a-f]{{4}}-{version}[0-9a-f]{{3}}-[89ab][0-9a-f]{{3}}"
                "-[0-9a-f]{12}$", NARROWING: "a UUID is written in lower case"}

    def complex_schema(self, schema: core_schema.ComplexSchema) -> JsonSchemaValue:
        """A complex number as Python writes one (``1.5-2j``)."""
        real = r"-?[0-9]{1,15}(\.[0-9]{1,15})?"
        return {"type": "string", "pattern": f"^({real}|{real}[+-][0-9]{{1,15}}(\\.[0-9]{{1,15}})?j|{real}j)$",
                NARROWING: "a complex number is written as Python writes one (1.5-2j), of at most 15 digits a part"}

    def url_schema(self, schema: core_schema.UrlSchema) -> JsonSchemaValue:
        """A URI; of the allowed schemes only (``AnyHttpUrl``), with a host a URL parser reads."""
        found = super().url_schema(schema)
        schemes = schema.get("allowed_schemes")
        if not schemes:
            return found
        uri, names = grammars.catalogue()["uri"].pattern, grammars.catalogue()
        path, tail = r"(/([a-zA-Z0-9._~!$&'()*+,;=:@-]|%[0-9a-fA-F]{2})*)*", uri[uri.index(r"(\?"):]
        host = rf"({names['hostname'].pattern}|{names['ipv4'].pattern}|\[({names['ipv6'].pattern})\])"
        port = "" if "file" in schemes else "(:[0-9]{1,4})?"  # (a file URL has none)
        authority = f"//{host}{port}{path}{tail}"  # (a host as a URL parser reads one: no user info)
        return {k: v for k, v in found.items() if k != "format"} | {
            "pattern": f"^({'|'.join(map(re.escape, schemes))}):{authority}$",
            NARROWING: f"{_URL} as one of the schemes {', '.join(schemes)}, a host name or IP address "
                       "(no user info), a port of at most 4 digits, a path, query and fragment"}

    def multi_host_url_schema(self, schema: core_schema.MultiHostUrlSchema) -> JsonSchemaValue:
        """A URL of one host (``PostgresDsn``), as `url_schema` writes it."""
        return self.url_schema(schema)  # (the keys url_schema reads are the same)

    def json_schema(self, schema: core_schema.JsonSchema) -> JsonSchemaValue:
        """Refused: a JSON document inside a string (``Json[...]``) is not written."""
        raise SpecError("a Json field (a JSON document inside a JSON string) cannot be constrained: structspec "
                        "writes no escaped document; declare the inner type as the field's type instead")

    def timedelta_schema(self, schema: core_schema.TimedeltaSchema) -> JsonSchemaValue:
        """A duration as Pydantic writes one, of a size Pydantic reads."""
        return {"type": "string", "pattern": DURATION,
                NARROWING: "a timedelta is written as days, hours, minutes and seconds (P1DT2H3M4.5S), at most "
                           "999,999 days"}


_URL = "a URL is written"

_CLOCK = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?"

_ASCII_BASE64 = ("^(([A-Za-f][A-HQ-Xg-nw-z0-3][ABEFIJMNQRUVYZcdghklopstwx014589][A-Za-z0-9+/])*"
                 "([A-Za-f][AQgw]==|[A-Za-f][A-HQ-Xg-nw-z0-3][AEIMQUYcgkosw048]=)?)$")
"""Base64 of ASCII text, padded, each character's unused bits zero (a ``Base64Str`` decodes to UTF-8 text: any
ASCII does). Each quad's characters keep every byte below 0x80."""

_ENCODED = {"base64": _ASCII_BASE64, "base64url": _ASCII_BASE64.replace("+/", "-_")}
"""Pydantic's encoded-string formats → the pattern structspec writes for them."""

_ADDRESSES = {"ipv4network": ("ipv4",), "ipv6network": ("ipv6",), "ipv4interface": ("ipv4",),
              "ipv6interface": ("ipv6",), "ipvanyaddress": ("ipv4", "ipv6"), "ipvanynetwork": ("ipv4", "ipv6"),
              "ipvanyinterface": ("ipv4", "ipv6")}
"""Pydantic's address and network formats → the address formats structspec writes for them (an address is
the network or interface of its own length: ``10.0.0.1`` is ``10.0.0.1/32``)."""


def _rewritten(schema: Any) -> Any:
    """``schema`` with each node of a format of `_ADDRESSES` written as its addresses, of `_ENCODED` as its
    pattern, and the ``minLength: 1`` Pydantic adds beside a URL's pattern dropped (changes it in place)."""
    if isinstance(schema, list):
        return [_rewritten(x) for x in schema]
    if not isinstance(schema, dict):
        return schema
    for key, value in schema.items():
        schema[key] = _rewritten(value)
    if str(schema.get(NARROWING)).startswith(_URL) and schema.get("minLength") == 1:
        del schema["minLength"]  # (its pattern matches no empty string)
    if schema.get("type") == "string" and schema.get("format") in _ENCODED:
        return {k: v for k, v in schema.items() if k != "format"} | {
            "pattern": _ENCODED[schema["format"]], NARROWING: f"{schema['format']} is written as the encoding of "
            "ASCII text, padded (a Base64Str decodes to text)"}
    found = _ADDRESSES.get(schema.get("format")) if schema.get("type") == "string" else None
    if found is None:
        return schema
    rest = {k: v for k, v in schema.items() if k not in ("format", "type")}
    nodes = [{"type": "string", "format": f} for f in found]
    written = nodes[0] if len(nodes) == 1 else {"anyOf": nodes}
    return rest | written | {NARROWING: f"a {schema['format']} is written as one address (no prefix length)"}


def _now_refused(schema: dict[str, Any], kind: str) -> None:
    """`SpecError` for a date or datetime relative to now (``PastDate``, ``FutureDatetime``)."""
    if schema.get("now_op") is not None:
        raise SpecError(f"a {schema['now_op']} {kind} (Past…/Future… types) cannot be constrained: whether a "
                        f"{kind} is {schema['now_op']} depends on when the output is read; use {kind} and check it "
                        "after parsing")


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
