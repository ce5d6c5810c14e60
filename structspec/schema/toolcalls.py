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

Under ``choice="auto"`` a call may also be written *bare*, as small models write it: the turn opens (past any
whitespace) with ``{``, alone or in a ```` ```json ```` fence, and from there it is ``{"name": "get_weather",
"arguments": {...}}``, constrained, fast-forwarded and drafted like a marked call (``bare_calls``).
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import pydantic

from structspec.errors import SchemaError, ToolError, ToolSchemaError
from structspec.schema.calltext import ARGUMENTS, FENCES, NAME, CallReader, parse_turn
from structspec.schema.constraint import Constraint
from structspec.schema.stops import not_opening
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
    naming its place ``where`` in the list for anything else or a tool without a name, and naming the parameter
    of a function whose signature a call's named arguments cannot map exactly (`arguments_model`)."""
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
        # the class's own docstring: `inspect.getdoc` would show BaseModel's (a page on Pydantic) for a model
        # that has none
        return Tool(tool.__name__, inspect.cleandoc(vars(tool).get("__doc__") or ""), schema, tool)
    if inspect.isfunction(tool) or inspect.ismethod(tool):
        model, schema = arguments_model(tool)
        return Tool(tool.__name__, inspect.getdoc(tool) or "", schema, model)
    raise ToolError(f"tools[{where}] is a {type(tool).__name__}: pass an OpenAI-style function dict, a Pydantic "
                    "model class, or a typed Python function")


_JSON_TYPES = ("annotate it with a type JSON holds (str, int, float, bool, None, Literal[...], a list or dict of "
               "them, or a Pydantic model)")


def arguments_model(function: Callable[..., Any]) -> tuple[type[pydantic.BaseModel], dict[str, Any]]:
    """The Pydantic model of ``function``'s parameters (named as the function) and its JSON Schema: one property
    per parameter, named exactly as the parameter. A name Pydantic keeps for itself (``_x``, ``model_config``,
    ``json``) is the alias of a field named otherwise (`ToolCall.keywords` maps it back). `ToolError` naming the
    parameter for what a call's named arguments cannot carry (``*args``, ``**kwargs``, positional-only), a
    missing annotation, or an annotation without a JSON Schema."""
    name = function.__name__
    parameters = inspect.signature(function).parameters
    fields: dict[str, Any] = {}
    for parameter in parameters.values():
        shown = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}.get(parameter.kind, "")
        if shown:
            raise ToolError(f"tool {name!r}: parameter {shown}{parameter.name} takes any number of arguments, and a "
                            "call passes each argument by name: list them as named parameters, or take one list "
                            f"or dict parameter (e.g. {parameter.name}: list[int])")
        if parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise ToolError(f"tool {name!r}: parameter {parameter.name!r} is positional-only, and a call passes "
                            "arguments by name: remove the '/' from its signature")
        if parameter.annotation is inspect.Parameter.empty:
            raise ToolError(f"tool {name!r}: parameter {parameter.name!r} has no type annotation; annotate it "
                            "(e.g. city: str) so its arguments have a schema")
        annotation = _resolved(function, parameter)
        default = ... if parameter.default is inspect.Parameter.empty else parameter.default
        field_name = _field_name(parameter.name, parameters)
        fields[field_name] = (annotation, default if field_name == parameter.name else
                              pydantic.Field(default, alias=parameter.name))
    try:
        return _model(name, fields)
    except (pydantic.PydanticUserError, TypeError, ValueError, NameError) as error:
        for (field_name, spec), parameter in zip(fields.items(), parameters.values()):  # the one that fails alone
            try:
                _model(name, {field_name: spec})
            except (pydantic.PydanticUserError, TypeError, ValueError, NameError) as alone:
                raise ToolError(f"tool {name!r}: parameter {parameter.name!r} has no JSON Schema "
                                f"({_first_line(alone)}): {_JSON_TYPES}") from error
        raise ToolError(f"tool {name!r}: its parameters have no JSON Schema ({_first_line(error)}): "
                        f"{_JSON_TYPES}") from error


def _model(name: str, fields: dict[str, Any]) -> tuple[type[pydantic.BaseModel], dict[str, Any]]:
    # (no protected namespaces: a parameter such as model_name is the user's, not Pydantic's)
    model = pydantic.create_model(name, __config__=pydantic.ConfigDict(protected_namespaces=()), **fields)
    return model, model.model_json_schema()


def _resolved(function: Callable[..., Any], parameter: inspect.Parameter) -> Any:
    """``parameter``'s annotation, a string one (``from __future__ import annotations``) evaluated in the
    function's module as `typing.get_type_hints` does; `ToolError` where it names nothing there."""
    if not isinstance(parameter.annotation, str):
        return parameter.annotation
    try:
        return eval(parameter.annotation, getattr(function, "__globals__", {}))  # noqa: S307 (as typing does)
    except (NameError, AttributeError, SyntaxError, TypeError) as error:
        raise ToolError(f"tool {function.__name__!r}: parameter {parameter.name!r}'s annotation "
                        f"{parameter.annotation!r} does not resolve in its module ({_first_line(error)}): define "
                        "the types it names at module level") from None


def _field_name(name: str, taken: Any) -> str:
    """A Pydantic field name for the parameter ``name``: itself, or one that is no parameter's where Pydantic
    keeps ``name`` for itself (a leading underscore, a `BaseModel` attribute such as ``model_config``)."""
    if not name.startswith("_") and not hasattr(pydantic.BaseModel, name):
        return name
    stem, n = f"{name.strip('_') or 'arg'}_", 0
    while f"{stem}{n}" in taken or hasattr(pydantic.BaseModel, f"{stem}{n}"):
        n += 1
    return f"{stem}{n}"


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


@dataclass(frozen=True, init=False)
class ToolCalls:
    """An agent's turn: free text and/or calls to ``tools`` (OpenAI-style function dicts, Pydantic models, or
    typed Python functions), each call's arguments matching its tool's schema.

    ``choice``: ``"auto"`` (text, then calls or none), ``"required"`` (at least one call, from the first token),
    ``"none"`` (text only), or a tool's name (that call alone, forced). ``parallel=True`` allows several calls
    (one per line). ``markers``: ``"auto"`` (the tokenizer's ``<tool_call>`` tokens where it has them, text
    otherwise), ``"special"`` or ``"text"``. ``whitespace_pattern`` is the arguments' (``" ?"``: compact or
    ``json.dumps``' spacing, as chat templates write them). ``bare_calls`` (``"auto"`` only; on by default):
    a turn that opens with ``{`` (past any whitespace; alone or after ```` ```json ````) is a call written
    without the markers, as small models write them (several, one per line, with ``parallel=True``), and is
    read into ``calls``; the cost: under ``"auto"`` no text answer may open so. The value is a
    `ToolCallsValue`. Checked when made (`ToolError`), before any model call; a tool schema that does not
    compile raises `ToolSchemaError` at compile time.

    Under ``"auto"`` small models often answer in text; a call they write as JSON after some text is kept in
    ``unmarked_calls`` (with a warning, not run): where a call is needed, use ``"required"`` or the tool's
    name.

    Typical use::

        def get_weather(city: str, unit: Literal["C", "F"] = "C") -> str: ...

        spec = structspec.ToolCalls([get_weather], choice="required")
        messages = [{"role": "user", "content": "Weather in Paris?"}]
        turn = structspec.generate(lm, spec, messages)
        messages += [turn.assistant_message(), *turn.run([get_weather])]  # the next prompt
    """

    tools: tuple[Tool, ...]
    choice: Choice
    parallel: bool
    markers: Literal["auto", "special", "text"]
    whitespace_pattern: str
    bare_calls: bool

    def __init__(self, tools: list[Any], choice: Choice = "auto", parallel: bool = False,
                 markers: Literal["auto", "special", "text"] = "auto", whitespace_pattern: str = " ?",
                 bare_calls: bool = True) -> None:
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
        if not isinstance(parallel, bool):
            raise ToolError(f"parallel={parallel!r}: pass True (several calls, one per line) or False (one call)")
        if not isinstance(bare_calls, bool):
            raise ToolError(f"bare_calls={bare_calls!r}: pass True (under choice='auto', a turn opening with '{{' "
                            "is a call without the markers) or False (such a turn is text)")
        for name, value in (("tools", made), ("choice", choice), ("parallel", bool(parallel)),
                            ("markers", markers), ("whitespace_pattern", whitespace_pattern),
                            ("bare_calls", bare_calls)):
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
    calls, bare = [], []
    for tool in spec.tools:
        if spec.choice not in ("auto", "required", "none") and tool.name != spec.choice:
            continue
        try:
            args = arguments(tool.spec, spec.whitespace_pattern)
        except SchemaError as e:
            raise ToolSchemaError(tool.name, e) from None
        parsers[tool.name] = args.parse
        # the name as JSON writes it (a quote, backslash or control character escaped), as chat templates show it
        call = re.escape(f"{NAME}{json.dumps(tool.name, ensure_ascii=False)}{ARGUMENTS}") + f"(?:{args.regex})\\}}"
        calls.append(Tag(begin, _Raw(f"\\n{call}\\n"), end))
        bare.append(call)
    bare_calls = spec.choice == "auto" and spec.bare_calls
    if spec.choice == "none":  # (text that never writes a begin marker's text either)
        regex = writer.write(Text(avoid=(BEGIN,)))
    else:
        # "required" and a named tool: calls from the first token (as OpenAI's and vLLM's tool_choice), so the
        # opening marker is forced; "auto": free text, then calls or none.
        forced = spec.choice not in ("auto", "required")
        triggered = Triggered(tuple(calls), at_least=0 if spec.choice == "auto" else 1,
                              at_most=None if spec.parallel and not forced else 1,
                              text=spec.choice == "auto", separator="\n")
        regex = writer.triggered(triggered, _opening(writer, triggered) if bare_calls else None)
        if bare_calls:  # the choice between text and bare calls falls on the byte that opens the first call
            one = "|".join(f"(?:{c})" for c in bare)
            some = f"(?:{one})" + (f"(?:\\n(?:{one}))*" if spec.parallel else "")  # (one a line, as marked)
            fences = "|".join(map(re.escape, filter(None, FENCES)))
            regex = f"(?:{regex})|(?:{_WHITESPACE}*(?:{some}|(?:{fences}){some}\\n```))"
    shown = (writer.marker_text(begin), writer.marker_text(end))
    unmarked = spec.choice == "auto"  # (an auto turn's text may hold a call the model wrote without markers)
    return Constraint(regex, lambda text: parse_turn(text, shown, parsers, unmarked, bare_calls), None, (),
                      tuple(writer.specials),
                      events=lambda: CallReader(shown, parsers, bare_calls))


_WHITESPACE = r"[ \t\n\r]"


def _opening(writer: Writer, triggered: Triggered) -> str:
    """The regex of an ``auto`` turn's first free text with bare calls: text that never opens, past any
    whitespace, as a bare call does (``{``, alone or in a fence)."""
    return not_opening(writer.begin_texts(triggered), tuple(f"{fence}{{" for fence in FENCES), " \t\n\r")


@dataclass(frozen=True)
class _Raw:
    """Regex text a `Tag` holds as it is (resolved by `raw_inner`)."""

    regex: str


def raw_inner(spec: Any) -> Constraint | None:
    """A `_Raw`'s constraint, for `Writer.inner`; None for other specs."""
    return Constraint(spec.regex, lambda text: text, None) if isinstance(spec, _Raw) else None
