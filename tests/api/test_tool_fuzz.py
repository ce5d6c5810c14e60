"""Fuzzing tool calls: random typed-function shapes (parameter kinds, names Pydantic keeps for itself,
annotations with and without a JSON Schema, defaults) each give a `Tool` whose schema is the signature exactly
(a property per parameter, of its name, required where it has no default; the arguments back as the function's
keywords) or a `ToolError` naming a parameter at fault; random turns with marker text inside argument strings,
which the automaton accepts, read alike by `parse_turn` and, chunk by chunk, by the stream's `CallReader`.

The oracles are written here, apart from the code they check. Derandomized; each test under a watchdog, so a
hang fails: 150 function shapes and 150 turns.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from tests.schema.test_fuzz import FUZZ

import structspec
from structspec import ToolCall, ToolCalls, ToolError
from structspec.schema.toolcalls import CallReader, parse_turn


class Place(BaseModel):
    city: str


class Plain:
    """No JSON Schema: Pydantic cannot build one."""


# annotation -> (a JSON value of it, whether it has a JSON Schema)
ANNOTATIONS: list[tuple[Any, Any, bool]] = [
    (int, 3, True), (str, "</tool_call>", True), (bool, False, True), (list[int], [1, 2], True),
    (Literal["a", "b"], "b", True), (Place, {"city": "Oslo"}, True), ("int", 4, True), ("Place", {"city": "x"}, True),
    (dict[str, float], {"k": 1.5}, True), (Callable[[int], int], None, False), (Plain, None, False),
    ("NoSuchType", None, False), (inspect.Parameter.empty, None, False),
]
NAMES = st.one_of(st.sampled_from(["_x", "__y", "model_config", "model_name", "json", "copy", "fields", "self",
                                   "args", "kwargs", "schema", "validate", "x_0"]),
                  st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True))
KINDS = [inspect.Parameter.POSITIONAL_OR_KEYWORD] * 4 + [inspect.Parameter.KEYWORD_ONLY] * 3 + [
    inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD]
ORDER = list(inspect._ParameterKind)


@st.composite
def signatures(draw: st.DrawFn) -> list[tuple[inspect.Parameter, int]]:
    """Parameters in an order Python allows, each with the index of its annotation in `ANNOTATIONS`."""
    drawn = draw(st.lists(st.tuples(NAMES, st.sampled_from(KINDS), st.integers(0, len(ANNOTATIONS) - 1),
                                    st.booleans()), max_size=5, unique_by=lambda p: p[0]))
    drawn.sort(key=lambda p: ORDER.index(p[1]))
    out, seen_kinds, defaulted = [], set(), False
    for name, kind, annotation, default in drawn:
        if kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            if kind in seen_kinds:
                continue
            default = False
        # a positional parameter after one with a default needs one too (Python's rule)
        if kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            default = default or defaulted
            defaulted = default
        seen_kinds.add(kind)
        value = ANNOTATIONS[annotation][1]
        out.append((inspect.Parameter(name, kind, annotation=ANNOTATIONS[annotation][0],
                                      default=value if default else inspect.Parameter.empty), annotation))
    return out


def function_of(parameters: list[inspect.Parameter]) -> Callable[..., Any]:
    def tool(*args: Any, **kwargs: Any) -> None: ...

    tool.__signature__ = inspect.Signature(parameters)  # what inspect.signature reads
    return tool


@pytest.mark.timeout(60)
@settings(FUZZ, max_examples=150)
@given(shape=signatures())
def test_a_functions_tool_is_its_signature_exactly_or_a_tool_error(shape) -> None:
    parameters = [p for p, _ in shape]
    function = function_of(parameters)
    faulty = [p.name for p, a in shape if not ANNOTATIONS[a][2] or p.kind in (
        inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD, inspect.Parameter.POSITIONAL_ONLY)]
    if faulty:
        with pytest.raises(ToolError) as info:
            ToolCalls([function])
        assert "tool 'tool'" in str(info.value) and any(repr(n) in str(info.value) or f"*{n} " in str(info.value)
                                                        for n in faulty), str(info.value)
        return
    (tool,) = ToolCalls([function]).tools
    assert list(tool.parameters["properties"]) == [p.name for p in parameters]
    assert tool.parameters.get("required", []) == [p.name for p in parameters if p.default is p.empty]
    given_values = {p.name: ANNOTATIONS[a][1] for p, a in shape}
    arguments = tool.spec.model_validate_json(json.dumps(given_values))
    keywords = ToolCall("tool", arguments).keywords()
    assert list(keywords) == [p.name for p in parameters]
    assert {k: v.model_dump() if isinstance(v, BaseModel) else v for k, v in keywords.items()} == given_values


SEARCH = {"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"],
    "additionalProperties": False}}}
PAIR = {"type": "function", "function": {"name": "pair", "parameters": {
    "type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}, "required": ["a", "b"],
    "additionalProperties": False}}}
PIECES = ["<tool_call>", "</tool_call>", "<tool_", "call>", "\n", "{", "}", '"', "\\", ":", ",", " ", "x", "é",
          '{"name": "search", "arguments": {"query": "', '"}}']
ARGUMENT = st.lists(st.sampled_from(PIECES), max_size=6).map("".join)
# (an auto turn's text never opens with "{": with bare calls, the default, that opens a call)
FREE = st.text(st.sampled_from("ab <>/\n{}\"é"), max_size=12).filter(
    lambda t: "<tool_call>" not in t and not t.lstrip(" \n").startswith("{"))


@pytest.fixture(scope="module")
def compiled(byte_lm) -> structspec.Compiled:
    return structspec.compile(ToolCalls([SEARCH, PAIR], parallel=True, markers="text"), byte_lm)


@st.composite
def turns(draw: st.DrawFn) -> tuple[str, list[ToolCall], list[int]]:
    """A turn's text as the grammar writes it (free text, then calls one per line), its calls, and where each
    call's end marker ends."""
    text, calls, ends = draw(FREE), [], []
    for _ in range(draw(st.integers(0, 3))):
        if draw(st.booleans()):
            call = ToolCall("search", {"query": draw(ARGUMENT)})
        else:
            call = ToolCall("pair", {"a": draw(ARGUMENT), "b": draw(st.integers(-99, 99))})
        spaced = draw(st.booleans())  # the arguments' whitespace: compact or json.dumps' spacing
        # (the grammar's strings hold characters as they are, no \u escapes but a control character's)
        arguments = json.dumps(call.arguments, ensure_ascii=False, separators=(", ", ": ") if spaced else (",", ":"))
        body = f'{{"name": "{call.name}", "arguments": {arguments}}}'
        text += ("\n" if calls else "") + f"<tool_call>\n{body}\n</tool_call>"
        calls.append(call)
        ends.append(len(text))
    return text, calls, ends


@pytest.mark.timeout(60)
@settings(FUZZ, max_examples=150)
@given(turn=turns(), cuts=st.lists(st.integers(1, 9), min_size=1, max_size=40))
def test_marker_text_in_arguments_is_read_alike_whole_and_streamed(compiled, turn, cuts) -> None:
    text, calls, ends = turn
    fsm = compiled.fsm
    state = fsm.index.dfa.step(fsm.initial_state, text.encode())
    assert state and fsm.is_final(state), text  # a turn the automaton accepts
    parsers = {"search": json.loads, "pair": json.loads}
    markers = ("<tool_call>", "</tool_call>")
    value = parse_turn(text, markers, parsers)
    assert value.calls == calls and value == compiled.constraint.parse(text)
    reader, done, at = CallReader(markers, parsers), [], 0
    for cut in cuts * (len(text) // max(sum(cuts), 1) + 1):
        done += reader.read(text[at:at + cut])
        at += cut
    assert [e.call for e in done] == calls and [len(e.text_so_far) for e in done] == ends
