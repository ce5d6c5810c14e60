"""Regexes structspec cannot read as written are refused before any model runs, each with the fix: POSIX classes
(which Python's re silently reads as another set), inline flags, Unicode property escapes, backreferences."""

from __future__ import annotations

import warnings

import pytest

from structspec.automaton.nfa import ByteNFA
from structspec.errors import RegexError, SchemaError
from structspec.schema import constraint_of


@pytest.mark.parametrize(("regex", "fix"), [
    ("[[:alpha:]]+", "[A-Za-z]"),
    ("x[^[:digit:]]", "[0-9]"),
    ("[[:alnum:]_]+", "[A-Za-z0-9]"),
    ("(?i)abc", "[Hh][Ii]"),
    ("a(?i)b", "[Hh][Ii]"),
    ("(?i:ab)c", "[Hh][Ii]"),
    (r"\p{L}+", "[A-Za-zÀ-ÿ]"),
    (r"(a)\1", "spell the repeated text out"),
])
def test_a_regex_structspec_cannot_read_is_refused_with_the_fix(regex: str, fix: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # (Python warns of a nested set in [[:alpha:]])
        with pytest.raises(RegexError) as e:
            ByteNFA(regex)
    assert fix in e.value.reason, e.value.reason


@pytest.mark.parametrize("regex", [r"\[[:alpha:]]", "[:alpha:]", r"[\[:x]", "(?:ab)", "(?P<n>a)b", r"\(?i:"])
def test_regexes_that_only_look_like_those_are_read(regex: str) -> None:
    ByteNFA(regex)


@pytest.mark.parametrize(("pattern", "says"), [
    (r"^(a)\1$", "backreferences"),
    (r"^(?P<x>a)(?P=x)$", "backreferences"),
    ("^[[:alpha:]]+$", "POSIX classes"),
    ("(?i)ab", "[Hh][Ii]"),
])
def test_a_schema_pattern_structspec_cannot_read_says_why(pattern: str, says: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with pytest.raises(SchemaError) as e:
            constraint_of({"type": "string", "pattern": pattern})
    assert says in e.value.reason and "quote, backslash" not in e.value.reason, e.value.reason

