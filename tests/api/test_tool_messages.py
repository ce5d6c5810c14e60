"""Tool calls a user can act on: a call an ``auto`` turn wrote as text without the markers is reported (not run);
a turn becomes the next prompt's assistant message and its calls' ``tool`` messages, in the shape chat templates
take; the calls run against the given Python functions with their validated arguments as keywords."""

from __future__ import annotations

import json
import re
import warnings
from typing import Literal

import pytest
from pydantic import BaseModel

import structspec
from structspec import ToolCall, ToolCalls, ToolCallsValue, ToolError


def get_weather(city: str, unit: Literal["C", "F"] = "C") -> str:
    """The weather in a city now."""
    return f"18 {unit} in {city}"


class SendEmail(BaseModel):
    """Send an email."""

    to: str
    subject: str


SEARCH = {"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
WEATHER = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'


@pytest.fixture(scope="module")
def auto(byte_lm) -> structspec.Compiled:
    # bare calls off: a turn that opens with a call's JSON is text here (with them on it is a call, in `calls`:
    # tests/api/test_toolcalls.py)
    return structspec.compile(ToolCalls([get_weather, SendEmail, SEARCH], markers="text", bare_calls=False), byte_lm)


@pytest.mark.parametrize("text", [
    f"Sure.\n{WEATHER}",
    f"Here you go:\n```json\n{WEATHER}\n```\n",
    'I will call it: {"name": "get_weather", "parameters": {"city": "Oslo"}} now.',
    '{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}',  # OpenAI's wire format: a JSON string
])
def test_a_call_written_as_text_is_reported_with_a_warning(auto, text) -> None:
    with pytest.warns(UserWarning, match=re.escape("as text, without the <tool_call> markers")):
        value = auto.constraint.parse(text)
    assert value.calls == [] and value.text == text
    assert [(c.name, c.arguments.city) for c in value.unmarked_calls] == [("get_weather", "Oslo")]


@pytest.mark.parametrize("text", [
    "No call here {not json} {}.",
    '{"name": "get_weather", "arguments": {"town": "Oslo"}}',  # arguments its tool refuses
    '{"name": "get_time", "arguments": {}}',  # no such tool
])
def test_text_that_is_no_call_of_a_given_tool_is_not_reported(auto, text) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert auto.constraint.parse(text) == ToolCallsValue(text, [])


def test_a_marked_call_is_a_call_and_other_choices_do_not_look_in_text(auto, byte_lm) -> None:
    marked = auto.constraint.parse(f"Calling.<tool_call>\n{WEATHER}\n</tool_call>")
    assert [c.name for c in marked.calls] == ["get_weather"] and marked.unmarked_calls == []
    none = structspec.compile(ToolCalls([get_weather], choice="none", markers="text"), byte_lm)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert none.constraint.parse(WEATHER).unmarked_calls == []


def turn_with_calls() -> ToolCallsValue:
    weather = ToolCalls([get_weather]).tools[0].spec
    return ToolCallsValue("Let me check.", [ToolCall("get_weather", weather(city="Oslo", unit="F")),
                                            ToolCall("SendEmail", SendEmail(to="a@b.c", subject="Hi")),
                                            ToolCall("search", {"query": "x"})])


def test_the_turn_as_the_next_prompts_messages() -> None:
    turn = turn_with_calls()
    ids = turn.call_ids()
    assert len(set(ids)) == 3 and ids == turn_with_calls().call_ids()  # distinct, and the same for the same turn
    assert turn.assistant_message() == {"role": "assistant", "content": "Let me check.", "tool_calls": [
        {"id": ids[0], "type": "function", "function": {"name": "get_weather",
                                                        "arguments": {"city": "Oslo", "unit": "F"}}},
        {"id": ids[1], "type": "function", "function": {"name": "SendEmail",
                                                        "arguments": {"to": "a@b.c", "subject": "Hi"}}},
        {"id": ids[2], "type": "function", "function": {"name": "search", "arguments": {"query": "x"}}}]}
    assert ToolCallsValue("Hi.").assistant_message() == {"role": "assistant", "content": "Hi."}
    assert turn.tool_messages(["sunny", {"n": 1}, None]) == [
        {"role": "tool", "tool_call_id": ids[0], "name": "get_weather", "content": "sunny"},
        {"role": "tool", "tool_call_id": ids[1], "name": "SendEmail", "content": '{"n": 1}'},
        {"role": "tool", "tool_call_id": ids[2], "name": "search", "content": "null"}]
    with pytest.raises(ToolError, match="2 results for 3 calls"):
        turn.tool_messages(["a", "b"])


def test_the_calls_run_against_the_given_functions() -> None:
    turn, sent = turn_with_calls(), []

    def search(query: str) -> list[str]:
        return [query, query]

    messages = turn.run({"get_weather": get_weather, "SendEmail": lambda **kw: sent.append(kw) or "sent",
                         "search": search})
    assert [m["content"] for m in messages] == ["18 F in Oslo", "sent", '["x", "x"]']
    assert sent == [{"to": "a@b.c", "subject": "Hi"}]
    assert ToolCallsValue("", turn.calls[:1]).run([get_weather, SendEmail, SEARCH])[0]["content"] == "18 F in Oslo"
    ran = []
    with pytest.raises(ToolError, match=re.escape("no function for the tool 'SendEmail'")):
        turn.run({"get_weather": lambda **kw: ran.append(kw), "search": search})
    assert ran == []  # refused before any call ran


# Qwen2.5's chat template, the parts that render an assistant's tool calls and the tools' answers.
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content %}{{ m.content }}{% endif %}"
            "{% for c in m.tool_calls or [] %}{% set c = c.function %}\n<tool_call>\n{\"name\": \"{{ c.name }}\", "
            "\"arguments\": {{ c.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n{% endfor %}")


def test_a_chat_template_renders_the_next_turn(byte_lm) -> None:
    spec = ToolCalls([get_weather], choice="get_weather", markers="text")
    turn = structspec.generate(byte_lm, spec, "Weather in Oslo?", max_new_tokens=80)
    messages = [{"role": "user", "content": "Weather in Oslo?"}, turn.assistant_message(), *turn.run([get_weather])]
    shown = byte_lm.tokenizer.apply_chat_template(messages, chat_template=TEMPLATE, tokenize=False)
    (call,) = re.findall(r"<tool_call>\n(.*)\n</tool_call>", shown)
    assert json.loads(call) == {"name": "get_weather", "arguments": turn.calls[0].json_arguments()}
    assert shown.endswith(f"<|im_start|>tool\n{get_weather(**turn.calls[0].keywords())}<|im_end|>\n")


def test_toolbench_reports_the_calls_written_as_text() -> None:
    from structspec.tools.benchmarks.toolbench import Tally, markdown

    shown = markdown({"plain masked": Tally(unmarked=2), "fast-forward": Tally()})
    assert "Calls written as text without the markers" in shown and "plain masked 2." in shown
    assert "fast-forward 0" not in shown
    assert "without the markers" not in markdown({"plain masked": Tally()})
