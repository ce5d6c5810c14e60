"""`Reasoning`: thinking up to an end marker, then the answer's spec; a thinking budget that forces the end
marker; the value is the answer's and the thinking is kept on the result; accelerated modes stay lossless."""

from __future__ import annotations

import re
from typing import Literal

import pytest
from pydantic import BaseModel

import structspec
from structspec import OptionError, Reasoning, Regex, Special
from tests.api.test_toolcalls import accepts


class Answer(BaseModel):
    verdict: Literal["yes", "no"]


@pytest.mark.parametrize("spec, table", [
    (Reasoning(Regex("yes|no")), [("hmm</think>yes", True), ("</think>\n\nno", True), ("hmm</think>maybe", False),
                                  ("hmm yes", False), ("a</think>b</think>yes", False)]),
    (Reasoning(Answer, begin="<think>"), [('<think>x</think>{"verdict":"no"}', True),
                                          ('x</think>{"verdict":"no"}', False)]),
    (Reasoning(Regex("ok"), max_thinking_chars=3), [("abc</think>ok", True), ("abcd</think>ok", False),
                                                     ("a<b</think>ok", False), ("</think>ok", True)]),
])
def test_the_language(byte_lm, spec, table) -> None:
    compiled = structspec.compile(spec, byte_lm)
    for text, expected in table:
        assert accepts(compiled, [text]) == expected, text


def test_a_special_end_marker_on_qwen(qwen_lm) -> None:
    compiled = structspec.compile(Reasoning(Regex("ok"), end=Special(151658), separator=""), qwen_lm)
    assert accepts(compiled, ["thinking", 151658, "ok"])
    assert not accepts(compiled, ["thinking</tool_call>ok"])  # the token, not its text
    assert compiled.constraint.parse("thinking</tool_call>ok") == "ok"


def test_the_value_is_the_answers_and_the_thinking_is_kept(byte_lm) -> None:
    spec = Reasoning(Answer, begin="<think>", max_thinking_chars=12)
    result = structspec.generate_result(byte_lm, spec, "Is 7 prime? Think first.", max_new_tokens=80)
    assert result.complete, result.text
    assert isinstance(result.value, Answer)
    assert result.text == f"<think>{result.thinking}</think>" + result.text.split("</think>")[1]
    assert len(result.thinking) <= 12


def test_a_spent_budget_forces_the_end_marker(byte_lm) -> None:
    result = structspec.generate_result(byte_lm, Reasoning(Answer, max_thinking_chars=0), "Answer:",
                                        max_new_tokens=40)
    assert result.thinking == "" and result.text.startswith("</think>")
    spelled = [len(byte_lm.vocab.spell(result.token_ids[:i])) for i in range(len(result.token_ids) + 1)]
    marker = result.sources[: next(i for i, n in enumerate(spelled) if n >= len("</think>"))]
    # the marker is forced text: spliced into the drafts, so most of its tokens cost no model choice
    assert marker.count("forced") > marker.count("model")


@pytest.mark.parametrize("mode", [dict(fast_forward="exact", draft=None), dict(fast_forward="exact"),
                                  dict(draft="lookahead")])
def test_accelerated_modes_are_token_identical(byte_lm, mode) -> None:
    spec = Reasoning(Answer, max_thinking_chars=20)
    prompt = 'Reply {"verdict":"yes"} after thinking.'
    plain = structspec.generate_result(byte_lm, spec, prompt, fast_forward="off", draft=None, max_new_tokens=50)
    fast = structspec.generate_result(byte_lm, spec, prompt, max_new_tokens=50, **mode)
    assert fast.token_ids == plain.token_ids and fast.value == plain.value


def test_bad_reasoning_specs() -> None:
    with pytest.raises(OptionError, match=re.escape("Reasoning(Reasoning(...))")):
        Reasoning(Reasoning(Answer))
    with pytest.raises(OptionError, match="max_thinking_chars must be an int >= 0"):
        Reasoning(Answer, max_thinking_chars=-1)


@pytest.mark.parametrize("make, words", [
    (lambda: Reasoning(Answer, separator="("), "separator='(' is no regex structspec reads (missing ), unterminated"),
    (lambda: Reasoning(Answer, separator="(?<=a)b"), "separator='(?<=a)b' is no regex structspec reads (lookarounds"),
    (lambda: Reasoning(Answer, separator=None), "separator must be a regex str"),
    (lambda: Reasoning(Answer, end=None), "end must be a non-empty str or a Special token, got None"),
    (lambda: Reasoning(Answer, end=""), "end must be a non-empty str or a Special token, got ''"),
    (lambda: Reasoning(Answer, begin=""), "begin must be a non-empty str or a Special token, got ''"),
    (lambda: Reasoning(Answer, begin=7), "begin must be a non-empty str or a Special token, got 7"),
    (lambda: Reasoning(Answer, end=Special(None)), "Special(None) names no token"),
    (lambda: Reasoning(Answer, max_thinking_tokens=1.5), "max_thinking_tokens must be an int >= 0"),
    (lambda: structspec.Text(stop="</a>"), "stop='</a>' is not a tuple: pass a tuple of them, e.g. stop=("),
    (lambda: structspec.Text(stop=(None,)), "a stop must be a non-empty str or a Special token, got None"),
    (lambda: structspec.Text(avoid="ab"), "avoid='ab' is not a tuple"),
    (lambda: structspec.Text(avoid=(1,)), "avoid=(1,) holds a non-str"),
    (lambda: Special(-1), "Special(-1) names no token"),
    (lambda: structspec.Tag(None, Answer, "</a>"), "a Tag's begin must be a non-empty str or a Special token"),
    (lambda: structspec.Tag("<a>", Answer, ""), "a Tag's end must be a non-empty str or a Special token"),
    (lambda: structspec.Triggered(("<a>",)), "Triggered's tags must be Tags"),
    (lambda: structspec.Triggered((TAG,), at_least=-1), "at_least must be an int >= 0, got -1"),
    (lambda: structspec.Triggered((TAG,), at_most="2"), "at_most must be an int >= 0 or None, got '2'"),
    (lambda: structspec.Triggered((TAG,), text="no"), "text must be a bool"),
    (lambda: structspec.Triggered((TAG,), text=False, separator=None), "separator must be a str"),
])
def test_every_bad_argument_is_an_option_error_naming_it(make, words) -> None:
    with pytest.raises(OptionError, match=re.escape(words)):
        make()


TAG = structspec.Tag("<a>", Regex("x"), "</a>")


def test_lists_are_taken_as_tuples() -> None:
    assert structspec.Text(stop=["</a>"], avoid=["<b>"]) == structspec.Text(stop=("</a>",), avoid=("<b>",))
    assert structspec.Triggered([TAG]).tags == (TAG,)
