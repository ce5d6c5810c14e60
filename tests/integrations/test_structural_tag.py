"""xgrammar's structural tags (what vLLM's server sends for tool calls) as structspec regexes; no vLLM needed."""

from __future__ import annotations

import json
import re

import pytest

from structspec.integrations.structural_tag import UnsupportedRequestError, structural_tag_regex

ANY_WHITESPACE = "[ \n\r\t]*"
ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}


def hermes(names: list[str], schema: object) -> list[dict]:
    """vLLM 0.32's hermes tool tags: each tool in two layouts (its calls on lines of their own, or on one)."""
    return [{"type": "tag", "begin": f'<tool_call>{nl}{{"name": "{name}", "arguments": ',
             "content": {"type": "json_schema", "json_schema": schema}, "end": f"}}{nl}</tool_call>"}
            for name in names for nl in ("\n", "")]


def matches(tag: dict, text: str) -> bool:
    return re.fullmatch(structural_tag_regex(json.dumps(tag), ANY_WHITESPACE), text) is not None


CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
REQUIRED = {"type": "structural_tag", "format": {"type": "tags_with_separator", "tags": hermes(["add", "mul"], ADD),
                                                 "separator": "", "at_least_one": True}}
AUTO = {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<tool_call>"],
                                             "tags": hermes(["add"], ADD)}}


@pytest.mark.parametrize("tag, text, ok", [
    (REQUIRED, CALL, True),
    (REQUIRED, CALL + CALL.replace("add", "mul"), True),  # parallel calls, no separator
    (REQUIRED, '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>', True),
    (REQUIRED, "", False),  # at least one call
    (REQUIRED, "Sure. " + CALL, False),  # nothing but calls
    (REQUIRED, CALL.replace('"b": 2', '"b": "2"'), False),  # the tool's schema holds
    (REQUIRED, CALL.replace('"b": 2', '"b": 2, "c": 3'), False),  # objects closed, as xgrammar's
    (REQUIRED, CALL.replace("add", "sub"), False),  # no such tool
    (AUTO, "It is sunny.", True),
    (AUTO, "Let me add. " + CALL + " Done.", True),
    (AUTO, "a <tool_call> without a call", False),  # the trigger commits to a call
])
def test_tool_tags_accept_exactly_the_calls_vllm_parses(tag: dict, text: str, ok: bool) -> None:
    assert matches(tag, text) is ok


def test_named_tool_and_single_call_stop_after_the_first() -> None:
    tag = {"type": "structural_tag", "format": {**REQUIRED["format"], "stop_after_first": True}}
    assert matches(tag, CALL) and not matches(tag, CALL + CALL)


def test_legacy_structures_and_combinators() -> None:
    legacy = {"type": "structural_tag", "triggers": ["<f="],
              "structures": [{"begin": "<f=add>", "schema": ADD, "end": "</f>"}]}
    assert matches(legacy, 'x <f=add>{"a": 1, "b": 2}</f> y')
    either = {"type": "structural_tag", "format": {"type": "or", "elements": [
        {"type": "const_string", "value": "none"},
        {"type": "sequence", "elements": [{"type": "regex", "pattern": "[0-9]+"},
                                          {"type": "optional", "content": {"type": "const_string", "value": "%"}}]},
        {"type": "tag", "begin": "<t>", "content": {"type": "any_text"}, "end": ["</t>", "</end>"]}]}}
    for text, ok in [("none", True), ("42", True), ("42%", True), ("<t>a b</end>", True),
                     ("<t>a</t>b</t>", False), ("x", False)]:  # any_text in a tag stops at the tag's first end
        assert matches(either, text) is ok, text
    repeated = {"type": "structural_tag", "format": {"type": "repeat", "min": 2, "max": 3,
                                                     "content": {"type": "const_string", "value": "ab"}}}
    assert [matches(repeated, "ab" * n) for n in range(5)] == [False, False, True, True, False]
    spaced = {"type": "structural_tag", "format": {"type": "json_schema", "max_whitespace_cnt": 1,
                                                   "json_schema": {"type": "array", "items": {"type": "integer"}}}}
    assert matches(spaced, "[1, 2]") and not matches(spaced, "[1,  2]")
    short = {"type": "structural_tag", "format": {"type": "any_text", "max_chars": 3}}
    assert matches(short, "abc") and not matches(short, "abcd")


@pytest.mark.parametrize("format, message", [
    ({"type": "grammar", "grammar": 'root ::= "a"'}, "an EBNF grammar"),
    ({"type": "token", "token": "<|im_end|>"}, "a token format"),
    ({"type": "json_schema", "json_schema": ADD, "style": "qwen_xml"}, "in the 'json' style"),
    ({"type": "any_text", "max_tokens": 10}, "bound it with max_chars"),
    ({"type": "tag", "begin": "<a>", "content": {"type": "any_text"}, "end": {"type": "token", "token": 7}},
     "a token end is not supported"),
    ({"type": "triggered_tags", "triggers": ["<x>"], "tags": hermes(["add"], ADD)}, "begins with no trigger"),
    ({"type": "wat"}, "no xgrammar format structspec knows"),
    ({"type": "any_text", "max_chars": "3"}, "must be an int >= 0"),
])
def test_unsupported_formats_are_refused_naming_the_format_and_the_fix(format: dict, message: str) -> None:
    with pytest.raises(UnsupportedRequestError, match=re.escape(message)) as refused:
        structural_tag_regex({"type": "structural_tag", "format": format}, ANY_WHITESPACE)
    assert "/format" in str(refused.value)  # where in the tag
