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
