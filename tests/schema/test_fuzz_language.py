"""Generated schemas and texts: the automaton accepts a text exactly when `jsonschema` (or `re`, for a `Regex`)
does, or the difference is a narrowing the compile lists (the automaton never accepts what they reject).

Deterministic (hypothesis derandomized), so CI runs the same cases each time: anchors inside regexes and
patterns, huge numeric consts and enums, integer bounds past 1e15, and formats.
"""

from __future__ import annotations

import itertools
import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from structspec import Regex
from structspec.automaton.dfa import DEAD, LazyDFA
from structspec.automaton.nfa import ByteNFA
from structspec.errors import RegexError, SchemaError
from structspec.schema import constraint_of, validator

# A watchdog per test: a hang fails the run instead of stalling CI (thread method: hypothesis's own
# deadlines and any SIGALRM a test sets stay untouched).
pytestmark = pytest.mark.timeout(900, method="thread")

FUZZ = settings(derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck))

# Every text of up to three characters over a, b: each pattern is checked on all of them.
TEXTS = ["".join(t) for n in range(4) for t in itertools.product("ab", repeat=n)]

regexes = st.recursive(
    st.sampled_from(["a", "b", "^", "$", "a", "b"]),
    lambda inner: st.one_of(
        st.tuples(inner, inner).map("".join),
        st.tuples(inner, inner).map(lambda t: f"({t[0]}|{t[1]})"),
        inner.map(lambda x: f"({x})?"),
        inner.map(lambda x: f"({x})*"),
        inner.map(lambda x: f"({x}){{2}}"),
    ),
    max_leaves=7,
)


def _automaton(constraint) -> LazyDFA:
    return LazyDFA(ByteNFA(constraint.pattern))


def _accepts(dfa: LazyDFA, text: str) -> bool:
    state = dfa.step(dfa.initial, text.encode())
    return state != DEAD and dfa.is_final(state)


@pytest.mark.slow
@settings(FUZZ, max_examples=200)
@given(regexes)
def test_a_regex_with_anchors_matches_what_re_fullmatch_does(regex: str) -> None:
    try:
        dfa = _automaton(constraint_of(Regex(regex)))
    except RegexError as e:  # only a regex no text matches is refused
        assert "matches no string" in e.reason, (regex, e)
        assert not any(re.fullmatch(regex, t) for t in TEXTS), regex
        return
    for text in TEXTS:
        assert _accepts(dfa, text) == (re.fullmatch(regex, text) is not None), (regex, text)


@pytest.mark.slow
@settings(FUZZ, max_examples=200)
@given(regexes)
def test_a_pattern_with_anchors_matches_what_jsonschema_finds(pattern: str) -> None:
    schema = {"type": "string", "pattern": pattern}
    valid = validator(schema).is_valid
    try:
        constraint = constraint_of(schema)
    except SchemaError as e:  # refused only when no string holds a match: then no value is valid
        assert "no string matches" in e.reason, (pattern, e)
        assert not any(valid(t) for t in TEXTS), pattern
        return
    dfa, listed = _automaton(constraint), any("matches whole strings only" in n for n in constraint.narrowings)
    for text in TEXTS:
        ours = _accepts(dfa, json.dumps(text))
        assert not ours or valid(text), (pattern, text)  # never looser
        assert ours == valid(text) or listed, (pattern, text, constraint.narrowings)


numbers = st.one_of(
    st.integers(min_value=-(2**80), max_value=2**80),
    st.sampled_from([10**30, 2**64 + 1, -(2**63) - 1, 0, -1]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([123456789.12345679, -0.0, 0.1, 1e300, 5e-324, 1.5e-7, 2.0**70]),
)


@pytest.mark.slow
@FUZZ
@given(st.lists(numbers, min_size=1, max_size=4), st.booleans(), numbers)
def test_numeric_literals_are_written_as_stated(values: list, as_const: bool, other: int | float) -> None:
    schema = {"const": values[0]} if as_const else {"enum": values}
    valid = validator(schema).is_valid
    constraint = constraint_of(schema)
    dfa = _automaton(constraint)
    stated = {json.dumps(v) for v in (values[:1] if as_const else values)}
    assert any("written as the schema states them" in n for n in constraint.narrowings)
    for text in {*stated, json.dumps(other), repr(other), str(float(other))}:
        try:
            value = json.loads(text)
        except ValueError:  # (repr of a float can be inf: no JSON)
            continue
        ours = _accepts(dfa, text)
        assert not ours or valid(value), (schema, text)
        assert ours == (text in stated), (schema, text)  # the stated spellings, and only those


big = st.integers(min_value=-(10**20), max_value=10**20)


@pytest.mark.slow
@FUZZ
@given(big, st.integers(min_value=0, max_value=10**4), st.booleans(), st.lists(st.integers(-3, 10**4 + 3),
                                                                                 min_size=4, max_size=4))
def test_integer_bounds_keep_their_integers(low: int, width: int, exclusive: bool, offsets: list[int]) -> None:
    schema = {"type": "integer", "maximum": low + width,
              ("exclusiveMinimum" if exclusive else "minimum"): low}
    valid = validator(schema).is_valid
    try:
        constraint = constraint_of(schema)
    except SchemaError as e:
        assert "no integer" in e.reason and not any(valid(low + o) for o in range(-1, width + 2)), (schema, e)
        return
    dfa = _automaton(constraint)
    assert constraint.narrowings == (), schema  # a range of at most 10**4 numbers: nothing narrowed
    for n in (low + o for o in [*offsets, 0, width, -1, width + 1]):
        assert _accepts(dfa, str(n)) == valid(n), (schema, n)


FORMAT_TEXTS = {
    "date-time": ["2024-02-29T12:00:00Z", "2023-02-29T12:00:00Z", "2024-01-01t12:00:00z", "2024-01-01T25:00:00Z",
                  "2024-01-01T12:00:00.5+01:00"],
    "date": ["2024-02-29", "2023-02-29", "0000-01-01", "2024-13-01"],
    "time": ["12:00:00Z", "12:00:00z", "24:00:00Z", "12:00:00.25-05:30"],
    "duration": ["P1D", "PT1.5S", "P1W", "P", "PT"],
    "email": ["a@b.co", "a@b", "x@", "a.b+c@d-e.org"],
    "hostname": ["example.com", "-a.com", "a_b", "a" * 64],
    "ipv4": ["1.2.3.4", "256.1.1.1", "01.2.3.4"],
    "ipv6": ["::1", "1::2::3", "::ffff:1.2.3.4"],
    "uuid": ["123e4567-e89b-12d3-a456-426614174000", "123e4567e89b12d3a456426614174000"],
    "uri": ["https://a.b/c?d#e", "a b", "mailto:x@y"],
}


@pytest.mark.slow
@FUZZ
@given(st.sampled_from(sorted(FORMAT_TEXTS)), st.data())
def test_formats_never_accept_what_a_validator_rejects(name: str, data: st.DataObject) -> None:
    schema = {"type": "string", "format": name}
    valid, constraint = validator(schema).is_valid, constraint_of(schema)
    dfa = _automaton(constraint)
    assert any(n.startswith(f"/: format {name!r} is written as structspec's grammar") for n in constraint.narrowings)
    text = data.draw(st.sampled_from(FORMAT_TEXTS[name]) | st.text(alphabet="0123456789:-.TZPMSDWHY@abc",
                                                                    max_size=12))
    assert not _accepts(dfa, json.dumps(text)) or valid(text), (name, text)
