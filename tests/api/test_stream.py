"""Streaming: `structspec.stream`'s events, the transformers-style ``streamer=``, and per-token log-probabilities."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from transformers import TextIteratorStreamer

import structspec
from structspec import FieldDone, Finished, TextChunk
from tests.numerics import logprobs_approx

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 4}, "ok": {"type": "boolean"}},
          "required": ["name", "ok"]}


@pytest.mark.slow
@pytest.mark.parametrize("lm_name", ["byte_lm", "sp_lm"])
def test_logprobs_equal_masked_log_softmax(lm_name: str, request: pytest.FixtureRequest) -> None:
    lm = request.getfixturevalue(lm_name)
    r = structspec.generate_result(lm, SCHEMA, "x", fast_forward="off", draft=None, output_logprobs=True,
                                   max_new_tokens=12)
    assert r.logprobs is not None and len(r.logprobs) == len(r.token_ids)
    fsm = structspec.compile(SCHEMA, lm).fsm
    prompt = lm.encode_prompt("x")
    state = fsm.initial_state
    for i, token in enumerate(r.token_ids):
        logits = lm.forward(prompt + r.token_ids[:i], lm.new_cache(), logits_to_keep=1)
        fsm.mask_logits_inplace(logits, [state])
        expected = float(logits[0].float().log_softmax(-1)[token])
        assert [r.logprobs[i]] == logprobs_approx([expected], lm.dtype)
        if len(fsm.allowed_token_ids(state)) == 1:
            assert r.logprobs[i] == 0.0
        state = fsm.next_state(state, token)


@pytest.mark.slow
def test_logprobs_with_drafts_and_forcing(byte_lm: structspec.LM) -> None:
    r = structspec.generate_result(byte_lm, SCHEMA, 'name "ab"', output_logprobs=True, max_new_tokens=20)
    plain = structspec.generate_result(byte_lm, SCHEMA, 'name "ab"', max_new_tokens=20)
    assert r.token_ids == plain.token_ids and plain.logprobs is None
    assert r.logprobs is not None and len(r.logprobs) == len(r.token_ids)
    assert all(lp <= 1e-6 for lp in r.logprobs)


RECORD = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2}, "n": {"type": "integer"},
}, "required": ["name", "ok", "tags", "n"], "additionalProperties": False}
# Forced text full of JSON's own punctuation, in strings and nested values, with optional whitespace.
TRICKY = {"type": "object", "properties": {
    "a": {"const": 'x":,}{[\\'},
    "b": {"type": "object", "properties": {
        "c": {"type": "array", "items": {"const": "}],{"}, "minItems": 2, "maxItems": 2}}, "required": ["c"],
          "additionalProperties": False},
    "e": {"type": "integer"},
}, "required": ["a", "b", "e"], "additionalProperties": False}


def check_events(events: list[structspec.StreamEvent]) -> structspec.Result:
    """The stream's promises, whatever the spec: chunks add up to the result, each `FieldDone` is the next
    member of the final object, one `Finished` comes last. Returns its `Result`."""
    assert isinstance(events[-1], Finished) and not any(isinstance(e, Finished) for e in events[:-1])
    result = events[-1].result
    chunks = [e for e in events if isinstance(e, TextChunk)]
    assert "".join(c.text for c in chunks) == result.text
    assert [t for c in chunks for t in c.token_ids] == result.token_ids
    assert [s for c in chunks for s in c.sources] == result.sources
    fields = [e for e in events if isinstance(e, FieldDone)]
    text, last = "", ""
    for event in events[:-1]:
        if isinstance(event, TextChunk):
            text, last = text + event.text, event.text
        else:  # a field closes right after the chunk holding its ``,`` or ``}``
            assert text.startswith(event.text_so_far) and len(text) - len(last) < len(event.text_so_far)
            assert event.text_so_far[-1] in ",}"
    if result.complete and fields:
        members = list(json.loads(result.text).items())
        assert [(f.name, f.value) for f in fields] == members
    return result


def same_result(a: structspec.Result, b: structspec.Result) -> None:
    assert (a.token_ids, a.text, a.value, a.stop_reason, a.sources) == (b.token_ids, b.text, b.value, b.stop_reason,
                                                                       b.sources)
    assert (a.stats.output_tokens, a.stats.target_forward_passes) == (b.stats.output_tokens,
                                                                      b.stats.target_forward_passes)


@pytest.mark.slow
@pytest.mark.parametrize("lm_name", ["byte_lm", "sp_lm"])
@pytest.mark.parametrize("options", [
    {"max_new_tokens": 60},
    {"max_new_tokens": 60, "temperature": 0.8, "seed": 3},
    {"max_new_tokens": 6},  # the budget runs out inside the first field
    {"max_new_tokens": 60, "fast_forward": "off", "draft": None},
], ids=["greedy", "sampled", "budget", "one-token-turns"])
def test_stream_events_add_up_to_generate_result(lm_name: str, options: dict[str, Any],
                                                 request: pytest.FixtureRequest) -> None:
    lm = request.getfixturevalue(lm_name)
    events = list(structspec.stream(lm, RECORD, 'name "ab"', **options))
    result = check_events(events)
    same_result(result, structspec.generate_result(lm, RECORD, 'name "ab"', **options))
    if options["max_new_tokens"] == 6:
        assert result.stop_reason == "max_new_tokens" and result.value is None
    else:
        assert result.complete and sum(isinstance(e, FieldDone) for e in events) == 4


@pytest.mark.slow
@pytest.mark.parametrize("lm_name", ["byte_lm", "sp_lm"])
def test_stream_fields_through_json_punctuation_in_strings(lm_name: str, request: pytest.FixtureRequest) -> None:
    lm = request.getfixturevalue(lm_name)
    events = list(structspec.stream(lm, TRICKY, "x", fast_forward="off", draft=None, max_new_tokens=80,
                                    whitespace_pattern=r"[ \n]?"))
    result = check_events(events)
    assert result.complete
    assert [(e.name, e.value) for e in events if isinstance(e, FieldDone)][:2] == [
        ("a", 'x":,}{[\\'), ("b", {"c": ["}],{", "}],{"]})]


@pytest.mark.parametrize("lm_name", ["byte_lm", "sp_lm"])
def test_stream_regex_splits_no_character(lm_name: str, request: pytest.FixtureRequest) -> None:
    """One token per turn over characters both tokenizers spell in several tokens: some chunks carry bytes
    but no text, none carries half a character, and a regex yields no field events."""
    lm = request.getfixturevalue(lm_name)
    spec = structspec.Regex("[äöü日本]{4}")
    events = list(structspec.stream(lm, spec, "x", fast_forward="off", draft=None))
    result = check_events(events)
    assert not any(isinstance(e, FieldDone) for e in events)
    assert any(e.token_ids and not e.text for e in events if isinstance(e, TextChunk))
    assert len(result.text) == 4 and "\ufffd" not in result.text
    same_result(result, structspec.generate_result(lm, spec, "x", fast_forward="off", draft=None))
    cut = list(structspec.stream(lm, spec, "x", fast_forward="off", draft=None, max_new_tokens=1))
    assert check_events(cut).text == "\ufffd"  # one byte of a character: the budget cut it short
    assert cut[-2] == TextChunk("\ufffd", [], [])


def test_stream_checks_before_the_model_runs(byte_lm: structspec.LM) -> None:
    with pytest.raises(structspec.SchemaError):
        structspec.stream(byte_lm, {"type": "object", "properties": {"a": {"const": {"b": 1}}}}, "x")
    with pytest.raises(structspec.OptionError, match="temperature"):
        structspec.stream(byte_lm, RECORD, "x", temperature=0, do_sample=True)


class Recorder:
    """A streamer that keeps what it is given."""

    def __init__(self) -> None:
        self.puts: list[torch.Tensor] = []
        self.ends = 0

    def put(self, value: torch.Tensor) -> None:
        self.puts.append(value)

    def end(self) -> None:
        self.ends += 1


@pytest.mark.slow
@pytest.mark.parametrize("lm_name", ["byte_lm", "sp_lm"])
def test_streamer_gets_prompt_then_accepted_ids(lm_name: str, request: pytest.FixtureRequest) -> None:
    lm = request.getfixturevalue(lm_name)
    recorder = Recorder()
    result = structspec.generate_result(lm, RECORD, 'name "ab"', max_new_tokens=60, streamer=recorder)
    assert all(p.dtype == torch.long and p.dim() == 2 and p.shape[0] == 1 for p in recorder.puts)
    assert recorder.puts[0][0].tolist() == lm.encode_prompt('name "ab"') and recorder.ends == 1
    assert [t for p in recorder.puts[1:] for t in p[0].tolist()] == result.token_ids
    assert max(p.shape[1] for p in recorder.puts[1:]) > 1  # a forced or drafted run arrives in one put
    same_result(result, structspec.generate_result(lm, RECORD, 'name "ab"', max_new_tokens=60))


def test_transformers_text_streamer_reads_the_output(byte_lm: structspec.LM) -> None:
    streamer = TextIteratorStreamer(byte_lm.tokenizer, skip_prompt=True)
    value = structspec.generate(byte_lm, RECORD, 'name "ab"', max_new_tokens=60, streamer=streamer)
    assert json.loads("".join(streamer)) == value


def test_streamer_ends_at_the_budget_too(byte_lm: structspec.LM) -> None:
    recorder = Recorder()
    with pytest.raises(structspec.TokenBudgetExceeded) as err:
        structspec.generate(byte_lm, RECORD, 'name "ab"', max_new_tokens=5, streamer=recorder)
    assert [t for p in recorder.puts[1:] for t in p[0].tolist()] == err.value.token_ids and recorder.ends == 1


@pytest.mark.real_model
def test_stream_smollm2(smollm2: structspec.LM) -> None:
    spec = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
            "required": ["name", "age"]}
    prompt = "Alice is 31 years old. As JSON:"
    events = list(structspec.stream(smollm2, spec, prompt, max_new_tokens=30))
    result = check_events(events)
    assert result.complete and [e.name for e in events if isinstance(e, FieldDone)] == ["name", "age"]
    same_result(result, structspec.generate_result(smollm2, spec, prompt, max_new_tokens=30))
