"""Soundness by sampling: texts drawn at random from the compiled automaton (a random walk over its bytes, no
model) on bounded numbers, integers, string formats and Pydantic types are all valid — `json.loads`, then
`jsonschema` on the type's JSON Schema, then the type's own Pydantic validation (`TypeAdapter.validate_json`).

A sampler that writes whatever the automaton allows finds the corners a model at a high temperature finds
(``1e-400`` under ``exclusiveMinimum: 0`` parses to 0.0). Seeded: the same texts on every run.
"""

from __future__ import annotations

import datetime
import decimal
import ipaddress
import json
import pathlib
import random
import uuid
import warnings
from collections import deque
from typing import Annotated, Any

import pydantic
import pytest
from pydantic import AnyUrl, Field, SecretStr, TypeAdapter

from structspec.automaton.dfa import DEAD, LazyDFA
from structspec.automaton.nfa import ByteNFA
from structspec.errors import SchemaError, SpecError
from structspec.schema import constraint_of, validator

SAMPLES = 40
"""Texts drawn per type (x the types below: more than 1,000 in all)."""

LONGEST = 60
"""Bytes after which a walk heads for the nearest end instead of choosing at random."""

Positive = Annotated[float, Field(gt=0)]

NUMBERS: dict[str, Any] = {
    "float gt=0": Positive,
    "float ge=0": Annotated[float, Field(ge=0)],
    "float lt=0": Annotated[float, Field(lt=0)],
    "float le=0": Annotated[float, Field(le=0)],
    "float gt=0 lt=1": Annotated[float, Field(gt=0, lt=1)],
    "float gt=-1 lt=1": Annotated[float, Field(gt=-1, lt=1)],
    "float gt=1000": Annotated[float, Field(gt=1000)],
    "float ge=-1000 lt=1000": Annotated[float, Field(ge=-1000, lt=1000)],
    "float gt=-10**15 lt=10**15": Annotated[float, Field(gt=-10**15, lt=10**15)],
    "float ge=10**16 lt=10**16+5": Annotated[float, Field(ge=10**16, lt=10**16 + 5)],
    "float gt=2**53+1 le=2**53+9": Annotated[float, Field(gt=2**53 + 1, le=2**53 + 9)],
    "float": float,
    "finite float": Annotated[float, Field(allow_inf_nan=False)],
    "int gt=0": Annotated[int, Field(gt=0)],
    "int lt=0": Annotated[int, Field(lt=0)],
    "int ge=-5 le=5": Annotated[int, Field(ge=-5, le=5)],
    "int": int,
}

FORMATS: dict[str, Any] = {
    "datetime": datetime.datetime,
    "date": datetime.date,
    "time": datetime.time,
    "timedelta": datetime.timedelta,
    "UUID": uuid.UUID,
    "IPv4Address": ipaddress.IPv4Address,
    "IPv6Address": ipaddress.IPv6Address,
    "AnyUrl": AnyUrl,
    "Decimal": decimal.Decimal,
    "Decimal gt=0": Annotated[decimal.Decimal, Field(gt=0)],
    "Decimal max_digits=5 decimal_places=2": Annotated[decimal.Decimal, Field(max_digits=5, decimal_places=2)],
    "NaiveDatetime": pydantic.NaiveDatetime,
    "UUID4": pydantic.UUID4,
    "IPv4Network": ipaddress.IPv4Network,
    "IPv6Interface": ipaddress.IPv6Interface,
    "IPvAnyNetwork": pydantic.IPvAnyNetwork,
    "AnyHttpUrl": pydantic.AnyHttpUrl,
    "FileUrl": pydantic.FileUrl,
    "PostgresDsn": pydantic.PostgresDsn,
    "Base64Str": pydantic.Base64Str,
    "Base64UrlBytes": pydantic.Base64UrlBytes,
    "complex": complex,
    "bytes": bytes,
    "Path": pathlib.Path,
    "SecretStr": SecretStr,
}


def sample(dfa: LazyDFA, rng: random.Random) -> str:
    """One text of the automaton's language: a uniformly random next byte at each step, stopping at a final
    state with probability 1/4, and after `LONGEST` bytes along a shortest way to a final state."""
    state, out = dfa.initial, bytearray()
    while True:
        live = dfa.next_bytes(state)
        if dfa.is_final(state) and (not live or rng.random() < 0.25 or len(out) >= LONGEST):
            return out.decode()
        if len(out) >= LONGEST:
            rest = _shortest_end(dfa, state)
            return (out + rest).decode()
        byte = rng.choice(live)
        out.append(byte)
        state = dfa.step(state, bytes([byte]))


def _shortest_end(dfa: LazyDFA, state: int) -> bytes:
    """The shortest bytes from ``state`` to a final state (breadth first)."""
    seen, todo = {state}, deque([(state, b"")])
    while todo:
        d, path = todo.popleft()
        if dfa.is_final(d):
            return path
        for byte in dfa.next_bytes(d):
            nxt = dfa.step(d, bytes([byte]))
            if nxt != DEAD and nxt not in seen:
                seen.add(nxt)
                todo.append((nxt, path + bytes([byte])))
    raise AssertionError("a live state with no way to a final state")


def invalid_samples(spec: Any, seed: int, count: int = SAMPLES, **options: Any) -> list[tuple[str, str]]:
    """The texts of ``count`` drawn from ``spec``'s automaton that some reader rejects, with the reader's error."""
    adapter = TypeAdapter(spec)
    check = validator(adapter.json_schema()).validate
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dfa = LazyDFA(ByteNFA(constraint_of(spec, **options).pattern))
    rng, bad = random.Random(seed), []
    for _ in range(count):
        text = sample(dfa, rng)
        try:
            check(json.loads(text))
            adapter.validate_json(text)
        except (ValueError, pydantic.ValidationError, Exception) as e:  # jsonschema's error is no ValueError
            bad.append((text, f"{type(e).__name__}: {str(e)[:120]}"))
    return bad


@pytest.mark.parametrize("name", [*NUMBERS, *FORMATS])
def test_every_sampled_output_is_valid(name: str) -> None:
    spec = {**NUMBERS, **FORMATS}[name]
    bad = invalid_samples(spec, seed=sum(map(ord, name)))
    assert not bad, (name, bad[:5])


@pytest.mark.parametrize("name", ["float gt=0", "float lt=0", "float gt=0 lt=1", "float gt=1000"])
def test_sampled_numbers_are_valid_with_the_digit_bounds_lifted(name: str) -> None:
    bad = invalid_samples(NUMBERS[name], seed=7, max_integer_digits=None, max_fraction_digits=None)
    assert not bad, (name, bad[:5])


def test_a_tiny_number_under_an_open_zero_bound_is_not_written() -> None:
    """The probe's case: ``1e-400`` parses to 0.0, outside ``gt=0``."""
    dfa = LazyDFA(ByteNFA(constraint_of(Positive).pattern))
    accepts = lambda text: dfa.is_final(dfa.step(dfa.initial, text.encode()))  # noqa: E731
    assert not accepts("1e-400") and not accepts("0.0") and accepts("1e-300") and accepts("5e-324")


@pytest.mark.parametrize("spec", [pydantic.Json, pydantic.PastDate, pydantic.FutureDatetime,
                                  Annotated[decimal.Decimal, Field(gt=0, decimal_places=2)]])
def test_a_type_that_cannot_be_written_as_it_validates_is_refused_with_the_fix(spec: Any) -> None:
    with pytest.raises(SpecError) as e:
        constraint_of(spec)
    assert "; " in e.value.args[0]  # (the fix follows the reason)


def test_a_format_takes_the_length_bounds_its_grammar_keeps_and_refuses_the_others() -> None:
    assert constraint_of({"type": "string", "format": "uri", "minLength": 1}).regex
    with pytest.raises(SchemaError, match="format 'uri' cannot be bounded in length.*drop maxLength"):
        constraint_of({"type": "string", "format": "uri", "maxLength": 50})
    with pytest.warns(UserWarning, match="'maxLength' at /"):
        dropped = constraint_of({"type": "string", "format": "date", "maxLength": 5}, strict=False)
    assert "2024-01-31" in dropped.parse('"2024-01-31"')
