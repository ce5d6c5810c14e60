"""Every option and every engine entry point checked by type and range: a bad value is an `OptionError`
(`PromptError`, `SpecError`) naming it and ending in the fix, raised before any model loads or runs, never a
TypeError, IndexError or RuntimeError from deeper down."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from pydantic import BaseModel

import structspec
from structspec import CompileOptions, GenerateOptions, OptionError, PromptError, Regex, SpecError
from structspec.automaton.fsm import apply_token_bitmask_inplace, check_eos_token_ids
from structspec.checks import MAX_TEMPERATURE
from structspec.decoding.sampling import SamplingConfig
from structspec.integrations.matcher import Matcher

SPEC = Regex(r"[ab]{1,3}")
MISSING = "no-such-model"  # loading it raises ModelNotFoundError: an OptionError first shows no model was loaded


class Person(BaseModel):
    name: str


BAD = [
    ("max_new_tokens", 1.5), ("max_new_tokens", None), ("max_new_tokens", "10"), ("max_new_tokens", math.nan),
    ("max_new_tokens", True), ("max_new_tokens", 0), ("temperature", math.nan), ("temperature", math.inf),
    ("temperature", "1"), ("temperature", 1e-300), ("temperature", 0.0), ("top_p", math.nan), ("top_p", 1.5),
    ("top_k", 2.0), ("top_k", True), ("top_k", 0), ("seed", 2**70), ("seed", 1.5), ("seed", True),
    ("eos_token_id", [None]), ("eos_token_id", True), ("eos_token_id", "2"), ("eos_token_id", []),
    ("do_sample", "yes"), ("strict", "no"), ("output_logprobs", 1), ("whitespace_pattern", None),
    ("max_recursion_depth", 2.0), ("open_objects", 0), ("repetition_penalty", 0), ("repetition_penalty", -1.2),
    ("repetition_penalty", math.inf), ("repetition_penalty", True), ("no_repeat_ngram_size", -1),
    ("no_repeat_ngram_size", 2.0), ("no_repeat_ngram_size", None),
]


@pytest.mark.parametrize(("name", "value"), BAD)
def test_a_bad_option_is_an_option_error_naming_it_before_the_model_loads(name: str, value: object) -> None:
    options = CompileOptions if name in CompileOptions.__dataclass_fields__ else GenerateOptions
    with pytest.raises(OptionError, match=rf"^{name} must be .*: got .*; (pass|use) .+") as made:
        options(**{name: value})
    assert repr(value)[:20] in str(made.value)
    with pytest.raises(OptionError, match=rf"^{name} must be"):  # not ModelNotFoundError: checked first
        structspec.generate_result(MISSING, SPEC, "hi", **{name: value})


def test_sampling_values_that_crashed_the_sampler_are_refused(byte_lm: structspec.LM) -> None:
    # nan / inf reached torch.multinomial ("probability tensor contains either inf, nan"); tiny temperatures too
    for temperature in (math.nan, math.inf, 1e-300):
        with pytest.raises(OptionError, match="or do_sample=False for greedy$"):
            structspec.generate_result(byte_lm, SPEC, "hi", temperature=temperature, seed=0, max_new_tokens=3)


def test_good_values_of_other_integer_and_number_types_are_taken_as_python_values() -> None:
    options = GenerateOptions(max_new_tokens=np.int64(7), temperature=1, top_p=np.float32(0.5), top_k=np.int32(3),
                              seed=-(2**63))
    assert (options.max_new_tokens, options.top_k, options.seed) == (7, 3, -(2**63))
    assert type(options.max_new_tokens) is int and type(options.temperature) is float and options.top_p == 0.5
    assert CompileOptions(eos_token_id=(5, 6)).eos_token_id == [5, 6]
    assert GenerateOptions(temperature=1e-5, top_p=1).decode_options().sampling.do_sample


def test_generation_config_values_are_checked_like_keywords() -> None:
    class Config:
        def to_diff_dict(self) -> dict[str, object]:
            return {"max_new_tokens": 2.5}

    with pytest.raises(OptionError, match="^max_new_tokens must be ≥ 1"):
        GenerateOptions.of({}, Config())


def test_a_misspelled_drafter_is_refused_with_the_nearest_name_before_the_model_loads() -> None:
    with pytest.raises(OptionError, match="did you mean 'lookahead'"):
        structspec.generate_result(MISSING, SPEC, "hi", draft="lookhead")


def test_batch_size_must_be_a_whole_number(byte_lm: structspec.LM) -> None:
    for size in (1.5, None, True, 0):
        with pytest.raises(OptionError, match="^batch_size must be ≥ 1 .*; pass a whole number of rows"):
            structspec.generate_batch(byte_lm, SPEC, ["hi"], batch_size=size)


@pytest.mark.parametrize("bad", [None, 5, [{"role": "user", "content": 5}]])
def test_one_bad_prompt_in_a_batch_is_that_rows_error(byte_lm: structspec.LM, bad: object) -> None:
    results = structspec.generate_batch(byte_lm, SPEC, ["hi", bad, "ho"], max_new_tokens=4)
    assert [r.stop_reason for r in results].count("error") == 1 and results[1].stop_reason == "error"
    assert isinstance(results[1].error, PromptError) and str(results[1].error).startswith("row 1: ")
    assert results[0].text and results[2].text


@pytest.mark.parametrize(("prompt", "message"), [
    (None, "of type NoneType: pass a str or a list"),
    (7, "of type int: pass a str"),
    ({"role": "user", "content": "hi"}, "one message \\(a dict\\): wrap it in a list"),
    ([], "empty list of messages: pass at least one"),
    (["hi"], "message 0 of the prompt is of type str, not a dict"),
    ([{"role": "user"}], "message 0 of the prompt: its 'content' is missing; give each message a str 'content'"),
    ([{"content": "hi"}], "its 'role' is missing; give each message a str 'role'"),
    ([{"role": "user", "content": None}], "its 'content' is of type NoneType"),
    ([{"role": "user", "content": "a"}, {"role": 3, "content": "b"}], "message 1 of the prompt: its 'role' is of type int"),
])
def test_chat_message_shapes_are_prompt_errors_before_the_model_loads(prompt: object, message: str) -> None:
    with pytest.raises(PromptError, match=message):
        structspec.generate_result(MISSING, SPEC, prompt)


@pytest.mark.parametrize("spec", [Person, {"type": "string"}, Regex("[ab]+"), int, list[int]])
def test_swapped_spec_and_prompt_are_named_with_the_right_order(spec: object) -> None:
    # outlines' order, generator(prompt) / generate(model, prompt, spec): spotted before the model loads
    for call in (structspec.generate, structspec.generate_result, structspec.stream):
        with pytest.raises(SpecError, match=r"look swapped .*call structspec.generate\(model, spec, prompt\)"):
            call(MISSING, "Alice is 31.", spec)
    with pytest.raises(SpecError, match="look swapped"):
        structspec.generate_batch(MISSING, ["Alice is 31.", "Bob is 45."], spec)


def test_a_json_schema_string_with_a_message_list_is_not_taken_for_swapped(byte_lm: structspec.LM) -> None:
    result = structspec.generate_result(byte_lm, '{"type": "boolean"}', [{"role": "user", "content": "hi"}],
                                        max_new_tokens=8)
    assert result.stop_reason in ("eos", "fsm_complete", "max_new_tokens")


@pytest.fixture
def matcher(byte_lm: structspec.LM) -> Matcher:
    return Matcher(structspec.compile(SPEC, byte_lm))


def _ab(lm: structspec.LM, text: str) -> list[int]:
    return [lm.vocab.single_byte_tokens[b] for b in text.encode()]


def test_rollback_takes_a_whole_number_up_to_what_was_accepted(matcher: Matcher, byte_lm: structspec.LM) -> None:
    assert matcher.accept_tokens(_ab(byte_lm, "ab"))
    state = matcher.state
    for bad in (1.5, -1, 3, True, "1"):
        with pytest.raises(OptionError, match=rf"cannot roll back {bad!r} tokens: 2 were accepted .*; pass an int "
                                              "from 0 to 2$".replace("(", "\\(")):
            matcher.rollback(bad)  # type: ignore[arg-type]
        assert matcher.state == state
    matcher.rollback(np.int64(2))  # type: ignore[arg-type]
    assert matcher.state == matcher.fsm.initial_state


@pytest.mark.parametrize("bad", [1.5, True, -1, 10**9, "a", None])
def test_a_token_id_that_is_not_an_id_is_refused_by_accept_and_validate(matcher: Matcher, byte_lm: structspec.LM,
                                                                       bad: object) -> None:
    ok = _ab(byte_lm, "a")
    for call in (matcher.accept_tokens, matcher.validate_tokens):
        with pytest.raises(OptionError, match=rf"token id {bad!r} is not an int in \[0, {byte_lm.logits_width}\)"):
            call(ok + [bad])  # type: ignore[list-item]
    assert matcher.state == matcher.fsm.initial_state and matcher.validate_tokens(iter(ok)) == 1
    with pytest.raises(OptionError, match="must be a list of token ids, got str: pass \\[token_id\\]"):
        matcher.accept_tokens("ab")  # type: ignore[arg-type]


def test_a_padding_id_below_the_logits_width_is_rejected_not_refused(byte_lm: structspec.LM) -> None:
    matcher = Matcher(SPEC, byte_lm.tokenizer, logits_width=len(byte_lm.vocab) + 32)
    assert matcher.validate_tokens([len(byte_lm.vocab) + 1]) == 0 and not matcher.accept_tokens([len(byte_lm.vocab)])


@pytest.mark.parametrize(("bitmask", "row", "message"), [
    (lambda m: m.fsm.allocate_token_bitmask(2), 2, r"row 2 is not a row of this bitmask \(2 rows\): pass an int from 0 to 1"),
    (lambda m: m.fsm.allocate_token_bitmask(2), -1, "row -1 is not a row"),
    (lambda m: m.fsm.allocate_token_bitmask(2), 1.0, "row 1.0 is not a row"),
    (lambda m: m.fsm.allocate_token_bitmask(2)[0], 0, r"1-D torch.int32 tensor, not a 2-D .*bitmask.unsqueeze\(0\)"),
    (lambda m: m.fsm.allocate_token_bitmask(2).float(), 0, "2-D torch.float32 tensor, not a 2-D"),
    (lambda m: m.fsm.allocate_token_bitmask(2).long(), 0, "torch.int64 tensor"),
    (lambda m: [[0] * 16], 0, "of type list, not a torch tensor: allocate it with matcher.fsm.allocate_token_bitmask"),
])
def test_fill_refuses_a_bitmask_or_row_it_cannot_write(matcher: Matcher, bitmask, row, message: str) -> None:
    for fill in (lambda b: matcher.fill_next_token_bitmask(b, row),
                 lambda b: matcher.fsm.fill_next_token_bitmask(b, row, matcher.fsm.initial_state)):
        with pytest.raises(OptionError, match=message):
            fill(bitmask(matcher))


def test_fill_refuses_a_row_once_terminated_too(matcher: Matcher, byte_lm: structspec.LM) -> None:
    assert matcher.accept_tokens(_ab(byte_lm, "a") + [byte_lm.vocab.eos_token_id]) and matcher.is_terminated()
    with pytest.raises(OptionError, match="row 5 is not a row"):
        matcher.fill_next_token_bitmask(matcher.fsm.allocate_token_bitmask(2), 5)


def test_the_fsm_bitmask_functions_check_their_arguments(matcher: Matcher, byte_lm: structspec.LM) -> None:
    fsm = matcher.fsm
    for rows in (-1, 1.5, True):
        with pytest.raises(OptionError, match="rows must be an int ≥ 0"):
            fsm.allocate_token_bitmask(rows)  # type: ignore[arg-type]
    with pytest.raises(OptionError, match="state 1000000 is not a state this FSM has reached: pass initial_state"):
        fsm.fill_next_token_bitmask(fsm.allocate_token_bitmask(1), 0, 10**6)
    bitmask = fsm.allocate_token_bitmask(2)
    width = fsm.logits_width
    for logits, mask, message in [
        (torch.zeros(3, width), bitmask, r"with the logits' rows \(\[3\]\), got torch.int32 \[2, "),
        (torch.zeros(width), bitmask, r"with the logits' rows \(\[\]\)"),
        (torch.zeros(2, width), bitmask.float(), "got torch.float32"),
        (torch.zeros(2, width, dtype=torch.long), bitmask, "floating-point tensor, got a 2-D torch.int64 tensor"),
        (torch.zeros(2, 2, width), bitmask, "1-D or 2-D"),
        ([[0.0] * width], bitmask, "got list"),
    ]:
        with pytest.raises(OptionError, match=message):
            apply_token_bitmask_inplace(logits, mask)  # type: ignore[arg-type]
    with pytest.raises(OptionError, match="logits has 1 rows for 2 states: pass one state per row"):
        fsm.mask_logits_inplace(torch.zeros(1, width), [fsm.initial_state] * 2)
    logits = torch.zeros(width)  # one row: 1-D logits and a 1-D bitmask still go together
    fsm.fill_next_token_bitmask(bitmask, 0, fsm.initial_state)
    apply_token_bitmask_inplace(logits, bitmask[0])
    assert torch.isfinite(logits).nonzero().flatten().tolist() == fsm.allowed_token_ids(fsm.initial_state).tolist()


@pytest.mark.parametrize("bad", [[None], 1.5, "2", [1, None], True])
def test_end_token_ids_must_be_ints(byte_lm: structspec.LM, bad: object) -> None:
    with pytest.raises(OptionError, match="^eos_token_id must be a token id"):
        check_eos_token_ids(byte_lm.vocab, bad)  # type: ignore[arg-type]
    with pytest.raises(OptionError, match="^eos_token_id must be a token id"):
        structspec.compile(SPEC, byte_lm, eos_token_id=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("temperature", [1e308, 3.5e38, 2**200])
def test_a_temperature_past_float32s_range_is_refused_before_the_model_loads(temperature: float) -> None:
    # float32 rounds it to inf, and masked logits (-inf) divided by inf are NaN: torch.multinomial raised
    message = r"^temperature must be > 0 \(at least 1e-05\) and at most 3.4028e\+38 .*do_sample=False for greedy$"
    with pytest.raises(OptionError, match=message):
        structspec.generate_result(MISSING, SPEC, "hi", temperature=temperature, seed=0)


def test_the_largest_temperature_taken_samples_from_the_allowed_tokens(byte_lm: structspec.LM) -> None:
    result = structspec.generate_result(byte_lm, SPEC, "hi", temperature=MAX_TEMPERATURE, seed=0, max_new_tokens=3)
    assert result.stop_reason in ("eos", "fsm_complete", "max_new_tokens") and re.fullmatch("[ab]{1,3}", result.text)


def test_do_sample_false_reads_no_temperature_as_transformers_does(byte_lm: structspec.LM) -> None:
    greedy = structspec.generate_result(byte_lm, SPEC, "hi", do_sample=False)
    for temperature in (0, 0.0, 1e-300, 7):
        found = structspec.generate_result(byte_lm, SPEC, "hi", do_sample=False, temperature=temperature)
        assert found.token_ids == greedy.token_ids
    assert GenerateOptions(do_sample=False, temperature=0).decode_options().sampling == SamplingConfig()
    for bad in (-1.0, math.nan, math.inf, 1e308, True):  # not read, but a value no temperature has is a mistake
        with pytest.raises(OptionError, match=r"^temperature must be ≥ 0 and at most 3.4028e\+38 .*leave it out"):
            GenerateOptions(do_sample=False, temperature=bad)
    with pytest.raises(OptionError, match="^temperature must be .*do_sample=False for greedy$"):
        GenerateOptions(temperature=0)  # do_sample=None with temperature=0 would sample: the fix is right


@pytest.mark.parametrize("cls", ["TreeDrafter", "SelfDraft", "Staged", "LM"])
def test_a_drafter_class_instead_of_an_instance_is_refused_before_the_model_loads(cls: str) -> None:
    with pytest.raises(OptionError, match=rf"^draft={cls} is a class, not a drafter: pass an instance, as "
                                          rf"draft={cls}\(\)"):
        structspec.generate_result(MISSING, SPEC, "hi", draft=getattr(structspec, cls))


class _PutOnly:
    def put(self, value: torch.Tensor) -> None:
        pass


@pytest.mark.parametrize(("streamer", "missing"), [(object(), "put or end"), (_PutOnly(), "end"), ("s", "put or end")])
def test_a_streamer_without_put_and_end_is_refused_before_the_model_loads(streamer: object, missing: str) -> None:
    with pytest.raises(OptionError, match=rf"^streamer= is of type \w+, which has no {missing} method: pass a "):
        structspec.generate_result(MISSING, SPEC, "hi", streamer=streamer)
    with pytest.raises(OptionError, match="^streamer="):
        structspec.generate(MISSING, SPEC, "hi", streamer=streamer)


def test_a_compiled_spec_refuses_a_streamer_without_put_and_end_before_decoding(byte_lm: structspec.LM) -> None:
    compiled = structspec.compile(SPEC, byte_lm)
    for call in (compiled, compiled.result):
        with pytest.raises(OptionError, match="^streamer="):
            call("hi", streamer=object())


@pytest.mark.parametrize("pattern", [None, b"ab", 5, ["a"]])
def test_a_regex_whose_pattern_is_no_str_is_a_spec_error(pattern: object) -> None:
    message = rf"^Regex\(\.\.\.\) got a {type(pattern).__name__} as its pattern, not a str: pass the regex text"
    with pytest.raises(SpecError, match=message):
        Regex(pattern)  # type: ignore[arg-type]  # when the spec is made, before any compile
