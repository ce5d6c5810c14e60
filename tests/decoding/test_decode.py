"""The decode loop on tiny random-weight models: pass accounting, stops, sampling, budgets, bad input."""

from __future__ import annotations

import re
from typing import Literal

import pytest
import torch
from pydantic import BaseModel

import structspec
from structspec import PromptError, Regex, RegexError, TokenBudgetExceeded, VocabularyMismatchError
from structspec.automaton import fsm as fsm_module
from structspec.automaton.fsm import TokenFSM
from structspec.cache import cache_dir
from structspec.testing import CountingLM, byte_level_tokenizer, tiny_llama


class Pet(BaseModel):
    kind: Literal["cat", "dog", "parrot"]
    legs: int
    ok: bool


def test_passes_are_counted_exactly(byte_lm) -> None:
    counting = CountingLM(byte_lm)
    result = structspec.generate_result(counting, Regex(r"[a-z]{1,6}"), "hello", max_new_tokens=20, draft=None)
    stats = result.stats
    assert re.fullmatch(r"[a-z]{1,6}", result.text)
    assert stats.target_forward_passes == counting.passes
    assert stats.tokens_fed == counting.fed
    assert stats.tokens_fed[0] == stats.prompt_tokens
    assert all(n == 1 for n in stats.tokens_fed[1:])
    # one pass per output token, plus the pass that chose EOS
    extra = 1 if result.stop_reason == "eos" else 0
    assert stats.target_forward_passes == stats.output_tokens + extra


def test_complete_fsm_stops_without_asking_the_model(byte_lm) -> None:
    result = structspec.generate_result(byte_lm, Regex(r"[0-9]{3}"), "digits:", max_new_tokens=20)
    assert re.fullmatch(r"[0-9]{3}", result.text)
    assert result.stop_reason == "fsm_complete"
    assert result.stats.target_forward_passes == result.stats.output_tokens


def test_pydantic_value_is_validated(byte_lm) -> None:
    pet = structspec.generate(byte_lm, Pet, "A pet:", max_new_tokens=60)
    assert isinstance(pet, Pet)


@pytest.mark.slow
def test_sampling_is_reproducible_with_a_seed(byte_lm) -> None:
    spec = Regex(r"[a-z]{3,12}")
    runs = [structspec.generate(byte_lm, spec, "x", temperature=1.5, seed=s, max_new_tokens=20) for s in (1, 1, 2, 3, 4)]
    assert runs[0] == runs[1]
    assert len(set(runs)) > 1  # different seeds explore
    greedy = structspec.generate(byte_lm, spec, "x", max_new_tokens=20)
    assert greedy == structspec.generate(byte_lm, spec, "x", do_sample=False, temperature=1.5, max_new_tokens=20)


def test_top_k_one_is_greedy(byte_lm) -> None:
    spec = Regex(r"[a-z]{3,12}")
    greedy = structspec.generate(byte_lm, spec, "x", max_new_tokens=20)
    assert structspec.generate(byte_lm, spec, "x", do_sample=True, top_k=1, seed=7, max_new_tokens=20) == greedy


def test_token_budget_raises_with_the_partial_output(byte_lm) -> None:
    with pytest.raises(TokenBudgetExceeded) as err:
        structspec.generate(byte_lm, Regex(r"[a-z]{30}"), "x", max_new_tokens=5)
    assert err.value.max_new_tokens == 5
    assert len(err.value.token_ids) == 5
    assert re.fullmatch(r"[a-z]+", err.value.text) and len(err.value.text) < 30
    assert "max_new_tokens=5" in str(err.value)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda lm: structspec.generate(lm, Pet, ""), PromptError, "empty"),
        (lambda lm: structspec.generate(lm, Pet, []), PromptError, "empty list of messages"),
        (lambda lm: structspec.generate(lm, Pet, "x", max_new_tokens=0), structspec.OptionError, "max_new_tokens"),
        (lambda lm: structspec.generate(lm, Regex("(ab"), "x"), RegexError, "position"),
        (lambda lm: structspec.generate(lm, Pet, "x", temperature=0.0), structspec.OptionError, "do_sample=False"),
        (lambda lm: structspec.generate(lm, Pet, "x", top_p=1.5), structspec.OptionError, "top_p"),
        (lambda lm: structspec.generate(lm, Pet, "x", top_k=0), structspec.OptionError, "top_k"),
        (lambda lm: structspec.generate(lm, 3.5, "x"), structspec.SpecError, "unsupported output spec"),
    ],
)
def test_bad_input_gets_a_specific_error(byte_lm, call, error, message) -> None:
    with pytest.raises(error, match=message) as err:
        call(byte_lm)
    assert isinstance(err.value, structspec.StructspecError)


def test_vocab_mismatch_is_refused() -> None:
    tok = byte_level_tokenizer()
    model = tiny_llama(tok)
    model.resize_token_embeddings(len(tok) - 10)
    with pytest.raises(VocabularyMismatchError, match="do not belong together"):
        structspec.from_transformers(model, tok)


def test_unknown_model_name() -> None:
    with pytest.raises(structspec.ModelNotFoundError, match="smollm2-135m"):
        structspec.load("no-such-model")


def test_compiled_fsm_is_cached_in_memory_and_on_disk(byte_lm, monkeypatch) -> None:
    monkeypatch.setattr(fsm_module, "DISK_MIN_SECONDS", 0.0)  # this one builds in well under a millisecond
    spec = Regex(r"cache-test-[0-9]{2}")
    first = structspec.compile(spec, byte_lm).fsm
    assert first.info.source == "compiled"
    assert structspec.compile(spec, byte_lm).fsm.info.source == "memory"
    structspec.clear_cache()
    again = structspec.compile(spec, byte_lm).fsm
    assert again.info.source == "disk"
    state = again.initial_state
    assert again.allowed_token_ids(state).tolist() == first.allowed_token_ids(first.initial_state).tolist()
    structspec.clear_cache(disk=True)
    assert structspec.compile(spec, byte_lm).fsm.info.source == "compiled"


def test_an_automaton_quicker_to_build_than_to_store_stays_off_disk(byte_lm, monkeypatch) -> None:
    monkeypatch.setattr(fsm_module, "DISK_MIN_SECONDS", 60.0)
    spec = Regex(r"quick-test-[0-9]{2}")
    structspec.clear_cache(disk=True)
    assert structspec.compile(spec, byte_lm).fsm.info.source == "compiled"
    assert not list(cache_dir("fsm").glob("*.dfa"))
    structspec.clear_cache()
    assert structspec.compile(spec, byte_lm).fsm.info.source == "compiled"  # built again, not read


def test_masks_disallow_every_token_outside_the_language(byte_lm) -> None:
    fsm = structspec.compile(Regex(r"(yes|no)"), byte_lm).fsm
    state = fsm.initial_state
    logits = torch.zeros(1, byte_lm.logits_width)
    fsm.mask_logits_inplace(logits, [state])
    allowed = torch.isfinite(logits[0]).nonzero().flatten().tolist()
    assert allowed == fsm.allowed_token_ids(state).tolist()
    assert all(byte_lm.vocab.token_bytes[t] in (b"y", b"ye", b"yes", b"n", b"no") for t in allowed)
    assert not torch.isfinite(logits[0, len(byte_lm.vocab):]).any()  # padded logits never allowed


def test_walk_returns_the_states_visited(byte_lm) -> None:
    fsm: TokenFSM = structspec.compile(Regex(r"ab+c"), byte_lm).fsm
    ids = byte_lm.tokenizer.encode("abbc", add_special_tokens=False)
    states = fsm.walk(fsm.initial_state, ids)
    assert len(states) == len(ids) and fsm.is_final(states[-1])
    bad = byte_lm.tokenizer.encode("abx", add_special_tokens=False)
    assert len(fsm.walk(fsm.initial_state, bad)) < len(bad)


@pytest.mark.real_model
def test_chat_prompt_uses_the_template(smollm2) -> None:
    ids = smollm2.encode_prompt([{"role": "user", "content": "hi"}])
    assert smollm2.tokenizer.decode(ids).startswith("<|im_start|>system")


def test_strict_false_drops_unenforceable_keywords_with_a_warning(byte_lm) -> None:
    # unique free strings cannot be a regular language (unique enum options can: tests/schema/test_reach.py)
    schema = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
              "additionalProperties": False}
    with pytest.raises(structspec.SchemaError, match="uniqueItems"):
        structspec.compile(schema, byte_lm)
    with pytest.warns(UserWarning, match="uniqueItems"):
        result = structspec.generate_result(byte_lm, schema, "tags:", strict=False, max_new_tokens=60)
    assert isinstance(result.value, dict)


def test_top_level_regex_keeps_longer_alternatives(byte_lm) -> None:
    fsm = structspec.compile(Regex("(a|ab)"), byte_lm).fsm
    ids = [byte_lm.tokenizer.convert_tokens_to_ids(c) for c in "ab"]
    assert len(fsm.walk(fsm.initial_state, ids)) == 2


def test_digit_bounds_are_options_and_listed_as_narrowings(byte_lm) -> None:
    schema = {"type": "object", "properties": {"x": {"type": "number"}, "n": {"type": "integer"}}, "required": ["x"]}
    compiled = structspec.compile(schema, byte_lm)
    assert any("/properties/x" in n and "max_integer_digits" in n for n in compiled.narrowings)
    closed = schema | {"additionalProperties": False}  # no unlisted members: nothing else to narrow
    assert structspec.compile(closed, byte_lm, max_integer_digits=None, max_fraction_digits=None).narrowings == ()
    for seed in range(4):
        text = structspec.generate_result(byte_lm, {"type": "integer"}, "n=", max_integer_digits=3, seed=seed,
                                          temperature=1.5).text
        assert re.fullmatch(r"-?[0-9]{1,3}", text), text
