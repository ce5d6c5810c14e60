"""`ToolCalls`: an agent's turn as a spec — free text and/or calls to the given tools, each call's arguments
matching that tool's schema — and its value, the text and the validated calls.

The call's format is Hermes/Qwen's (what Qwen2.5's chat template writes)::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

where ``<tool_call>`` and ``</tool_call>`` are the tokenizer's own tokens when it has them (ids 151657 and
151658 in Qwen2.5's: ``markers="auto"``), and the same text spelled by ordinary tokens otherwise (the
documented generic format). Most of a call is fixed by the grammar (the markers, ``{"name": "``, a tool's name
once its first letters decide it, ``", "arguments": ``, the keys), so fast-forward writes it without model
calls, and arguments copied from the conversation are what prompt lookup drafts.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import pydantic

from structspec.errors import SchemaError, ToolError, ToolSchemaError
from structspec.result import CallDone, ToolCall, ToolCallsValue
from structspec.schema.constraint import Constraint
from structspec.schema.structural import Special, Tag, Text, Triggered, Writer

Choice = Literal["auto", "required", "none"] | str


@dataclass(frozen=True)
class Tool:
    """One tool: its name, description, parameters' JSON Schema, and the spec its arguments are parsed with
    (the Pydantic model for a model or a typed function; the schema for an OpenAI-style dict)."""

    name: str
    description: str
    parameters: dict[str, Any]
    spec: Any

    def openai(self) -> dict[str, Any]:
        """The tool as an OpenAI-style function dict, as chat templates take ``tools=``."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


def tool_of(tool: Any, where: int) -> Tool:
    """``tool`` (an OpenAI-style dict, a Pydantic model class, or a typed function) as a `Tool`; `ToolError`
    naming its place ``where`` in the list for anything else or a tool without a name."""
    if isinstance(tool, dict):
        function = tool.get("function", tool) if tool.get("type", "function") == "function" else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise ToolError(f"tools[{where}] has no name: pass {{'type': 'function', 'function': {{'name': ..., "
                            "'parameters': {...}}}} or a Pydantic model or typed function")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        return Tool(name, function.get("description", ""), parameters, parameters)
    if isinstance(tool, type) and issubclass(tool, pydantic.BaseModel):
        schema = tool.model_json_schema()
        return Tool(tool.__name__, inspect.getdoc(tool) or "", schema, tool)
    if inspect.isfunction(tool) or inspect.ismethod(tool):
        fields: dict[str, Any] = {}
        for name, parameter in inspect.signature(tool).parameters.items():
            if parameter.annotation is inspect.Parameter.empty:
                raise ToolError(f"tool {tool.__name__!r}: parameter {name!r} has no type annotation; annotate it "
                                "(e.g. city: str) so its arguments have a schema")
            default = ... if parameter.default is inspect.Parameter.empty else parameter.default
            fields[name] = (parameter.annotation, default)
        model = pydantic.create_model(tool.__name__, **fields)
        return Tool(tool.__name__, inspect.getdoc(tool) or "", model.model_json_schema(), model)
    raise ToolError(f"tools[{where}] is a {type(tool).__name__}: pass an OpenAI-style function dict, a Pydantic "
                    "model class, or a typed Python function")


@dataclass(frozen=True, init=False)
class ToolCalls:
    """An agent's turn: free text and/or calls to ``tools`` (OpenAI-style function dicts, Pydantic models, or
    typed Python functions), each call's arguments matching its tool's schema.

    ``choice``: ``"auto"`` (text, then calls or none), ``"required"`` (at least one call, from the first token),
    ``"none"`` (text only), or a tool's name (that call alone, forced). ``parallel=True`` allows several calls
    (one per line). ``markers``: ``"auto"`` (the tokenizer's ``<tool_call>`` tokens where it has them, text
    otherwise), ``"special"`` or ``"text"``. ``whitespace_pattern`` is the arguments' (``" ?"``: compact or
    ``json.dumps``' spacing, as chat templates write them). The value is a `ToolCallsValue`. Checked when made
    (`ToolError`), before any model call; a tool schema that does not compile raises `ToolSchemaError` at
    compile time.

    Typical use::

        def get_weather(city: str, unit: Literal["C", "F"] = "C") -> None: ...

        spec = structspec.ToolCalls([get_weather], choice="auto")
        turn = structspec.generate(lm, spec, [{"role": "user", "content": "Weather in Paris?"}])
        for call in turn.calls:
            print(call.name, call.arguments)
    """

    tools: tuple[Tool, ...]
    choice: Choice
    parallel: bool
    markers: Literal["auto", "special", "text"]
    whitespace_pattern: str

    def __init__(self, tools: list[Any], choice: Choice = "auto", parallel: bool = False,
                 markers: Literal["auto", "special", "text"] = "auto", whitespace_pattern: str = " ?") -> None:
        if not isinstance(tools, (list, tuple)) or not tools:
            raise ToolError(f"tools must be a non-empty list, got {tools!r}: pass the tools the model may call")
        made = tuple(tool_of(t, i) for i, t in enumerate(tools))
        names = [t.name for t in made]
        if twice := sorted({n for n in names if names.count(n) > 1}):
            raise ToolError(f"two tools are named {twice[0]!r}: give each tool its own name")
        if not isinstance(choice, str) or choice not in ("auto", "required", "none", *names):
            raise ToolError(f"choice={choice!r} names no tool: pass 'auto', 'required', 'none' or one of "
                            f"{', '.join(map(repr, names))}")
        if markers not in ("auto", "special", "text"):
            raise ToolError(f"markers={markers!r}: pass 'auto', 'special' or 'text'")
        for name, value in (("tools", made), ("choice", choice), ("parallel", bool(parallel)),
                            ("markers", markers), ("whitespace_pattern", whitespace_pattern)):
            object.__setattr__(self, name, value)

    def chat_tools(self) -> list[dict[str, Any]]:
        """The tools as a chat template's ``tools=`` takes them (OpenAI-style dicts)."""
        return [t.openai() for t in self.tools]


BEGIN, END = "<tool_call>", "</tool_call>"


def tools_instruction(tools: list[dict[str, Any]]) -> str:
    """System text that shows a model ``tools`` (OpenAI-style dicts) and the call format the grammar writes,
    for a chat template that ignores ``tools=`` (`showing_tools`)."""
    listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (f"You may call these tools, given as JSON function signatures:\n<tools>\n{listed}\n</tools>\n\n"
            "To call one, write its name and arguments as a JSON object between the markers:\n"
            f'{BEGIN}\n{{"name": <the tool\'s name>, "arguments": <an object of its arguments>}}\n{END}')


def showing_tools(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with `tools_instruction` at the end of their system message, or in a system message of its
    own before them. Returns new messages; changes nothing."""
    shown = tools_instruction(tools)
    if messages and messages[0].get("role") == "system" and isinstance(messages[0].get("content"), str):
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{shown}"}, *messages[1:]]
    return [{"role": "system", "content": shown}, *messages]


def toolcalls_constraint(spec: ToolCalls, writer: Writer, arguments: Callable[[Any, str], Constraint],
                         has_token: Callable[[str], bool]) -> Constraint:
    """``spec``'s `Constraint`: the turn's regex and the parser of its `ToolCallsValue`. ``arguments`` resolves
    a tool's spec with a whitespace pattern; ``has_token`` says whether the tokenizer has a token of that text.
    `ToolSchemaError` names the tool whose schema does not compile."""
    special = spec.markers == "special" or (spec.markers == "auto" and has_token(BEGIN) and has_token(END))
    begin, end = (Special(BEGIN), Special(END)) if special else (BEGIN, END)
    parsers: dict[str, Callable[[str], Any]] = {}
    calls = []
    for tool in spec.tools:
        if spec.choice not in ("auto", "required", "none") and tool.name != spec.choice:
            continue
        try:
            args = arguments(tool.spec, spec.whitespace_pattern)
        except SchemaError as e:
            raise ToolSchemaError(tool.name, e) from None
        parsers[tool.name] = args.parse
        skeleton = f'\n{{"name": "{tool.name}", "arguments": '
        calls.append(Tag(begin, _Raw(re.escape(skeleton) + f"(?:{args.regex})" + re.escape("}\n")), end))
    if spec.choice == "none":  # (text that never writes a begin marker's text either)
        regex = writer.write(Text(avoid=(BEGIN,)))
    else:
        # "required" and a named tool: calls from the first token (as OpenAI's and vLLM's tool_choice), so the
        # opening marker is forced; "auto": free text, then calls or none.
        forced = spec.choice not in ("auto", "required")
        regex = writer.write(Triggered(tuple(calls), at_least=0 if spec.choice == "auto" else 1,
                                       at_most=None if spec.parallel and not forced else 1,
                                       text=spec.choice == "auto", separator="\n"))
    shown = (writer.marker_text(begin), writer.marker_text(end))
    return Constraint(regex, lambda text: parse_turn(text, shown, parsers), None, (), tuple(writer.specials),
                      events=lambda: CallReader(shown, parsers))


@dataclass(frozen=True)
class _Raw:
    """Regex text a `Tag` holds as it is (resolved by `raw_inner`)."""

    regex: str


def raw_inner(spec: Any) -> Constraint | None:
    """A `_Raw`'s constraint, for `Writer.inner`; None for other specs."""
    return Constraint(spec.regex, lambda text: text, None) if isinstance(spec, _Raw) else None


def parse_turn(text: str, markers: tuple[str, str], parsers: dict[str, Callable[[str], Any]]) -> ToolCallsValue:
    """The `ToolCallsValue` of a turn's text: the text before the first begin marker, then each call's JSON
    between its markers, its arguments validated by the tool's parser (which raises on invalid ones)."""
    begin, end = markers
    head, *segments = text.split(begin)
    calls = []
    for segment in segments:
        call = json.loads(segment.split(end)[0])
        calls.append(ToolCall(call["name"], parsers[call["name"]](json.dumps(call["arguments"]))))
    return ToolCallsValue(head, calls)


class CallReader:
    """Reads a `ToolCalls` turn as it streams; `read` yields a `CallDone` for each call its chunk closes."""

    def __init__(self, markers: tuple[str, str], parsers: dict[str, Callable[[str], Any]]) -> None:
        self.markers, self.parsers = markers, parsers
        self.text, self.done = "", 0

    def read(self, chunk: str) -> Iterator[CallDone]:
        """Scan ``chunk`` (the text after what was read before). Changes the reader's position."""
        self.text += chunk
        closed = self.text.rfind(self.markers[1])
        if closed < 0:
            return
        upto = self.text[: closed + len(self.markers[1])]
        calls = parse_turn(upto, self.markers, self.parsers).calls
        for call in calls[self.done:]:
            yield CallDone(call, upto)
        self.done = len(calls)
