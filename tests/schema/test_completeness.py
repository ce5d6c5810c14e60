"""Completeness, beside the soundness fuzzers (`test_fuzz_language.py`, `test_fuzz.py`): valid instances of
generated schemas, written as `json.dumps` writes them (compact, characters unescaped), as Pydantic's
``model_dump_json`` does (`pydantic_core.to_json`) and in the JSON grammar's other spellings (``1e5``, ``-0``), are
accepted by the compiled automaton, or a narrowing listed at the value's pointer leaves them out.

Integers are generated as Python ints: ``1.0`` is an integer to JSON Schema but not to Pydantic's strict mode, so it
is never written (docs/concepts/narrowings.md). Deterministic (hypothesis derandomized), fast tier.
"""

from __future__ import annotations

import json
import re
import warnings
from typing import Any

import pydantic_core
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from structspec.automaton.dfa import DEAD, LazyDFA
from structspec.automaton.nfa import ByteNFA
from structspec.errors import SchemaError
from structspec.schema import constraint_of, validator
from structspec.schema.numbers import EXPONENTS
from structspec.schema.translate import STRINGS

FUZZ = settings(derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck))

PATTERNS = [r"^\w+$", r"^\d{3}-\d{2}$", r"^[A-Z][a-z]*$", r"^[a-z]+(_\w+)?$", r"^\w{2,4}$"]
# Floats Python and Pydantic write with an exponent, or as a long decimal (1e-05: 0.00001), and negative zero.
FLOATS = [1e-05, 1.5e-7, 5e-324, 2.5e-10, 1e16, 1e300, -0.0, 0.30000000000000004, 123456789.125]
ALPHABETS = st.sampled_from([st.characters(codec="ascii"), st.characters(codec="utf-8")])
_NUMBER = re.compile(r"-?(?P<int>[0-9]+)(\.(?P<frac>[0-9]+))?([eE](?P<sign>[+-]?)(?P<exp>[0-9]+))?")


def _accepts(dfa: LazyDFA, text: str) -> bool:
    state = dfa.step(dfa.initial, text.encode())
    return state != DEAD and dfa.is_final(state)


# --- schemas, and a valid instance of each, with the leaves (pointer, schema, value) it holds -------------------

def _bounds(data: st.DataObject) -> dict[str, Any]:
    """Integer bounds, none, one or both, each inclusive or exclusive; a range that holds integers."""
    low = data.draw(st.none() | st.integers(-50, 50))
    high = data.draw(st.none() | st.integers(2, 60).map(lambda w: w + (low or 0)))
    node = {}
    for value, inclusive, exclusive in ((low, "minimum", "exclusiveMinimum"), (high, "maximum", "exclusiveMaximum")):
        if value is not None:
            node[data.draw(st.sampled_from([inclusive, exclusive]))] = value
    return node


def _leaf(data: st.DataObject) -> dict[str, Any]:
    kind = data.draw(st.sampled_from(["number", "integer", "string", "pattern", "enum", "boolean", "null"]))
    if kind in ("number", "integer"):
        return {"type": kind} | _bounds(data)
    if kind == "string":
        low = data.draw(st.integers(0, 3))
        return {"type": "string"} | data.draw(st.sampled_from([{}, {"minLength": low}, {"maxLength": low + 4}]))
    if kind == "pattern":
        return {"type": "string", "pattern": data.draw(st.sampled_from(PATTERNS))}
    if kind == "enum":
        values = st.one_of(st.text(max_size=4), st.integers(-10**20, 10**20), st.sampled_from(FLOATS), st.none())
        return {"enum": data.draw(st.lists(values, min_size=1, max_size=4, unique_by=json.dumps))}
    return {"type": kind}


def _schema(data: st.DataObject, depth: int) -> dict[str, Any]:
    kind = data.draw(st.sampled_from(["leaf", "leaf", "object", "array", "anyOf"] if depth else ["leaf"]))
    if kind == "leaf":
        return _leaf(data)
    if kind == "anyOf":  # (null beside: the branches never overlap)
        return {"anyOf": [_typed_leaf(data), {"type": "null"}]}
    if kind == "array":
        node = {"type": "array", "items": _schema(data, depth - 1)}
        return node | data.draw(st.sampled_from([{}, {"minItems": 1}, {"maxItems": 2}]))
    names = data.draw(st.lists(st.sampled_from("abcde"), min_size=1, max_size=3, unique=True))
    node = {"type": "object", "properties": {n: _schema(data, depth - 1) for n in names},
            "required": data.draw(st.lists(st.sampled_from(names), unique=True))}
    return node | data.draw(st.sampled_from([{}, {"additionalProperties": False}]))


def _typed_leaf(data: st.DataObject) -> dict[str, Any]:
    """A leaf with a type other than null (an anyOf branch beside null)."""
    leaf = _leaf(data)
    return leaf if leaf.get("type") not in ("null", None) else {"type": "string"}


def _in_range(node: dict[str, Any], x: float) -> bool:
    return all(op(x, node[k]) for k, op in (("minimum", float.__ge__), ("exclusiveMinimum", float.__gt__),
                                           ("maximum", float.__le__), ("exclusiveMaximum", float.__lt__))
               if k in node)


def _number(data: st.DataObject, node: dict[str, Any]) -> int | float:
    low = node.get("minimum", node.get("exclusiveMinimum"))
    high = node.get("maximum", node.get("exclusiveMaximum"))
    if node["type"] == "integer":
        lo = None if low is None else low + ("exclusiveMinimum" in node)
        hi = None if high is None else high - ("exclusiveMaximum" in node)
        return data.draw(st.integers(-10**25 if lo is None else lo, 10**25 if hi is None else hi))
    floats = st.floats(low, high, exclude_min="exclusiveMinimum" in node, exclude_max="exclusiveMaximum" in node,
                       allow_nan=False, allow_infinity=False)
    known = [x for x in FLOATS if _in_range(node, x)]
    return data.draw(floats | (st.sampled_from(known) if known else floats))


def _instance(data: st.DataObject, node: dict[str, Any], ptr: str, leaves: list) -> Any:
    if "anyOf" in node:
        i = data.draw(st.integers(0, 1))
        return _instance(data, node["anyOf"][i], f"{ptr}/anyOf/{i}", leaves)
    if node.get("type") == "object":
        value = {n: _instance(data, sub, f"{ptr}/properties/{n}", leaves) for n, sub in node["properties"].items()
                 if n in node["required"] or data.draw(st.booleans())}
        return value
    if node.get("type") == "array":
        low, high = node.get("minItems", 0), node.get("maxItems", 3)
        count = data.draw(st.integers(low, high))
        return [_instance(data, node["items"], f"{ptr}/items", leaves) for _ in range(count)]
    if "enum" in node:
        value = data.draw(st.sampled_from(node["enum"]))
    elif node["type"] in ("number", "integer"):
        value = _number(data, node)
    elif "pattern" in node:  # (half in ASCII: an instance no narrowing excuses must be accepted whole)
        value = data.draw(st.from_regex(node["pattern"], fullmatch=True, alphabet=data.draw(ALPHABETS)))
    elif node["type"] == "string":
        value = data.draw(st.text(data.draw(ALPHABETS), min_size=node.get("minLength", 0),
                                  max_size=node.get("maxLength", 6)))
    else:
        value = None if node["type"] == "null" else data.draw(st.booleans())
    leaves.append((ptr or "/", node, value))
    return value


# --- how a value is written ------------------------------------------------------------------------------------

def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _pydantic(value: Any) -> str:
    return pydantic_core.to_json(value).decode()


def _grammar(value: Any) -> str:
    """Compact JSON in spellings Python never writes and the JSON grammar allows: an exponent without sign (1e5),
    zero as -0."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{_dumps(k)}:{_grammar(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(map(_grammar, value)) + "]"
    if type(value) is int and value == 0:
        return "-0"
    return _dumps(value).replace("e+", "e")


WRITERS = {"json.dumps": _dumps, "pydantic": _pydantic, "grammar": _grammar}


def _excused(node: dict[str, Any], text: str, value: Any, listed: list[str], everywhere: list[str]) -> str | None:
    """The listed narrowing (of the leaf's pointer, or said once for the document) that leaves out ``text``, the
    leaf ``value`` of schema ``node`` as written; None if none does."""
    if "enum" in node:
        stated = next((n for n in listed if "written as the schema states them" in n), None)
        return stated if stated and text != _dumps(value) else None
    if isinstance(value, str):
        if any(0 <= ord(c) <= 0x1F or 0x7F <= ord(c) <= 0x9F for c in value):
            return next((n for n in everywhere if STRINGS in n), None)
        if not value.isascii():
            return next((n for n in listed if "as ECMA-262 does" in n), None)
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    m = _NUMBER.fullmatch(text)
    assert m, text
    digits = {"integer": len(m["int"]), "fraction": len(m["frac"] or ""), "exponent": len(m["exp"] or "")}
    for n in listed:
        bound = re.search(r"at most (\d+) (integer|fraction|exponent) digits", n)
        if bound and digits[bound[2]] > int(bound[1]):
            return n
    if m["exp"] is not None and m["sign"] != "-" and int(m["exp"]) > 290:  # (1e+308 and up: no finite float)
        return next((n for n in listed if "below 1e308" in n), None)
    small = m["sign"] == "-" and m["int"] != "0" and len(m["int"]) == 1 and int(m["exp"]) > 0
    if m["exp"] is not None and not small:
        return next((n for n in listed if EXPONENTS in n), None)
    return None


@pytest.mark.timeout(240)
@settings(FUZZ, max_examples=300)
@given(st.data())
def test_valid_instances_are_accepted_or_a_listed_narrowing_leaves_them_out(data: st.DataObject) -> None:
    schema = _schema(data, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (nothing here is misspelled; an unknown format is never drawn)
        try:
            constraint = constraint_of(schema)
        except SchemaError as e:  # only the empty ones: a range with no integer in it is never drawn
            raise AssertionError(f"{schema} was refused: {e}") from None
    dfa, valid = LazyDFA(ByteNFA(constraint.pattern)), validator(schema).is_valid
    leaves: list = []
    value = _instance(data, schema, "", leaves)
    assert valid(value), (schema, value)  # (the generator's own check: only valid instances)
    for name, write in WRITERS.items():
        text = write(value)
        if _accepts(dfa, text):
            continue
        excuses = [
            _excused(node, write(leaf), leaf, [n for n in constraint.narrowings if n.startswith(f"{ptr}: ")],
                     list(constraint.narrowings))
            for ptr, node, leaf in leaves]
        assert any(excuses), (name, schema, text, constraint.narrowings)


# --- the rejections the probe found (issue 48), one by one ----------------------------------------------------

def _dfa(schema: dict[str, Any]) -> tuple[LazyDFA, tuple[str, ...]]:
    constraint = constraint_of(schema)
    return LazyDFA(ByteNFA(constraint.pattern)), constraint.narrowings


@pytest.mark.parametrize("options", [{}, {"max_integer_digits": None, "max_fraction_digits": None}])
def test_a_number_takes_an_exponent_without_sign(options: dict) -> None:
    constraint = constraint_of({"type": "number"}, **options)
    dfa = LazyDFA(ByteNFA(constraint.pattern))
    for text in ("1e5", "1E5", "2.5e10", "1e+5", "1e-05", "-0"):
        assert _accepts(dfa, text), text
    for text in ("1e", "1e+", "+1", "01", "1.", ".5"):
        assert not _accepts(dfa, text), text


def test_bounded_numbers_take_small_floats_as_python_and_pydantic_write_them() -> None:
    dfa, narrowings = _dfa({"type": "number", "minimum": 0, "maximum": 10})
    for x in (1e-05, 1.5e-7, 5e-324, -0.0, 2.5):
        for text in (_dumps(x), _pydantic(x)):
            assert _accepts(dfa, text), text
    for text in ("1e2", "1e0", "0e-5", "10e-1", "-1e-05", "10.5", "1e-0"):  # other exponents: listed
        assert not _accepts(dfa, text), text
    assert f"/: {EXPONENTS}" in narrowings
    dfa, _ = _dfa({"type": "number", "exclusiveMinimum": 0, "maximum": 1})
    assert _accepts(dfa, "1e-05") and not _accepts(dfa, "-0.0") and not _accepts(dfa, "0")
    dfa, _ = _dfa({"type": "number", "minimum": -1, "exclusiveMaximum": 0})
    assert _accepts(dfa, "-1e-05") and not _accepts(dfa, "1e-05") and not _accepts(dfa, "-0.0")
    dfa, _ = _dfa({"type": "number", "minimum": 1, "maximum": 5})  # no number below 1: no exponent
    assert not _accepts(dfa, "1e-05") and _accepts(dfa, "1.0")


def test_bounded_integers_take_minus_zero() -> None:
    for bounds in ({"minimum": -3, "maximum": 5}, {"minimum": 0}, {"maximum": 0}, {"exclusiveMinimum": -1}):
        dfa, _ = _dfa({"type": "integer"} | bounds)
        assert _accepts(dfa, "-0") and _accepts(dfa, "0"), bounds
    dfa, _ = _dfa({"type": "integer", "minimum": 1, "maximum": 5})
    assert not _accepts(dfa, "-0")


def test_ascii_classes_of_a_pattern_are_listed() -> None:
    for pattern in (r"^\w+$", r"^[\d-]+$"):
        dfa, narrowings = _dfa({"type": "string", "pattern": pattern})
        assert any("reads \\d and \\w as ECMA-262 does" in n for n in narrowings), narrowings
        assert _accepts(dfa, '"ab1"' if "w" in pattern else '"12-3"') and not _accepts(dfa, '"é٣"')
    _, narrowings = _dfa({"type": "string", "pattern": r"^[a-z]+$"})
    assert narrowings == ()
    _, narrowings = _dfa({"type": "object", "patternProperties": {r"^\w+$": {"type": "string"}},
                          "additionalProperties": False})
    assert any("patternProperties pattern '^\\\\w+$' reads" in n for n in narrowings), narrowings


def test_a_misspelled_keyword_is_named_with_the_fix() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string", "maxlength": 3}}, "requried": ["a"]}
    with pytest.warns(UserWarning, match=r"'requried' at / \(did you mean 'required'\?\), 'maxlength' at "
                                         r"/properties/a \(did you mean 'maxLength'\?\)"):
        constraint_of(schema)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # extensions, switched-off keywords and annotations: nothing said
        constraint_of({"type": "string", "x-requried": 1, "_format": "date", "note": "n", "descrption": "d"})
    with pytest.raises(SchemaError, match="did you mean 'required'") as err:
        constraint_of({"type": "object", "properties": {"a": {"requried": ["b"]}}})
    assert err.value.keyword == "requried" and err.value.pointer == "/properties/a"
