"""The automaton's language is the spec's: tables of texts it must accept or reject (checked against `re` or
`jsonschema` where they apply), the refusals that say why, and the narrowings that are listed."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from structspec import Regex
from structspec.automaton.dfa import DEAD, LazyDFA
from structspec.automaton.nfa import ByteNFA
from structspec.errors import InvalidSchemaError, OptionError, RegexError, SchemaError
from structspec.schema import constraint_of


def accepts(spec: object, text: str, **options: object) -> bool:
    """Whether the automaton of ``spec`` accepts ``text`` whole."""
    dfa = LazyDFA(ByteNFA(constraint_of(spec, **options).pattern))
    state = dfa.step(dfa.initial, text.encode())
    return state != DEAD and dfa.is_final(state)


@pytest.mark.parametrize(("regex", "texts"), [
    ("a$(b)?", ["a", "ab", ""]),
    (r"^\d{4}$", ["1234", "123", "12345"]),
    ("(^a|b)c", ["ac", "bc", "c"]),
    ("x(^a|b)", ["xa", "xb"]),
    ("(a^)*b", ["b", "ab"]),
    ("(a|$)*", ["", "a", "aa"]),
    ("^(ab$|a)+", ["ab", "a", "aab", "aa", "aba"]),
    (r"a\Z|\Ab", ["a", "b"]),
])
def test_anchors_in_a_regex_hold_where_a_full_match_puts_them(regex: str, texts: list[str]) -> None:
    for text in texts:
        assert accepts(Regex(regex), text) == (re.fullmatch(regex, text) is not None), (regex, text)


@pytest.mark.parametrize("regex", ["a$b", "[^a]^", r"\[^a"])
def test_a_regex_whose_anchors_admit_nothing_is_refused(regex: str) -> None:
    with pytest.raises(RegexError, match="matches no string"):
        constraint_of(Regex(regex)).pattern and ByteNFA(regex)


@pytest.mark.parametrize(("regex", "says"), [
    (r"a\b", r"word boundaries \(\\b, \\B\) are not supported; spell"),
    ("(?=a)a", "lookarounds .* are not supported; write the language without them"),
    (r"(a)\1", "backreferences .* no finite automaton holds them"),
])
def test_what_a_regex_cannot_hold_is_named(regex: str, says: str) -> None:
    with pytest.raises(RegexError, match=says) as err:
        ByteNFA(regex)
    assert "at (anchors" not in str(err.value)


@pytest.mark.slow
@pytest.mark.parametrize(("pattern", "texts"), [
    ("^a$(b)?", ["a", "ab", "ba"]),
    ("^(a$|b)c?", ["a", "b", "bc", "ac"]),
    (r"^\d{4}$", ["1234", "12345"]),
    (r"^\D$", ["a", "4", "\u06f4"]),  # Python's re (jsonschema) reads \D as no Unicode digit
    (r"^[^\d]$", ["a", "4", "\u06f4"]),
    (r"^\W$", ["-", "a", "\xe9", "\xb2"]),  # ² is no word character to ECMA-262, one to Python (No)
    (r"^[^\w]$", ["-", "a", "\xe9", "\xb2"]),
    (r"^\s$", [" ", "\xa0", "\ufeff"]),  # U+FEFF: ECMA-262's \s, not Python's
    (r"^\x7f+$", ["\x7f", "\x7f\x7f", "a"]),
])
def test_a_pattern_holds_no_string_a_validator_rejects(pattern: str, texts: list[str]) -> None:
    schema = {"type": "string", "pattern": pattern}
    valid = jsonschema.Draft202012Validator(schema).is_valid
    for text in texts:
        if accepts(schema, json.dumps(text, ensure_ascii=False)):
            assert valid(text), (pattern, text)


def test_anchors_inside_a_pattern_are_not_dropped() -> None:
    schema = {"type": "string", "pattern": "^a$(b)?"}
    assert accepts(schema, '"a"') and not accepts(schema, '"ab"')
    assert constraint_of(schema).narrowings == ()  # the search finds nothing more than the whole match
    with pytest.raises(SchemaError, match="no string matches 'a\\$b'"):
        constraint_of({"type": "string", "pattern": "a$b"})  # no string holds a match: no value


@pytest.mark.parametrize(("pattern", "says"), [
    (r"^\p{L}+$", r"Unicode property escapes \(\\p\{…\}\) cannot be read by Python's re.*write the characters"),
    (r"^\u{1F600}$", r"code point escapes \(\\u\{…\}\) cannot be read.*write the character itself"),
    ('^a"$', "it needs a quote, backslash or control character .*; leave them out of the pattern"),
])
def test_a_refused_pattern_says_why(pattern: str, says: str) -> None:
    with pytest.raises(SchemaError, match=says):
        constraint_of({"type": "string", "pattern": pattern})


def test_a_pattern_narrowed_to_unescaped_characters_says_so() -> None:
    narrowings = constraint_of({"type": "string", "pattern": "^.+$"}).narrowings
    assert narrowings == ("/: pattern '^.+$' is written without the characters a JSON string holds only escaped "
                          "(quote, backslash, U+0000-U+001F)",)


@pytest.mark.parametrize("value", [10**30, 2**64 + 1, -(2**63) - 1, 123456789.12345679, -0.0, 1e300, 0.1, 5e-324])
def test_numeric_literals_are_written_exactly(value: int | float) -> None:
    text = json.dumps(value)
    for schema in ({"const": value}, {"enum": ["x", value, None]}):
        assert accepts(schema, text), (schema, text)
        assert jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
    assert not accepts({"const": 10**30}, "1e+30")
    assert constraint_of({"const": 10**30}).narrowings == (
        "/: the numbers of const are written as the schema states them, not in other spellings of the same value "
        "(1.0 or 1e0 for 1)",)


def test_integer_bounds_past_1e15_keep_their_integers() -> None:
    schema = {"type": "integer", "minimum": 10**16, "maximum": 10**16 + 5}
    valid = jsonschema.Draft202012Validator(schema).is_valid
    for n in range(10**16 - 2, 10**16 + 8):
        assert accepts(schema, str(n)) == valid(n), n
    assert constraint_of(schema).narrowings == ()


@pytest.mark.parametrize("pattern", [r"\s?", "x*", "[ \t\n\r\x0b]", r"[^a]?"])
def test_whitespace_pattern_must_be_json_whitespace(pattern: str) -> None:
    with pytest.raises(OptionError, match="not JSON whitespace .*; use a pattern of JSON whitespace"):
        constraint_of({"type": "array", "items": {"type": "integer"}}, whitespace_pattern=pattern)


def test_json_whitespace_patterns_are_kept() -> None:
    for pattern in ("", " ?", "[ \t\n\r]*", "(\n  )?"):
        assert constraint_of({"type": "integer"}, whitespace_pattern=pattern)


@pytest.mark.parametrize(("schema", "keyword", "pointer", "near"), [
    ({"type": "strin"}, "type", "/", '"string"'),
    ({"type": "array", "items": {"type": "objet"}}, "type", "/items", '"object"'),
    ({"type": ["strin", "null"]}, "type", "/", '"string" for "strin"'),
])
def test_an_invalid_schema_is_called_invalid_with_a_suggestion(schema: dict, keyword: str, pointer: str,
                                                               near: str) -> None:
    with pytest.raises(InvalidSchemaError) as err:
        constraint_of(schema)
    assert (err.value.keyword, err.value.pointer) == (keyword, pointer)
    assert str(err.value).startswith(f"invalid JSON Schema: keyword {keyword!r} at {pointer}: ")
    assert str(err.value).endswith(f"did you mean {near}?")
    assert "unsupported" not in str(err.value)


def test_formats_and_strings_list_their_narrowings() -> None:
    narrowings = constraint_of({"type": "object", "properties": {
        "when": {"type": "string", "format": "date-time"}, "mail": {"type": "string", "format": "email"},
        "name": {"type": "string"}}, "required": ["when", "mail", "name"], "additionalProperties": False}).narrowings
    assert any(n.startswith("/properties/when: format 'date-time' is written as structspec's grammar") for n in
               narrowings)
    assert any(n.startswith("/properties/mail: format 'email' is written as structspec's grammar") for n in narrowings)
    # said once, where a string of outlines-core's form first shows
    assert sum("strings hold no characters U+0000-U+001F" in n and "U+007F-U+009F" in n for n in narrowings) == 1
