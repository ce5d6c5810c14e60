"""transformers conventions in structspec's own API: ``generation_config=`` and the one list of options."""

from __future__ import annotations

import re
from typing import Any

import pytest
from transformers import GenerationConfig

import structspec
from structspec import CompileOptions, GenerateOptions, OptionError

SPEC = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
        "required": ["name", "n"]}
PROMPT = 'name "ab"'


def run(lm: structspec.LM, **options: Any) -> structspec.Result:
    return structspec.generate_result(lm, SPEC, PROMPT, **options)


def test_honoured_fields_become_options() -> None:
    config = GenerationConfig(max_new_tokens=7, do_sample=True, temperature=0.7, top_k=5, top_p=0.9, eos_token_id=2)
    options = GenerateOptions.of({}, config)
    assert (options.max_new_tokens, options.do_sample, options.temperature, options.top_k, options.top_p) == (
        7, True, 0.7, 5, 0.9)
    assert options.decode_options().sampling.do_sample
    assert CompileOptions.of({}, config).eos_token_id == 2  # the end tokens are the FSM's: a compile option
    assert CompileOptions.of({"eos_token_id": 0}, config).eos_token_id == 0


def test_keywords_win_over_the_config() -> None:
    config = GenerationConfig(max_new_tokens=7, do_sample=True, temperature=0.7)
    options = GenerateOptions.of({"max_new_tokens": 40, "temperature": 0.5}, config)
    assert (options.max_new_tokens, options.temperature, options.do_sample) == (40, 0.5, True)
    assert not GenerateOptions.of({"do_sample": False}, config).decode_options().sampling.do_sample


def test_sampling_needs_do_sample_in_a_config() -> None:
    """transformers' rule for the config (temperature alone stays greedy); structspec's for keywords."""
    config = GenerationConfig(temperature=0.7, top_p=0.9)
    assert not GenerateOptions.of({}, config).decode_options().sampling.do_sample
    keyword = GenerateOptions.of({"temperature": 0.7}, GenerationConfig(max_new_tokens=9))
    assert keyword.decode_options().sampling.do_sample
    assert GenerateOptions.of({"temperature": 0.7}).decode_options().sampling.do_sample
    greedy = GenerateOptions.of({}, GenerationConfig(do_sample=False, temperature=0.0))  # values greedy ignores
    assert greedy.decode_options() == GenerateOptions().decode_options()


def test_the_repetition_controls_are_read_greedy_or_sampled() -> None:
    """transformers applies them in greedy decoding too: the config's are kept where its sampling values are not."""
    for do_sample in (False, True):
        config = GenerationConfig(do_sample=do_sample, repetition_penalty=1.2, no_repeat_ngram_size=3)
        repetition = GenerateOptions.of({}, config).decode_options().repetition
        assert (repetition.repetition_penalty, repetition.no_repeat_ngram_size) == (1.2, 3)
    keywords = GenerateOptions.of({"repetition_penalty": 1.5}, GenerationConfig(repetition_penalty=1.2))
    assert keywords.decode_options().repetition.repetition_penalty == 1.5


def test_a_config_with_repetition_controls_decodes_as_its_keywords(byte_lm: structspec.LM) -> None:
    config = GenerationConfig(max_new_tokens=20, repetition_penalty=2.5, no_repeat_ngram_size=2)
    by_config = run(byte_lm, generation_config=config)
    assert by_config.token_ids == run(byte_lm, max_new_tokens=20, repetition_penalty=2.5,
                                      no_repeat_ngram_size=2).token_ids
    assert by_config.token_ids != run(byte_lm, max_new_tokens=20).token_ids  # the controls were applied


@pytest.mark.slow
def test_config_decodes_as_its_keywords(byte_lm: structspec.LM) -> None:
    config = GenerationConfig(max_new_tokens=12, do_sample=True, temperature=0.8, top_k=20)
    by_config = run(byte_lm, generation_config=config, seed=1)
    by_keywords = run(byte_lm, max_new_tokens=12, temperature=0.8, top_k=20, seed=1)
    assert by_config.token_ids == by_keywords.token_ids and by_config.stop_reason == by_keywords.stop_reason
    short = run(byte_lm, generation_config=GenerationConfig(max_new_tokens=4))
    assert short.stop_reason == "max_new_tokens" and len(short.token_ids) == 4
    with pytest.raises(structspec.TokenBudgetExceeded, match="max_new_tokens=4"):
        structspec.generate(byte_lm, SPEC, PROMPT, generation_config=GenerationConfig(max_new_tokens=4))


@pytest.mark.parametrize(("field", "value"), [
    ("num_beams", 2), ("encoder_repetition_penalty", 1.1), ("encoder_no_repeat_ngram_size", 3),
    ("num_return_sequences", 2),
    ("max_length", 30), ("min_new_tokens", 5), ("penalty_alpha", 0.6), ("stop_strings", ["}"]),
])
def test_unsupported_fields_are_named(field: str, value: Any) -> None:
    config = GenerationConfig(do_sample=True, **{field: value})  # transformers wants sampling for some of them
    with pytest.raises(OptionError, match=re.escape(f"generation_config.{field}={value!r}")):
        GenerateOptions.of({}, config)


def test_neutral_values_of_unsupported_fields_pass() -> None:
    config = GenerationConfig(num_beams=1, repetition_penalty=1.0, num_return_sequences=1, use_cache=True,
                              pad_token_id=0, bos_token_id=1, output_scores=False)
    assert GenerateOptions.of({}, config).decode_options() == GenerateOptions().decode_options()


@pytest.mark.slow
def test_eos_token_id_must_name_special_tokens(byte_lm: structspec.LM) -> None:
    eos = byte_lm.vocab.eos_token_id
    plain = run(byte_lm, max_new_tokens=30)
    for value in (eos, [eos]):
        assert run(byte_lm, max_new_tokens=30, generation_config=GenerationConfig(eos_token_id=value)).token_ids == (
            plain.token_ids)
    for value in ([eos, eos + 5], eos + 5):  # id 5 is a text token (tests/decoding/test_eos.py: lists of special tokens)
        with pytest.raises(OptionError, match=rf"eos_token_id {eos + 5} is the text token .*tokenizer's EOS \(id {eos}\)"):
            run(byte_lm, generation_config=GenerationConfig(eos_token_id=value))


@pytest.mark.slow
def test_models_own_config_adds_no_sampling(byte_lm: structspec.LM, monkeypatch: pytest.MonkeyPatch) -> None:
    greedy = run(byte_lm, max_new_tokens=30)
    own = byte_lm.model.generation_config
    monkeypatch.setattr(own, "do_sample", True)
    monkeypatch.setattr(own, "temperature", 0.5)
    assert run(byte_lm, max_new_tokens=30).token_ids == greedy.token_ids  # the model's config is never read
    monkeypatch.undo()
    assert run(byte_lm, max_new_tokens=30, generation_config=own).token_ids == greedy.token_ids  # bos/eos/pad only


def test_batches_take_the_config(byte_lm: structspec.LM) -> None:
    results = structspec.generate_batch(byte_lm, SPEC, [PROMPT, "x"], batch_size=2,
                                        generation_config=GenerationConfig(max_new_tokens=3))
    assert [(r.stop_reason, len(r.token_ids)) for r in results] == [("max_new_tokens", 3)] * 2
    with pytest.raises(OptionError, match="generation_config.num_beams=4"):
        structspec.generate_batch(byte_lm, SPEC, [PROMPT], generation_config=GenerationConfig(num_beams=4))
    with pytest.raises(OptionError, match="output_logprobs"):
        structspec.generate_batch(byte_lm, SPEC, [PROMPT], output_logprobs=True)


def test_unknown_option_is_named(byte_lm: structspec.LM) -> None:
    with pytest.raises(OptionError, match="unknown option 'max_tokens'"):
        run(byte_lm, max_tokens=5)
    with pytest.raises(OptionError, match="unknown option 'streamer'"):
        structspec.generate_batch(byte_lm, SPEC, [PROMPT], streamer=object())


def test_a_compiled_spec_takes_a_config_with_its_own_end_tokens_only(byte_lm: structspec.LM) -> None:
    person = structspec.compile(SPEC, byte_lm)
    eos = byte_lm.vocab.eos_token_id
    short = person.result(PROMPT, generation_config=GenerationConfig(max_new_tokens=4, eos_token_id=eos))
    assert short.stop_reason == "max_new_tokens" and len(short.token_ids) == 4
    with pytest.raises(OptionError, match=r"generation_config.eos_token_id=\[0, 5\] is a compile option.*"
                                          r"structspec.compile\(spec, lm, eos_token_id=\[0, 5\]\)"):
        person(PROMPT, generation_config=GenerationConfig(eos_token_id=[0, 5]))


def test_a_dict_of_fields_is_read_as_the_config_they_make(byte_lm: structspec.LM) -> None:
    fields = {"max_new_tokens": 3, "do_sample": True, "temperature": 0.8, "top_k": 20}
    assert GenerateOptions.of({}, fields) == GenerateOptions.of({}, GenerationConfig(**fields))
    by_dict = run(byte_lm, generation_config=fields, seed=1)
    by_config = run(byte_lm, generation_config=GenerationConfig(**fields), seed=1)
    assert by_dict.token_ids == by_config.token_ids and by_dict.stop_reason == "max_new_tokens"
    compiled = structspec.compile(SPEC, byte_lm)
    assert compiled.result(PROMPT, generation_config={"max_new_tokens": 2}).stop_reason == "max_new_tokens"
    with pytest.raises(OptionError, match=re.escape("generation_config.num_beams=2 is not supported")):
        run(byte_lm, generation_config={"num_beams": 2})


@pytest.mark.parametrize("config", ["greedy", 3, ["max_new_tokens"], object()])
def test_a_config_of_another_type_is_refused_before_the_model_loads(config: object) -> None:
    with pytest.raises(OptionError, match=rf"^generation_config got a {type(config).__name__}: pass a transformers "
                                          "GenerationConfig, a dict of its fields"):
        structspec.generate_result("no-such-model", SPEC, PROMPT, generation_config=config)


def test_a_dict_key_that_is_no_field_name_is_refused() -> None:
    with pytest.raises(OptionError, match=r"^generation_config has the key 1: name its fields by str"):
        GenerateOptions.of({}, {1: 2})
