"""`not_opening`: free text that holds none of some words and opens, past skipped characters, with none of some
openings — checked against the definition on every short text over the words' and openings' characters, and on
longer ones drawn at random."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.schema.test_fuzz import FUZZ

from structspec.schema.stops import not_opening

CASES = [
    (("<tool_call>",), ("{", "```json\n{", "```\n{")),  # `ToolCalls`' auto text with bare calls
    (("``x", "ab"), ("{", "``a{", "b")),  # words that start inside an opening, and an opening a word ends
    ((), ("{", "`j")),
    (("{{",), ("{",)),
]


def expected(text: str, words: tuple[str, ...], openings: tuple[str, ...]) -> bool:
    return not any(w in text for w in words) and not any(text.lstrip(" \n").startswith(o) for o in openings)


def alphabet(words: tuple[str, ...], openings: tuple[str, ...]) -> list[str]:
    return sorted(set("".join(words + openings)) | set(" \nz"))


@pytest.mark.parametrize("words, openings", CASES)
def test_not_opening_on_every_short_text(words, openings) -> None:
    regex = re.compile(not_opening(words, openings, " \n"))
    for n in range(5):
        for text in map("".join, itertools.product(alphabet(words, openings), repeat=n)):
            assert bool(regex.fullmatch(text)) == expected(text, words, openings), text


@pytest.mark.parametrize("words, openings", CASES)
@settings(FUZZ, max_examples=100)
@given(data=st.data())
def test_not_opening_on_longer_texts(words, openings, data) -> None:
    regex = re.compile(not_opening(words, openings, " \n"))
    text = data.draw(st.text(st.sampled_from(alphabet(words, openings)), min_size=5, max_size=14))
    assert bool(regex.fullmatch(text)) == expected(text, words, openings), text
