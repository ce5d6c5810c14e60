"""The grammar catalogue: every grammar accepts its valid examples and rejects its invalid ones."""

from __future__ import annotations

import re

import pytest

import structspec
from structspec import Regex, SpecError, grammars

REQUIRED = ["date", "time", "date-time", "duration", "email", "hostname", "ipv4", "ipv6", "uri", "uuid",
            "e164-phone", "semver", "iso-4217-currency", "iso-3166-alpha2", "hex-color", "integer", "decimal"]
CATALOGUE = grammars.catalogue()


def test_the_catalogue_has_every_required_grammar() -> None:
    assert set(REQUIRED) <= set(grammars.names())


def test_python_names_and_catalogue_names_give_the_same_regex() -> None:
    assert structspec.grammars.e164_phone == grammars.get("e164-phone") == grammars.get("e164_phone")
    assert isinstance(structspec.grammars.email, Regex)
    with pytest.raises(SpecError, match="e164-phone"):
        grammars.get("phone")
    with pytest.raises(AttributeError, match="e164_phone"):
        structspec.grammars.phone  # noqa: B018


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_examples_through_the_regex(name: str) -> None:
    grammar = CATALOGUE[name]
    assert grammar.valid and grammar.invalid
    for text in grammar.valid:
        assert re.fullmatch(grammar.pattern, text), text
    for text in grammar.invalid:
        assert not re.fullmatch(grammar.pattern, text), text


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_examples_through_the_token_fsm(byte_lm: structspec.LM, name: str) -> None:
    fsm = structspec.compile(Regex(CATALOGUE[name].pattern), byte_lm).fsm
    for text in CATALOGUE[name].valid + CATALOGUE[name].invalid:
        ids = byte_lm.tokenizer.encode(text, add_special_tokens=False)
        states = fsm.walk(fsm.initial_state, ids)
        accepted = len(states) == len(ids) and fsm.is_final(states[-1])
        assert accepted == (text in CATALOGUE[name].valid), text


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_generated_text_matches(byte_lm: structspec.LM, name: str) -> None:
    fsm = structspec.compile(grammars.get(name), byte_lm).fsm
    for seed, options in enumerate([{}, {"temperature": 1.3}]):
        result = structspec.generate_result(byte_lm, grammars.get(name), "Value:", max_new_tokens=64,
                                            seed=seed, **options)
        if result.complete:
            assert re.fullmatch(CATALOGUE[name].pattern, result.text), result.text
            continue
        # the budget ran out: what was generated is still a prefix of the language, token by token
        assert result.stop_reason == "max_new_tokens" and len(result.token_ids) == 64
        assert len(fsm.walk(fsm.initial_state, result.token_ids)) == 64, result.text
