"""The engine benchmark's records and how an output of one is judged: the extraction tasks and the tool-call
conversations as `Item`s, the JSON Schema ``vllm serve`` constrains a tool call with, and the verdict on each output
of vLLM or of structspec's own loop, counted into a `Tally`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import jsonschema

from lab.vllmbench_report import Tally
from structspec.tools.benchmarks.toolbench import Conversation, load_conversations, parse_text_calls
from structspec.tools.tasks import extraction_prompt, load_tasks


@dataclass(frozen=True)
class Item:
    """One record of a task set: its chat messages, the own loop's spec, and (tool calls) its conversation."""

    id: str
    messages: list[dict[str, str]]
    spec: Any  # a Pydantic model (extraction) or a `structspec.ToolCalls`
    schema: dict[str, Any] | None = None  # extraction: the JSON Schema every output must validate against
    conversation: Conversation | None = None


def evenly(items: list[Any], n: int | None) -> list[Any]:
    """``n`` of ``items`` spread evenly over the list, in order (all without ``n``)."""
    if n is None or n >= len(items):
        return items
    return [items[i * len(items) // n] for i in range(n)]


def extraction_items(n: int | None = None) -> list[Item]:
    """The shipped extraction tasks (the first ``n``, their schemas in turn), with `extraction_prompt`."""
    from structspec.tools.benchmarks.harness import spread

    return [Item(t.id, extraction_prompt(t.text, t.schema), t.schema, t.schema.model_json_schema())
            for t in spread(load_tasks(), n)]


def toolcall_items(n: int | None = None) -> list[Item]:
    """The shipped tool-call conversations (``n`` spread over the file, so each ``choice`` is in)."""
    return [Item(c.id, c.messages, c.spec(), conversation=c) for c in evenly(load_conversations(), n)]


def task_items(name: str, n: int | None) -> list[Item]:
    return extraction_items(n) if name == "extraction" else toolcall_items(n)


def vllm_tool_schema(conversation: Conversation) -> dict[str, Any] | None:
    """The JSON Schema ``vllm serve`` constrains a tool call's output with: ``required`` (all calls, parallel or
    not) and a named function; None for ``auto`` (vLLM leaves it unconstrained). Imports vLLM."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionToolsParam
    from vllm.tool_parsers.utils import get_json_schema_from_tools

    tools = [ChatCompletionToolsParam.model_validate(t) for t in conversation.tools]
    choice: Any = conversation.choice
    if choice not in ("auto", "required", "none"):
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionNamedToolChoiceParam

        choice = ChatCompletionNamedToolChoiceParam.model_validate({"type": "function", "function": {"name": choice}})
    schema = get_json_schema_from_tools(choice, tools, parallel_tool_calls=conversation.parallel)
    return json.loads(schema) if isinstance(schema, str) else schema


def vllm_calls(conversation: Conversation, text: str, schema: dict[str, Any] | None) -> list[dict[str, Any]] | None:
    """The calls in a vLLM output (``schema``: `vllm_tool_schema`'s), None where it does not parse or validate:
    ``required`` writes ``[{"name", "parameters"}, ...]``, a named function its arguments, ``auto`` free text
    (`parse_text_calls`)."""
    if schema is None:
        return parse_text_calls(text, conversation.tools)
    try:
        value = json.loads(text)
        jsonschema.validate(value, schema)
    except (ValueError, jsonschema.ValidationError):
        return None
    if conversation.choice == "required":
        return [{"name": call["name"], "arguments": call["parameters"]} for call in value]
    return [{"name": conversation.choice, "arguments": value}]


def valid_json(text: str, schema: dict[str, Any]) -> bool:
    """Whether ``text`` is JSON that validates against ``schema``."""
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def invalid(record: str, stop: str | None, tokens: int, text: str) -> str:
    """How the report names an invalid output: its record, why it stopped, its length and its start."""
    return f"{record} (stopped: {stop}, {tokens} tokens): {text[:100]!r}"


Verdict = tuple[bool, bool | None]
"""How an output is judged: whether it is valid, and (tool calls; None for extraction) whether its calls are the
expected ones."""


def judge_calls(conversation: Conversation, calls: list[dict[str, Any]] | None) -> Verdict:
    """A turn is valid when its calls (None: some did not parse or validate) all parse and validate (an ``auto``
    turn may answer in text, without calls); its calls are as expected when they name the expected tools, as
    many times."""
    if calls is None:
        return False, False
    return True, sorted(c["name"] for c in calls) == sorted(c["name"] for c in conversation.expected)


def score(tally: Tally, record: str, verdict: Verdict, stop: str | None, tokens: int, text: str) -> None:
    """Count one output's ``verdict`` into ``tally``, naming it among the invalid ones where it is. Changes
    ``tally``."""
    valid, expected = verdict
    tally.valid += valid
    if expected is not None:
        tally.expected_calls = (tally.expected_calls or 0) + expected
    if not valid:
        tally.invalid.append(invalid(record, stop, tokens, text))


def own_tally(items: list[Item], results: list[Any], seconds: float) -> Tally:
    """The tally of the own loop's ``results`` (one per item) from their `Stats`: steps are target and prefill
    passes; drafts every source but the FSM's forced splices (as toolbench counts them)."""
    tally = Tally(records=len(items), seconds=seconds, forced=0)
    for item, r in zip(items, results):
        s = r.stats
        tally.output_tokens += s.output_tokens
        tally.steps += s.target_forward_passes + s.prefill_passes
        tally.forced = (tally.forced or 0) + s.forced_tokens
        tally.drafted += sum(d.drafted for name, d in s.drafts.items() if name != "forced")
        tally.accepted += sum(d.accepted for name, d in s.drafts.items() if name != "forced")
        if item.conversation is None:
            verdict: Verdict = (r.complete and valid_json(r.text, item.schema), None)
        else:  # the text checked on its own, as vLLM's: its calls parsed and validated against their tools
            tools = item.conversation.tools
            verdict = judge_calls(item.conversation, parse_text_calls(r.text, tools) if r.complete else None)
        score(tally, item.id, verdict, r.stop_reason, s.output_tokens, r.text)
    return tally
