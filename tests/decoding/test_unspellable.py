"""A vocabulary that cannot spell a character the output needs mid-decode: `UnspellableError` names the
character and carries the partial output; it is raised by `generate` (which must return a value) and is the
stop reason "error" of the `Result` of `generate_result`, `stream` and each batch row."""

from __future__ import annotations

import re
from typing import Any

import pytest

import structspec
from structspec import Regex, UnspellableError
from structspec.vocab import TokenVocab


class _NoAt:
    """``lm`` whose vocabulary has no token holding ``@`` (those ids spell nothing); all else delegates."""

    def __init__(self, lm: Any) -> None:
        self.lm = lm
        vocab = lm.vocab
        self.vocab = TokenVocab(tuple(None if b and b"@" in b else b for b in vocab.token_bytes),
                                vocab.eos_token_id, vocab.fingerprint + ":no-at")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.lm, name)


EMAIL = Regex("[a-z]{3}@[a-z]{2}")  # the model writes three letters, then needs the "@" it cannot spell
FORCED = {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 9},
                                           "mail": {"const": "ann@x"}}, "required": ["id", "mail"]}


@pytest.mark.parametrize("fast_forward", ["exact", "off"])
@pytest.mark.parametrize("draft", ["prompt_lookup", None])
def test_the_error_names_the_character_and_carries_the_partial_output(byte_lm, fast_forward, draft) -> None:
    lm = _NoAt(byte_lm)
    with pytest.raises(UnspellableError, match=r"needs '@' after the partial output '[a-z]{3}'") as caught:
        structspec.generate(lm, EMAIL, "Mail:", fast_forward=fast_forward, draft=draft)
    returned = structspec.generate_result(lm, EMAIL, "Mail:", fast_forward=fast_forward, draft=draft)
    for error, result in ((caught.value, caught.value.result), (returned.error, returned)):
        assert isinstance(error, UnspellableError) and error.result is result
        assert error.characters == ["@"] and re.fullmatch("[a-z]{3}", error.text)
        assert (result.stop_reason, result.value, result.error) == ("error", None, error)
        assert lm.vocab.decode(error.token_ids) == error.text == result.text
        assert len(error.sources) == len(error.token_ids) == result.stats.output_tokens > 0
        assert result.stats.target_forward_passes >= result.stats.model_tokens > 0  # the decode's own stats
    assert returned.token_ids == caught.value.token_ids and not hasattr(returned.error, "row")  # a row alone


@pytest.mark.parametrize("draft", ["prompt_lookup", "lookahead", None])
def test_forced_text_up_to_the_state_is_in_the_partial_output_with_the_decode_stats(byte_lm, draft) -> None:
    with pytest.raises(UnspellableError, match=r"""needs '@' after the partial output '\{"id":[0-9],"mail":"ann'""") as caught:
        structspec.generate(_NoAt(byte_lm), FORCED, "JSON:", draft=draft)  # ',"mail":"ann' is forced
    error = caught.value
    assert re.fullmatch(r'\{"id":[0-9],"mail":"ann', error.text) and error.characters == ["@"]
    stats = error.result.stats
    assert stats.output_tokens == len(error.token_ids) and stats.forced_tokens > 0 and stats.target_forward_passes > 0
    assert "forced" in error.sources


def test_stream_ends_in_the_error_result_after_the_chunks_it_streamed(byte_lm) -> None:
    *chunks, finished = structspec.stream(_NoAt(byte_lm), EMAIL, "Mail:")
    assert isinstance(finished, structspec.Finished) and finished.result.stop_reason == "error"
    error = finished.result.error
    assert isinstance(error, UnspellableError) and "".join(c.text for c in chunks) == error.text
    assert len(error.text) == 3


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [1, 3])
def test_a_batch_row_that_cannot_go_on_is_an_error_result_and_the_others_finish(byte_lm, batch_size) -> None:
    lm = _NoAt(byte_lm)
    specs = [Regex("[a-z]{4}"), EMAIL, Regex("[0-9]{3}"), EMAIL, Regex("x[yz]")]
    prompts = ["A:", "B:", "C:", "D:", "E:"]
    results = structspec.generate_batch(lm, specs, prompts, batch_size=batch_size)
    for i in (0, 2, 4):
        assert results[i].complete and re.fullmatch(specs[i].pattern, results[i].value)
        assert results[i].text == structspec.generate_result(lm, specs[i], prompts[i]).text  # as decoded alone
    for i in (1, 3):
        error = results[i].error
        assert isinstance(error, UnspellableError) and error.row == i and str(error).startswith(f"row {i}: ")
        assert results[i].stop_reason == "error" and re.fullmatch("[a-z]{3}", results[i].text)
        assert error.characters == ["@"] and error.text == results[i].text


def test_outside_a_decode_it_has_no_partial_output(byte_lm) -> None:
    fsm = structspec.compile(EMAIL, _NoAt(byte_lm)).fsm
    state = fsm.walk(fsm.initial_state, byte_lm.tokenizer.encode("abc", add_special_tokens=False))[-1]
    with pytest.raises(UnspellableError, match="needs '@' here") as caught:
        fsm.allowed_token_ids(state)
    assert caught.value.result is None and caught.value.text is None


@pytest.mark.parametrize("draft", ["prompt_lookup", structspec.TreeDrafter(), "lookahead"], ids=str)
def test_a_draft_into_a_state_the_vocabulary_cannot_leave_is_not_drafted(byte_lm, draft) -> None:
    # After "a" the model picks one letter of {b, d} in both regexes; in one of them the other letter leads to
    # the "@" this vocabulary cannot spell. The prompt repeats that letter after "a", so prompt lookup (and the
    # trees built on it) would draft into the state: plain decoding never reaches it, nor may a draft.
    lm = _NoAt(byte_lm)
    outcomes = []
    for good, bad in (("b", "d"), ("d", "b")):
        spec = Regex(f"a({bad}@x|{good}{good}{good})")
        prompt = f"a{bad}a{bad}a{bad}a{bad} a{bad}a{bad}a"
        plain = structspec.generate_result(lm, spec, prompt, fast_forward="off", draft=None)
        if plain.stop_reason == "error":
            outcomes.append("unspellable")
            continue
        result = structspec.generate_result(lm, spec, prompt, draft=draft)
        assert result.token_ids == plain.token_ids and result.text == f"a{good * 3}"
        outcomes.append("finished")
    assert sorted(outcomes) == ["finished", "unspellable"]  # the model's letter leads to "@" in exactly one
